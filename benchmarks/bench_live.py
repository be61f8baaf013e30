"""Live-check overhead on the benchmark transformer step, against dump + replay of the same step.

The step of bench_dump.py (4-layer TransformerEncoder, batch 8, seq 128, forward + backward)
runs: bare; under `live_check(on="cpu")` (every op re-run on CPU in its dtype and fp64, only
figures kept); and as a tensor dump followed by `replay` (the offline way to the same figures).
With --profile (default fp16-cube) the step runs on `sim`, so device outputs differ from the
reference and every op gets its fp64 run, as on real hardware; --profile none runs plain CPU
(every output bit-identical to the reference: the cheap case). Prints seconds, the ratio to
the bare step (timed in the same setting just before), and bytes written, with met / not met
beside each goal: the live check at most 2x the bare step, costing less than dump + replay
together and writing nothing. `--sample F` (default 0.25) also times `live_check(sample=F)`,
which checks that fraction of the calls, other calls each step: the full check's cost per
step spread over 1 / F steps. The floor beneath the full check is timed beside it: the step
with each op only re-run on CPU in its dtype and again in fp64 where the check needs that run
(not a movement op, outputs not bit-identical), inputs copied as the check copies them, nothing
measured or judged (`RerunFloor`). Every side runs in turn in each round (interleaved); wall
ratios are medians of per-round ratios to the bare step, CPU ratios the fastest CPU seconds
over the bare step's fastest (what a shared machine disturbs least). `--threads both` runs
it twice from one command, each in a fresh process: torch's default threads, then
OMP_NUM_THREADS=1; `--threads N` sets OMP_NUM_THREADS.

Run: .venv/bin/python benchmarks/bench_live.py [--repeat 3] [--profile fp16-cube|none]
     [--sample 0.25] [--threads both|N]
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
from _common import add_threads_arg, bare_step, on_device, run_both_threads, verdict
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from accuracy import dumper
from accuracy.examples import bench_setup, bench_step
from accuracy.live import live_check
from accuracy.live.select import unrunnable
from accuracy.replay import replay
from accuracy.replay.metrics import bit_equal
from accuracy.replay.ops import _is_movement


class RerunFloor(TorchDispatchMode):
    """What any live check must do at least: each op re-run on the reference (CPU) with a
    copy of its inputs, in its own dtype and, unless it only moves values or its outputs are
    the device's bits, with floating inputs upcast to fp64. Nothing measured or judged."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = f"aten.{func._overloadpacket.__name__}.{func._overloadname}"
        if unrunnable(func, name, args, kwargs) is not None:
            return out
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            flat, spec = tree_flatten((args, kwargs))
            copy = func._schema.is_mutable
            same = [x.detach().to("cpu", copy=copy) if isinstance(x, torch.Tensor) else x
                    for x in flat]
            a, k = tree_unflatten(same, spec)
            try:
                ref = func(*a, **k)
            except RuntimeError:
                return out
            dev = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            got = [t for t in tree_flatten(ref)[0] if isinstance(t, torch.Tensor)]
            agree = len(dev) == len(got) and all(  # the check's own bit compare
                bit_equal(d.cpu(), g) for d, g in zip(dev, got, strict=True))
            if not agree and not _is_movement(name) and any(
                    isinstance(x, torch.Tensor) and x.is_floating_point() for x in flat):
                up = [x.to(torch.float64) if isinstance(x, torch.Tensor)
                      and x.is_floating_point() else x for x in same]
                a, k = tree_unflatten(up, spec)
                try:
                    func(*a, **k)
                except RuntimeError:
                    pass
        return out


