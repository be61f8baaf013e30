"""Throughput of the stored-bytes check: XXH3-64 content hash (dump schema 3) against the
older bit-pattern sum, on the same 64 MiB of float32 bytes (single thread, numpy).

Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_hash.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from accuracy.dumpfile.checksum import checksum, content_hash


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--mib", type=int, default=64)
    args = ap.parse_args()
    raw = np.random.default_rng(0).random(args.mib << 18, dtype=np.float32).view(np.uint8)
    for name, fn in (("xxh3-64 content hash", lambda: content_hash(raw)),
                     ("bit-pattern sum (int32)", lambda: checksum(raw, 4))):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        gbs = raw.nbytes / statistics.median(times) / 1e9
        print(f"{name:26s} {gbs:6.2f} GB/s (median of {args.repeat}, best "
              f"{raw.nbytes / min(times) / 1e9:.2f})")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
