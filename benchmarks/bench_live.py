"""Live-check overhead on the benchmark transformer step, against dump + replay of the same step.

The step of bench_dump.py (4-layer TransformerEncoder, batch 8, seq 128, forward + backward)
runs: bare; under `live_check(on="cpu")` (every op re-run on CPU in its dtype and fp64, only
figures kept); and as a tensor dump followed by `replay` (the offline way to the same figures).
With --profile (default fp16-cube) the step runs on `sim`, so device outputs differ from the
reference and every op gets its fp64 run, as on real hardware; --profile none runs plain CPU
(every output bit-identical to the reference: the cheap case). Prints seconds, the ratio to
the bare step (timed in the same setting just before), and bytes written (goal: the live
check costs less than dump + replay together and writes nothing).

Run: .venv/bin/python benchmarks/bench_live.py [--repeat 3] [--profile fp16-cube|none]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import bare_step, on_device, timed

from accuracy import dumper
from accuracy.examples import bench_setup, bench_step
from accuracy.live import live_check
from accuracy.replay import replay


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", default="fp16-cube", help="sim profile, or 'none' for CPU")
    args = ap.parse_args()
    profile = None if args.profile == "none" else args.profile
    model, batch = bench_setup()

    def device():
        return on_device(profile)

    def bare() -> None:
        bare_step(model, batch, profile)

    tmp = Path(tempfile.mkdtemp(prefix="bench_live_"))
    rows: dict[str, list[float]] = {"live check": [], "dump": [], "replay": [],
                                    "dump + replay": []}
    ratios: dict[str, list[float]] = {k: [] for k in rows}
    written: dict[str, int] = {}
    counts = None
    for i in range(args.repeat):
        b = timed(bare, repeat=3)
        before = _bytes_under(tmp)
        t0 = time.perf_counter()
        with device(), live_check(on="cpu") as chk:
            bench_step(model, batch)
        t_live = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        written["live check"] = _bytes_under(tmp) - before
        counts = chk.counts()
        dump = tmp / f"step-{i}.h5"
        t0 = time.perf_counter()
        with device(), dumper(dump_path=dump, mode="tensor"):
            bench_step(model, batch)
        t_dump = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        replay(dump, tmp / f"replay-{i}.h5")
        t_replay = time.perf_counter() - t0
        written["dump + replay"] = dump.stat().st_size + (tmp / f"replay-{i}.h5").stat().st_size
        dump.unlink()
        (tmp / f"replay-{i}.h5").unlink()
        for k, t in (("live check", t_live), ("dump", t_dump), ("replay", t_replay),
                     ("dump + replay", t_dump + t_replay)):
            rows[k].append(t)
            ratios[k].append(t / b)
        rows.setdefault("bare", []).append(b)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device "
          f"{'sim ' + profile if profile else 'plain CPU'}; medians of {args.repeat} rounds, "
          "each with a bare step timed just before (this machine is shared)")
    print(f"bare step {statistics.median(rows['bare']):.3f} s; live check verdicts: {counts}")
    print(f"{'run':15s} {'seconds':>8s} {'x bare':>7s} {'MB written':>11s}")
    for k in ("live check", "dump", "replay", "dump + replay"):
        w = written.get(k)
        print(f"{k:15s} {statistics.median(rows[k]):8.2f} {statistics.median(ratios[k]):7.2f} "
              f"{'' if w is None else f'{w / 1e6:11.1f}'}")


if __name__ == "__main__":
    main()
