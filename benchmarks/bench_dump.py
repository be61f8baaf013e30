"""Dumper overhead on one training step of the benchmark transformer.

4-layer nn.TransformerEncoder (d_model 256, 8 heads, ff 1024), batch 8, sequence 128, a
1000-class head, cross-entropy; forward and backward. Bare, statistics-mode and tensor-mode
steps run interleaved (bare, statistics, tensor, bare, ...) after one warm-up each, so a shared
machine slows every side alike; each overhead is the median of the per-round ratios, with its
min–max. Where msprobe is installed in benchmarks/.msprobe-venv, its bare, L1 statistics and L1
tensor steps run the same way (same repeat count, same warm-up) in its own process.

Run: .venv/bin/python benchmarks/bench_dump.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from _common import interleaved, msprobe_available, ratios, run_msprobe, spread

from accuracy import dumper, load_dump
from accuracy.examples import bench_setup, bench_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-msprobe", action="store_true")
    args = ap.parse_args()
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_dump_"))

    def dumped(mode: str):
        def run():
            with dumper(dump_path=tmp / f"{mode}.h5", mode=mode, overwrite=True):
                bench_step(model, batch)
        return run

    t = interleaved({"bare": lambda: bench_step(model, batch),
                     "statistics": dumped("statistics"), "tensor": dumped("tensor")},
                    repeat=args.repeat)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; interleaved rounds "
          f"bare/statistics/tensor, 1 warm-up each, {args.repeat} timed rounds; "
          "median (min–max)")
    print(f"{'run':24s} {'seconds':>28s}   {'x bare (per round)':>28s}  details")
    print(f"{'bare step':24s} {spread(t['bare']):>28s}")
    for mode in ("statistics", "tensor"):
        with load_dump(tmp / f"{mode}.h5") as d:
            s = d.summary()
        print(f"{'accuracy ' + mode:24s} {spread(t[mode]):>28s}   "
              f"{spread(ratios(t[mode], t['bare']), '{:.2f}'):>28s}  {s['ops']} ops, data "
              f"{s['bytes_written'] / 1e6:.1f} MB, saved by links "
              f"{s['bytes_saved_by_links'] / 1e6:.1f} MB, file "
              f"{(tmp / f'{mode}.h5').stat().st_size / 1e6:.1f} MB")
    stats_ratio = statistics.median(ratios(t["statistics"], t["bare"]))
    print(f"accuracy statistics / bare step (median): {stats_ratio:.2f}x (goal <= 1.3x: "
          f"{'met' if stats_ratio <= 1.3 else 'not met'})")
    if msprobe_available() and not args.no_msprobe:
        m = run_msprobe("interleaved", str(args.repeat), str(tmp / "msprobe"), timeout=3600)
        print(f"{'msprobe venv bare step':24s} {spread(m['bare']):>28s}")
        for task in ("statistics", "tensor"):
            print(f"{'msprobe L1 ' + task:24s} {spread(m[task]):>28s}   "
                  f"{spread(ratios(m[task], m['bare']), '{:.2f}'):>28s}  files "
                  f"{m['bytes'][task] / 1e6:.1f} MB")
        # the two processes ran one after the other: pair round i of each side
        n = min(len(t["tensor"]), len(m["tensor"]))
        rel = ratios(t["tensor"][:n], m["tensor"][:n])
        print(f"accuracy tensor / msprobe tensor time, round by round: "
              f"{spread(rel, '{:.2f}')} (goal <= 0.5: "
              f"{'met' if statistics.median(rel) <= 0.5 else 'not met'})")
    else:
        print("msprobe not installed in benchmarks/.msprobe-venv: side-by-side skipped "
              "(python3.11 -m venv benchmarks/.msprobe-venv && "
              "benchmarks/.msprobe-venv/bin/pip install torch==2.13.0 mindstudio-probe)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
