"""Replay speed on the tensor dump of the benchmark transformer step.

The step of bench_dump.py (4-layer TransformerEncoder, batch 8, seq 128, forward + backward)
is dumped once in tensor mode, then replayed on CPU: in the op's own dtype and upcast to fp64
(the default), with the same-dtype reference outputs stored too (`--tensors`: replay.h5
beside the dump, whose outputs equal to the device's name its bytes, and in another folder,
where it holds every byte), and with --upcast none for comparison. Each round times a bare
step (median of 3) and then every run once, in turn (interleaved: load from outside slows
them alike). Prints ops/s, MB/s of tensor data read, replay.h5's size, the median of the
rounds' ratios to the bare step with met / not met beside the goal (at most 3x), the CPU
ratio (the run's fastest CPU seconds, every thread of the process, over the bare step's
fastest: what a shared machine disturbs least) and the load average.
`--threads both` runs it twice from one command, each in a fresh process: torch's default
threads, then OMP_NUM_THREADS=1; `--threads N` sets OMP_NUM_THREADS.

Run: .venv/bin/python benchmarks/bench_replay.py [--repeat 5] [--jobs 1] [--threads both|N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import threads_from_argv

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

import torch
from _common import add_threads_arg, run_both_threads, verdict

from accuracy import dumper
from accuracy.examples import bench_setup, bench_step
from accuracy.replay import replay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--profile", default=None,
                    help="dump on sim with this profile (e.g. fp16-cube) instead of plain CPU, "
                         "so device outputs differ from the reference and every op runs twice")
    add_threads_arg(ap)  # 1 gives steadier figures on a shared machine
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_replay_"))
    dump = tmp / "tensor.h5"
    if args.profile:
        from accuracy.device_backend import sim

        with sim(profile=args.profile), dumper(dump_path=dump, mode="tensor"):
            bench_step(model, batch)
    else:
        with dumper(dump_path=dump, mode="tensor"):
            bench_step(model, batch)
    print(f"device dump: {'sim ' + args.profile if args.profile else 'plain CPU'}")

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}), jobs {args.jobs}; "
          f"dump {dump.stat().st_size / 1e6:.1f} MB. {args.repeat} rounds, each a bare step "
          "then every run in turn (this machine is shared)")
    print(f"{'run':26s} {'replay s':>9s} {'bare s':>7s} {'x bare':>7s} {'CPU x':>6s} "
          f"{'ops/s':>7s} {'MB/s read':>10s}  status")
    apart = tmp / "apart"  # replay.h5 away from the dump: it holds every byte itself
    apart.mkdir()
    runs = [("replay, upcast fp64", "fp64", True, tmp),
            ("replay, fp64, --tensors", "fp64", False, tmp),
            ("  same, -o another folder", "fp64", False, apart),
            ("replay, upcast none", "none", True, tmp)]
    walls: dict[str, list[float]] = {r[0]: [] for r in runs}
    cpus: dict[str, list[float]] = {r[0]: [] for r in runs}
    bares, bare_cpus, loads = [], [], []
    last: dict[str, tuple] = {}
    bench_step(model, batch)  # warm-up
    for i in range(args.repeat):
        bw, bc = [], []
        for _ in range(3):
            c0, t0 = time.process_time(), time.perf_counter()
            bench_step(model, batch)
            bw.append(time.perf_counter() - t0)
            bc.append(time.process_time() - c0)
        bares.append(statistics.median(bw))
        bare_cpus.append(min(bc))
        for label, upcast, metrics_only, folder in runs:
            out = folder / f"replay-{upcast}-{i}.h5"
            c0, t0 = time.process_time(), time.perf_counter()
            res = replay(dump, out, upcast=upcast, jobs=args.jobs, metrics_only=metrics_only)
            walls[label].append(time.perf_counter() - t0)
            cpus[label].append(time.process_time() - c0)
            last[label] = (res, out.stat().st_size)
            out.unlink()
        loads.append(os.getloadavg()[0])
    b = statistics.median(bares)
    for label, *_ in runs:
        res, size = last[label]
        times = walls[label]
        t = statistics.median(times)
        rs = sorted(x / y for x, y in zip(times, bares, strict=True))
        ratio = statistics.median(rs)
        cpu_x = min(cpus[label]) / min(bare_cpus)
        print(f"{label:26s} {t:9.3f} {b:7.3f} {ratio:7.2f} {cpu_x:6.2f} "
              f"{res.total / t:7.0f} {res.bytes_read / 1e6 / t:10.1f}  "
              f"{verdict(ratio, 3)}; {res.ok} ok, {res.skipped} skipped, "
              f"{res.failed} failed; replay.h5 {size / 1e6:.1f} MB; x bare min–max "
              f"{rs[0]:.2f}–{rs[-1]:.2f}, replay s "
              f"{min(times):.2f}–{max(times):.2f}; CPU s {min(cpus[label]):.2f} (bare "
              f"{min(bare_cpus):.2f}); load {min(loads):.1f}–{max(loads):.1f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
