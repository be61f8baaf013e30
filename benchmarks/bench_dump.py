"""Dumper overhead on one training step of the benchmark transformer.

4-layer nn.TransformerEncoder (d_model 256, 8 heads, ff 1024), batch 8, sequence 128, a
1000-class head, cross-entropy; forward and backward. Timed bare, in statistics mode and in
tensor mode; where msprobe is installed in benchmarks/.msprobe-venv, its L1 statistics and
tensor dumps of the same step run in the same invocation for a side-by-side ratio.

Run: .venv/bin/python benchmarks/bench_dump.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
from _common import msprobe_available, run_msprobe, timed

from accuracy import dumper, load_dump
from accuracy.examples import bench_setup, bench_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-msprobe", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_dump_"))

    bare = timed(lambda: bench_step(model, batch), repeat=args.repeat)
    results = {"bare": bare}
    info = {}
    for mode in ("statistics", "tensor"):
        path = tmp / f"{mode}.h5"

        def run(mode=mode, path=path):
            with dumper(dump_path=path, mode=mode, overwrite=True):
                bench_step(model, batch)

        results[mode] = timed(run, repeat=args.repeat)
        with load_dump(path) as d:
            s = d.summary()
        info[mode] = (s["ops"], s["by_phase"], s["bytes_written"], s["bytes_saved_by_links"],
                      path.stat().st_size)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"median of {args.repeat} runs")
    print(f"{'run':28s} {'seconds':>8s} {'x bare':>7s}  details")
    print(f"{'bare step':28s} {bare:8.3f} {1:7.2f}")
    for mode in ("statistics", "tensor"):
        ops, phases, written, linked, fsize = info[mode]
        print(f"{'accuracy ' + mode:28s} {results[mode]:8.3f} {results[mode] / bare:7.2f}  "
              f"{ops} ops {phases}, data {written / 1e6:.1f} MB, saved by links "
              f"{linked / 1e6:.1f} MB, file {fsize / 1e6:.1f} MB")
    if msprobe_available() and not args.no_msprobe:
        ms_bare = run_msprobe("bare", "5")["seconds"]
        print(f"{'msprobe venv bare step':28s} {ms_bare:8.3f} {1:7.2f}")
        for task in ("statistics", "tensor"):
            r = run_msprobe("dump", task, str(tmp / f"msprobe_{task}"), "3")
            print(f"{'msprobe L1 ' + task:28s} {r['seconds']:8.3f} {r['seconds'] / ms_bare:7.2f}"
                  f"  files {r['bytes'] / 1e6:.1f} MB")
            if task == "tensor":
                print(f"accuracy tensor / msprobe tensor time: "
                      f"{results['tensor'] / r['seconds']:.2f} (goal <= 0.5)")
    else:
        print("msprobe not installed in benchmarks/.msprobe-venv: side-by-side skipped "
              "(python3.11 -m venv benchmarks/.msprobe-venv && "
              "benchmarks/.msprobe-venv/bin/pip install torch==2.13.0 mindstudio-probe)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
