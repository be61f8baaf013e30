"""Overhead of statistics-free overflow checking on the benchmark transformer step.

Prints the bare step time, the step under `dumper(check_overflow=True)` (no births: nothing is
written but the root summary), and their ratio, met / not met beside the goal: at most 1.3x.
`--threads both` runs it twice from one command, each in a fresh process: torch's default
threads, then OMP_NUM_THREADS=1; `--threads N` sets OMP_NUM_THREADS.

Run: .venv/bin/python benchmarks/bench_overflow.py [--repeat 7] [--threads both|N]
"""

from __future__ import annotations

import argparse
import os
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

from accuracy.dumper.core import dumper
from accuracy.examples import bench_setup, bench_step


def _time(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_overflow_"))
    n = iter(range(10**6))

    def bare() -> None:
        model.zero_grad(set_to_none=True)
        bench_step(model, batch)

    def checked() -> None:
        model.zero_grad(set_to_none=True)
        with dumper(tmp / f"ovf{next(n)}.h5", check_overflow=True):
            bench_step(model, batch)

    bare(), checked()  # warm up
    # interleave so that load from other processes hits both alike
    b, c = [], []
    for _ in range(args.repeat):
        b += _time(bare, 1)
        c += _time(checked, 1)
    bm, cm = statistics.median(b), statistics.median(c)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}), repeat {args.repeat}")
    print(f"bare step            median {bm * 1e3:7.1f} ms  min {min(b) * 1e3:7.1f} ms")
    print(f"check_overflow=True  median {cm * 1e3:7.1f} ms  min {min(c) * 1e3:7.1f} ms")
    r = sorted(x / y for x, y in zip(c, b, strict=True))
    print(f"ratio (median) {cm / bm:.2f}x ({verdict(cm / bm, 1.3)})   ratio (min) "
          f"{min(c) / min(b):.2f}x")
    print(f"per-round ratio checked/bare: median {statistics.median(r):.2f}x "
          f"({verdict(statistics.median(r), 1.3)}), min–max {r[0]:.2f}–{r[-1]:.2f}x over "
          f"{len(r)} interleaved rounds")
    # msprobe 26.2's overflow job (task nan_check) refuses to start without torch_npu
    print("msprobe side by side: none (its nan_check task runs only where torch_npu imports: "
          "no same job on CPU)")


if __name__ == "__main__":
    main()
