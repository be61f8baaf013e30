"""Where replay's and the live check's time goes on the bench step (cProfile, grouped).

Dumps the bench step once in tensor mode (plain CPU or on `sim`), then profiles one
figures-only replay of it and one live-checked step, after an unprofiled warm-up of each,
and prints the cumulative seconds of each part (parts nest: the reference runs include
their kernels; "rest" is the whole minus the listed top-level parts), with wall and CPU
seconds of the bare step beside them. cProfile inflates Python-heavy parts; read the shares.

Run: PYTHONPATH=$PWD [OMP_NUM_THREADS=1] python benchmarks/profile_replay_live.py
     [--profile fp16-cube|none]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

import torch
from _common import bare_step, on_device

from accuracy import dumper
from accuracy.examples import bench_setup, bench_step
from accuracy.live import live_check
from accuracy.replay import replay

# (label, file suffix, function name): cumulative time of these functions
REPLAY_PARTS = [
    ("reference runs (same dtype + fp64)", "replay/ops.py", "_run"),
    ("bit compare device vs reference", "replay/metrics.py", "bit_equal"),
    ("content-hash proof", "replay/ops.py", "same_bits"),
    ("error metrics (differing outputs)", "replay/metrics.py", "output_metrics"),
    ("reads: inputs (cache/prefetch/wait)", "replay/cache.py", "input"),
    ("reads: device outputs", "replay/cache.py", "load"),
    ("write replay.h5 records", "replay/engine.py", "_write"),
]
LIVE_PARTS = [
    ("reference runs (same dtype + fp64)", "replay/ops.py", "_run"),
    ("bit compare device vs reference", "replay/metrics.py", "bit_equal"),
    ("error metrics (differing outputs)", "replay/metrics.py", "output_metrics"),
    ("input snapshot", "live/check.py", "_snapshot"),
    ("call shapes (+ norms, before)", "live/check.py", "__init__"),
    ("input norms, lazy (after)", "live/check.py", "stats"),
    ("judge (verdict rule)", "compare/verdict.py", "judge_local"),
    ("measure (all of the check)", "live/check.py", "_measure"),
]


def _cum(stats: pstats.Stats, suffix: str, name: str) -> float:
    total = 0.0
    for (file, _, fn), (_, _, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        if fn == name and file.endswith(suffix):
            total += ct
    return total


def _profile(fn) -> tuple[pstats.Stats, float, float]:
    pr = cProfile.Profile()
    c0, t0 = time.process_time(), time.perf_counter()
    pr.enable()
    fn()
    pr.disable()
    return pstats.Stats(pr), time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="fp16-cube", help="sim profile, or none (plain CPU)")
    args = ap.parse_args()
    profile = None if args.profile == "none" else args.profile
    model, batch = bench_setup()

    def device():
        return on_device(profile)

    def bare() -> None:
        bare_step(model, batch, profile)

    tmp = Path(tempfile.mkdtemp(prefix="profile_rl_"))
    dump, out = tmp / "tensor.h5", tmp / "replay.h5"
    with device(), dumper(dump_path=dump, mode="tensor"):
        bench_step(model, batch)
    model.zero_grad(set_to_none=True)

    def do_replay() -> None:
        replay(dump, out, overwrite=True)

    def do_live() -> None:
        with device(), live_check(on="cpu"):
            bench_step(model, batch)
        model.zero_grad(set_to_none=True)

    bare()
    c0, t0 = time.process_time(), time.perf_counter()
    bare()
    b_wall, b_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"torch threads {torch.get_num_threads()}, device "
          f"{'sim ' + profile if profile else 'plain CPU'}, load {os.getloadavg()[0]:.1f}; "
          f"bare step {b_wall:.3f} s wall, {b_cpu:.3f} s CPU")
    for label, fn, parts in (("replay", do_replay, REPLAY_PARTS),
                             ("live check", do_live, LIVE_PARTS)):
        fn()  # warm-up
        stats, wall, cpu = _profile(fn)
        total = wall
        print(f"\n{label}: {wall:.3f} s wall ({wall / b_wall:.2f}x bare), {cpu:.3f} s CPU "
              f"({cpu / b_cpu:.2f}x bare CPU) under cProfile; load {os.getloadavg()[0]:.1f}")
        for name, suffix, func in parts:
            t = _cum(stats, suffix, func)
            print(f"  {name:40s} {t:7.3f} s  {100 * t / total:5.1f}%")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()


if __name__ == "__main__":
    main()
