"""Runs inside benchmarks/.msprobe-venv (never the project's venv): `msprobe compare` of two
msprobe tensor dumps, timed. Prints one JSON line with seconds and bytes of tensor data.

Usage: msprobe_compare_runner.py DUMP_DIR_A DUMP_DIR_B OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def _rank_dir(d: Path) -> Path:
    hits = sorted(p.parent for p in d.rglob("dump.json"))
    if not hits:
        raise SystemExit(f"no dump.json under {d}")
    return hits[0]


def main(a: str, b: str, out: str) -> dict:
    ra, rb = _rank_dir(Path(a)), _rank_dir(Path(b))
    Path(out).mkdir(parents=True, exist_ok=True)
    data = sum(p.stat().st_size for r in (ra, rb) for p in (r / "dump_tensor_data").glob("*")
               if p.is_file())
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "msprobe.msprobe", "compare", "--target_path",
                           str(ra.parent), "--golden_path", str(rb.parent), "--output_path",
                           out],
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not list(Path(out).glob("compare_result*")):
        raise SystemExit((proc.stdout + proc.stderr)[-2000:])
    return {"seconds": seconds, "bytes": data}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
