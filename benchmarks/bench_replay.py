"""Replay speed on the tensor dump of the benchmark transformer step.

The step of bench_dump.py (4-layer TransformerEncoder, batch 8, seq 128, forward + backward)
is dumped once in tensor mode, then replayed on CPU: in the op's own dtype and upcast to fp64
(the default), and with --upcast none for comparison. Prints ops/s, MB/s of tensor data read
and the ratio to the bare step's time (goal: at most 3x).

Run: .venv/bin/python benchmarks/bench_replay.py [--repeat 3] [--jobs 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _common import timed

from accuracy import dumper
from accuracy.examples import bench_setup, bench_step
from accuracy.replay import replay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_replay_"))
    bare = timed(lambda: bench_step(model, batch), repeat=5)
    dump = tmp / "tensor.h5"
    with dumper(dump_path=dump, mode="tensor"):
        bench_step(model, batch)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, jobs {args.jobs}, "
          f"best of {args.repeat} replays; dump {dump.stat().st_size / 1e6:.1f} MB")
    print(f"{'run':26s} {'seconds':>8s} {'x bare':>7s} {'ops/s':>8s} {'MB/s read':>10s}  status")
    print(f"{'bare step':26s} {bare:8.3f} {1:7.2f}")
    for upcast in ("fp64", "none"):
        best, res = float("inf"), None
        for i in range(args.repeat):
            t0 = time.perf_counter()
            res = replay(dump, tmp / f"replay-{upcast}-{i}.h5", upcast=upcast, jobs=args.jobs)
            best = min(best, time.perf_counter() - t0)
        assert res is not None
        print(f"{'replay, upcast ' + upcast:26s} {best:8.3f} {best / bare:7.2f} "
              f"{res.total / best:8.0f} {res.bytes_read / 1e6 / best:10.1f}  "
              f"{res.ok} ok, {res.skipped} skipped, {res.failed} failed")


if __name__ == "__main__":
    main()
