"""Runs inside benchmarks/.msprobe-venv (never the project's venv): `msprobe compare` of two
msprobe tensor dumps in process, the way bench_compare.py times our `compare()`: msprobe's own
CLI entry point (`msprobe.msprobe.main`, the code `msprobe compare` runs) called once untimed as
a warm-up, then REPEAT timed calls, each writing its report to a fresh folder. Prints one JSON
line with the seconds of each timed call and the bytes of tensor data in the two dumps.

Usage: msprobe_compare_runner.py RANK_DIR_A RANK_DIR_B OUT_DIR [REPEAT]
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def main(a: str, b: str, out: str, repeat: int) -> dict:
    from msprobe.msprobe import main as msprobe_main

    ra, rb = Path(a), Path(b)
    data = sum(p.stat().st_size for r in (ra, rb) for p in (r / "dump_tensor_data").glob("*")
               if p.is_file())
    times = []
    for i in range(repeat + 1):
        dest = Path(out) / f"run{i}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        sys.argv = ["msprobe", "compare", "--target_path", str(ra.parent), "--golden_path",
                    str(rb.parent), "--output_path", str(dest)]
        t0 = time.perf_counter()
        try:
            msprobe_main()
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        elapsed = time.perf_counter() - t0
        if not list(dest.glob("compare_result*")):
            raise SystemExit(f"msprobe compare wrote no compare_result under {dest}")
        shutil.rmtree(dest, ignore_errors=True)
        if i:  # the first call warms up
            times.append(elapsed)
    return {"seconds": times, "bytes": data}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3],
                          int(sys.argv[4]) if len(sys.argv) > 4 else 3)))
