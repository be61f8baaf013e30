"""Compare throughput: tensor dumps of the benchmark transformer step, golden on CPU, device on
`sim` fp16-cube; prints GB/s of tensor data compared and the wall time. Where msprobe is installed
in benchmarks/.msprobe-venv, also dumps the same step with msprobe (tensor, L1), runs its compare
and prints both throughputs side by side. To install it there (never a project dependency):
python3.11 -m venv benchmarks/.msprobe-venv &&
benchmarks/.msprobe-venv/bin/pip install torch==2.13.0 mindstudio-probe

    .venv/bin/python benchmarks/bench_compare.py [-j N] [--repeat 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import MSPROBE_PY, msprobe_available, run_msprobe  # noqa: E402


def make_dumps(work: Path) -> tuple[Path, Path]:
    """Golden (CPU fp32) and device (sim fp16-cube) tensor dumps, reused when present."""
    from accuracy.device_backend import sim
    from accuracy.dumper.core import dumper
    from accuracy.examples import bench_setup, bench_step

    golden, device = work / "golden.h5", work / "device.h5"
    if not golden.exists():
        model, batch = bench_setup()
        with dumper(str(golden)):
            bench_step(model, batch)
    if not device.exists():
        model, batch = bench_setup()
        with sim(profile="fp16-cube"), dumper(str(device)):
            bench_step(model, batch)
    return device, golden


def ours(device: Path, golden: Path, jobs: int, repeat: int) -> dict:
    from accuracy.compare import compare

    times, rep = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        rep = compare(device, golden, jobs=jobs)
        times.append(time.perf_counter() - t0)
    assert rep is not None
    s = rep.summary
    return {"seconds": statistics.median(times), "bytes": s["bytes_compared"],
            "rows": s["rows"], "counts": s["counts"]}


def msprobe(work: Path) -> dict | None:
    """msprobe dump (tensor, L1) of the same step twice, then `msprobe compare`, timed."""
    if not msprobe_available():
        return None
    a = run_msprobe("dump", "tensor", str(work / "msprobe_a"), "1")
    b = run_msprobe("dump", "tensor", str(work / "msprobe_b"), "1")
    proc = subprocess.run(
        [str(MSPROBE_PY), str(HERE / "msprobe_compare_runner.py"), a["dump_dir"],
         b["dump_dir"], str(work / "msprobe_cmp")],
        capture_output=True, text=True, timeout=1800, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"msprobe compare failed: {proc.stderr[-2000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-j", "--jobs", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", help="keep dumps here (default: a temporary directory)")
    p.add_argument("--no-msprobe", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        device, golden = make_dumps(work)
        print(f"dumps ready in {time.perf_counter() - t0:.1f} s: {device} "
              f"({device.stat().st_size / 1e6:.0f} MB), {golden} "
              f"({golden.stat().st_size / 1e6:.0f} MB)")
        r = ours(device, golden, args.jobs, args.repeat)
        gbps = r["bytes"] / r["seconds"] / 1e9
        cores = min(args.jobs, os.cpu_count() or 1)
        print(f"accuracy compare -j {args.jobs}: {r['bytes'] / 1e6:.0f} MB of tensor data in "
              f"{r['seconds']:.2f} s = {gbps:.3f} GB/s ({gbps / cores:.3f} GB/s per core), "
              f"{r['rows']} rows {r['counts']}")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "accuracy.cli", "compare", "-m", str(device), "-g",
                        str(golden), "-j", str(args.jobs), "--no-progress"], check=True,
                       capture_output=True)
        cli_s = time.perf_counter() - t0
        print(f"accuracy compare CLI (process start included): {cli_s:.2f} s = "
              f"{r['bytes'] / cli_s / 1e9:.3f} GB/s")
        m = None if args.no_msprobe else msprobe(work)
        if m is None:
            print("msprobe: " + ("skipped (--no-msprobe)" if args.no_msprobe else
                                 "not installed in benchmarks/.msprobe-venv (see this module's "
                                 "docstring); no side-by-side figure"))
            return 0
        mg = m["bytes"] / m["seconds"] / 1e9
        print(f"msprobe compare:        {m['bytes'] / 1e6:.0f} MB of tensor data in "
              f"{m['seconds']:.2f} s = {mg:.3f} GB/s")
        print(f"ratio (ours / msprobe, per core): {gbps / cores / mg:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
