"""Tensor-mode dump of the benchmark step: this tree's dump writer against another tree's.

One process, one model; rounds alternate bare step, tensor dump with this tree's
`accuracy/dumpfile/writer.py`, tensor dump with the other tree's writer (loaded from its file
under another module name and swapped in for the dumper), after one warm-up of each. So a
machine shared with other work slows both writers alike, and only the writer differs.
Each figure is the median (min–max) of the per-round ratio to that round's bare step.

Run: .venv/bin/python benchmarks/bench_writer_ab.py --other /work/main [--repeat 5]
     [--threads both|N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import threads_from_argv

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

import torch
from _common import add_threads_arg, interleaved, ratios, run_both_threads, spread

from accuracy import dumper, load_dump
from accuracy.examples import bench_setup, bench_step

core = importlib.import_module("accuracy.dumper.core")  # the package name is the function


def _load_writer(tree: Path):
    """The other tree's writer module, importable beside ours."""
    path = tree / "accuracy" / "dumpfile" / "writer.py"
    spec = importlib.util.spec_from_file_location("accuracy.dumpfile._other_writer", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", type=Path, required=True, help="the other tree (e.g. main)")
    ap.add_argument("--repeat", type=int, default=5)
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    other = _load_writer(args.other)
    if not hasattr(other.DumpWriter, "stage"):  # a writer from before the staging ring:
        other.DumpWriter.stage = lambda self, t: None  # the recorder makes private copies
    ours = core.DumpWriter
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_writer_ab_"))

    def dumped(writer_cls, name: str):
        def run():
            core.DumpWriter = writer_cls
            try:
                with dumper(dump_path=tmp / f"{name}.h5", mode="tensor", overwrite=True):
                    bench_step(model, batch)
            finally:
                core.DumpWriter = ours
        return run

    t = interleaved({"bare": lambda: bench_step(model, batch),
                     "this": dumped(ours, "this"), "other": dumped(other.DumpWriter, "other")},
                    repeat=args.repeat)
    load = os.getloadavg()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; rounds bare/this/other, "
          f"1 warm-up each, {args.repeat} timed; median (min–max)")
    print(f"{'bare step':28s} {spread(t['bare']):>28s}")
    for name, label in (("this", "tensor, this tree"), ("other", f"tensor, {args.other}")):
        with load_dump(tmp / f"{name}.h5") as d:
            s = d.summary()
            bad = d.verify()
        print(f"{label:28s} {spread(t[name]):>28s}   x bare "
              f"{spread(ratios(t[name], t['bare']), '{:.2f}'):>24s}  "
              f"{s['bytes_written'] / 1e6:.0f} MB, verify: {'ok' if not bad else bad[:2]}")
    rel = ratios(t["this"], t["other"])
    print(f"this / other, round by round: {spread(rel, '{:.2f}')}; "
          f"median gain {1 - statistics.median(rel):+.0%}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