def _timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of fn() in this process (every thread)."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", default="fp16-cube", help="sim profile, or 'none' for CPU")
    ap.add_argument("--sample", type=float, default=0.25,
                    help="also time live_check(sample=F); 1 skips that row")
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    profile = None if args.profile == "none" else args.profile
    model, batch = bench_setup()

    def device():
        return on_device(profile)

    def bare() -> None:
        bare_step(model, batch, profile)

    tmp = Path(tempfile.mkdtemp(prefix="bench_live_"))
    sampled = f"sample {args.sample:g}"
    floor = "floor: re-runs"
    rows: dict[str, list[float]] = {"live check": [], floor: [], "dump": [], "replay": [],
                                    "dump + replay": [], sampled: []}
    cpus: dict[str, list[float]] = {"bare": [], "live check": [], floor: [], sampled: []}
    share = 1.0
    ratios: dict[str, list[float]] = {k: [] for k in rows}
    written: dict[str, int] = {}
    counts = None
    bare()  # warm-up
    for i in range(args.repeat):
        bw, bc = zip(*(_timed(bare) for _ in range(3)), strict=True)
        b = statistics.median(bw)
        cpus["bare"].append(min(bc))
        before = _bytes_under(tmp)
        chk = live_check(on="cpu")

        def checked(c=chk) -> None:
            with device(), c:
                bench_step(model, batch)
            model.zero_grad(set_to_none=True)

        t_live, c_live = _timed(checked)
        cpus["live check"].append(c_live)
        written["live check"] = _bytes_under(tmp) - before
        counts = chk.counts()

        def rerun_only() -> None:
            with device(), RerunFloor():
                bench_step(model, batch)
            model.zero_grad(set_to_none=True)

        t_floor, c_floor = _timed(rerun_only)
        cpus[floor].append(c_floor)
        if args.sample < 1:
            part = live_check(on="cpu", sample=args.sample, step=i)

            def partly(c=part) -> None:
                with device(), c:
                    bench_step(model, batch)
                model.zero_grad(set_to_none=True)

            t_part, c_part = _timed(partly)
            rows[sampled].append(t_part)
            ratios[sampled].append(t_part / b)
            cpus[sampled].append(c_part)
            share = part.checked / max(1, chk.checked)
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
        for k, t in (("live check", t_live), (floor, t_floor), ("dump", t_dump),
                     ("replay", t_replay), ("dump + replay", t_dump + t_replay)):
            rows[k].append(t)
            ratios[k].append(t / b)
        rows.setdefault("bare", []).append(b)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}), device "
          f"{'sim ' + profile if profile else 'plain CPU'}; medians of {args.repeat} rounds, "
          "each with a bare step timed just before (this machine is shared)")
    print(f"bare step {statistics.median(rows['bare']):.3f} s; live check verdicts: {counts}")
    print(f"{'run':15s} {'seconds':>8s} {'x bare':>7s} {'CPU x bare':>11s} {'MB written':>11s}")
    for k in ("live check", floor, "dump", "replay", "dump + replay", sampled):
        if not rows[k]:
            continue
        w = written.get(k)
        cpu = f"{min(cpus[k]) / min(cpus['bare']):11.2f}" if cpus.get(k) else " " * 11
        print(f"{k:15s} {statistics.median(rows[k]):8.2f} {statistics.median(ratios[k]):7.2f} "
              f"{cpu} {'' if w is None else f'{w / 1e6:11.1f}'}")
    floor_x = statistics.median(ratios[floor])
    above = statistics.median(ratios["live check"]) - floor_x
    print(f"the floor (each op re-run in its dtype and fp64, nothing measured): {floor_x:.2f}x "
          f"bare, CPU {min(cpus[floor]) / min(cpus['bare']):.2f}x; the check adds {above:.2f}x "
          f"bare above it; the goal of 2x {'lies above' if floor_x <= 2 else 'lies below'} "
          f"the floor; load {os.getloadavg()[0]:.1f}")
    live = statistics.median(ratios["live check"])
    vs = statistics.median(a / b for a, b in zip(rows["live check"], rows["dump + replay"],
                                                 strict=True))
    print(f"live check / bare step (median): {live:.2f}x ({verdict(live, 2)}); live check / "
          f"(dump + replay), median per round: {vs:.2f} ({verdict(vs, 1, unit='', strict=True)}"
          f"); live check wrote {written['live check'] / 1e6:.1f} MB "
          f"({verdict(written['live check'], 0, what='nothing written')})")
    if rows[sampled]:
        part_x = statistics.median(ratios[sampled])
        print(f"live_check(sample={args.sample:g}) / bare step (median): {part_x:.2f}x "
              f"({verdict(part_x, 2)}); it checked {share:.0%} of the calls the full check "
              f"checked, other calls each step")


if __name__ == "__main__":
    main()
