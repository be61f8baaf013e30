"""Compare speed, like for like: tensor dumps of the benchmark transformer step.

Ours: golden on CPU, device on `sim` fp16-cube (every tensor differs, so no bit-identical fast
path). msprobe (where installed in benchmarks/.msprobe-venv): two L1 tensor dumps of the same
step. Two measurements, each side the same way, interleaved (ours, msprobe, ours, ...):

- whole process: `python -m accuracy.cli compare ... -o DIR` against
  `python -m msprobe.msprobe compare ...`, from launch to exit, both writing their report,
  each as a user runs it (ours with its default workers, `-j auto`), both from cached
  bytecode after one untimed run each;
- in process: `compare()` + `Report.write()` of the command's default formats (json, csv,
  html) against msprobe's compare function, after one untimed warm-up call each, interpreter
  start-up and imports excluded.

Beside wall time, our CPU time (user + system; whole process: the child's rusage) is printed:
on a shared machine it says what the work costs a core when other jobs take the wall clock.

The headline is the time to compare the step's dumps (same task for both). GB/s are printed
with each tool's own tensor bytes (the bytes of tensor data in the two dumps it compared), and
the ratio also per byte, so a tool is never credited with bytes the other did not read. Met /
not met is printed beside each goal: msprobe time / ours >= 10 (whole process, by the median
per repeat) and >= 1.5 GB/s per core (in process, by the median CPU time). `--threads both`
runs it twice from one command, each in a fresh process: torch's default threads, then
OMP_NUM_THREADS=1 (both tools, and the command-line runs, under the same setting); `--threads
N` sets OMP_NUM_THREADS.

Run: .venv/bin/python benchmarks/bench_compare.py [--repeat 5] [--workdir DIR] [--threads both|N]

To install msprobe (never a project dependency): python3.11 -m venv benchmarks/.msprobe-venv &&
benchmarks/.msprobe-venv/bin/pip install torch==2.13.0 mindstudio-probe
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    MSPROBE_PY,
    add_threads_arg,
    msprobe_available,
    ratios,
    run_both_threads,
    run_msprobe,
    spread,
    threads_from_argv,
    verdict,
)

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS (torch is imported in main)


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


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed_process(cmd: list[str], env: dict | None = None, cpu: list | None = None) -> float:
    c0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, check=False)
    took = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(_children_cpu() - c0)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {(p.stdout + p.stderr)[-2000:]}")
    return took


def _msprobe_rank_dir(d: Path) -> Path:
    return sorted(p.parent for p in d.rglob("dump.json"))[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--workdir", help="keep dumps here (default: a temporary directory)")
    p.add_argument("--no-msprobe", action="store_true")
    add_threads_arg(p)
    args = p.parse_args()
    if args.threads == "both":
        return run_both_threads()
    from accuracy.cliargs import usable_cores
    from accuracy.compare import compare
    from accuracy.compare.report import FORMATS

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        device, golden = make_dumps(work)
        ms = None
        if msprobe_available() and not args.no_msprobe:
            dirs = []
            for side in ("a", "b"):
                d = work / f"msprobe_{side}"
                if not list(d.rglob("dump.json")):
                    run_msprobe("dump", "tensor", str(d), "1")
                dirs.append(_msprobe_rank_dir(d))
            ms_bytes = sum(f.stat().st_size for r in dirs for f in
                           (r / "dump_tensor_data").glob("*") if f.is_file())
            ms = (dirs, ms_bytes)

        # -- whole process against whole process ------------------------------------------
        ours_cli, ms_cli, ours_cli_cpu, ms_cli_cpu = [], [], [], []
        # Both tools start from compiled bytecode, as an installed tool does: msprobe's wheel
        # was byte-compiled by pip, but our editable install is not, and a shell with
        # PYTHONDONTWRITEBYTECODE=1 (this machine's) recompiled ~40 of our modules on every
        # launch (~50 ms). The cache lives in the work folder; one untimed run of each tool
        # fills it (and the page cache) before the timed runs.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
            PYTHONPYCACHEPREFIX=str(work / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)

        def ours_cli_run(cpu: list | None) -> float:
            out = work / "ours_cli"
            shutil.rmtree(out, ignore_errors=True)
            return _timed_process(
                [sys.executable, "-m", "accuracy.cli", "compare", "-m", str(device), "-g",
                 str(golden), "-o", str(out), "--no-progress"], env, cpu)

        def ms_cli_run(cpu: list | None, i: int) -> float:
            out = work / f"ms_cli{i}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            took = _timed_process(
                [str(MSPROBE_PY), "-m", "msprobe.msprobe", "compare", "--target_path",
                 str(ms[0][0].parent), "--golden_path", str(ms[0][1].parent),
                 "--output_path", str(out)], env, cpu)
            shutil.rmtree(out, ignore_errors=True)
            return took

        ours_cli_run(None)  # warm-up: bytecode cache and page cache
        if ms:
            ms_cli_run(None, -1)
        for i in range(args.repeat):
            ours_cli.append(ours_cli_run(ours_cli_cpu))
            if ms:
                ms_cli.append(ms_cli_run(ms_cli_cpu, i))

        # -- in process against in process ------------------------------------------------
        def ours_once() -> dict:
            out = work / "ours_inproc"
            shutil.rmtree(out, ignore_errors=True)
            rep = compare(device, golden)
            rep.write(out, FORMATS)
            return rep.summary

        summary = ours_once()  # warm-up, as msprobe's runner does
        ours_in, ours_in_cpu = [], []
        for _ in range(args.repeat):
            c0, t0 = time.process_time(), time.perf_counter()
            ours_once()
            ours_in.append(time.perf_counter() - t0)
            ours_in_cpu.append(time.process_time() - c0)
        ms_in = None
        if ms:
            proc = subprocess.run(
                [str(MSPROBE_PY), str(HERE / "msprobe_compare_runner.py"), str(ms[0][0]),
                 str(ms[0][1]), str(work / "ms_inproc"), str(args.repeat)],
                capture_output=True, text=True, timeout=3600, check=False)
            line = next((ln for ln in reversed(proc.stdout.splitlines())
                         if ln.startswith("{")), None)
            if line is None:
                raise RuntimeError(f"msprobe in-process compare failed: {proc.stderr[-2000:]}")
            ms_in = json.loads(line)["seconds"]  # one per timed call, after a warm-up

        ob = summary["bytes_compared"]
        print(f"ours: {device.name} vs {golden.name}, {summary['rows']} rows, tensor data "
              f"{ob / 1e6:.0f} MB; {args.repeat} repeats, median (min–max)")
        print(f"workers: the command's default (-j auto: {usable_cores()} here); in process "
              "compare() with jobs=1 (one core: the per-core figure)")
        if ms:
            print(f"msprobe: two L1 tensor dumps of the same step, tensor data "
                  f"{ms[1] / 1e6:.0f} MB")
        print(f"report files written: {', '.join(FORMATS)} (the command's default)")
        for what, o, m, cpu, mcpu, goal in (
                ("whole process", ours_cli, ms_cli, ours_cli_cpu, ms_cli_cpu,
                 "goal: msprobe time / ours >= 10"),
                ("in process", ours_in, ms_in, ours_in_cpu, None,
                 "goal: >= 1.5 GB/s per core (issue 31)")):
            print(f"{what} ({goal}):")
            print(f"  accuracy  {spread(o, '{:.2f}')} s  = {ob / min(o) / 1e9:.3f} GB/s at best")
            per_core = f"{ob / min(cpu) / 1e9:.3f} GB/s per core at best"
            if what == "in process":
                med = ob / statistics.median(cpu) / 1e9
                per_core += (f", {med:.3f} by the median ("
                             f"{verdict(med, 1.5, lower_is_better=False, unit=' GB/s per core')})")
            print(f"  accuracy  CPU {spread(cpu, '{:.2f}')} s  = {per_core}")
            if m:
                print(f"  msprobe   {spread(m, '{:.2f}')} s  = {ms[1] / min(m) / 1e9:.3f} GB/s "
                      "at best")
                n = min(len(o), len(m))
                t = ratios(m[:n], o[:n])
                goal_met = (f" ({verdict(statistics.median(t), 10, lower_is_better=False)} by "
                            "the median)" if what == "whole process" else "")
                print(f"  msprobe time / ours, per repeat: {spread(t, '{:.1f}')}{goal_met}; per "
                      f"byte (each tool's own bytes): "
                      f"{spread([x * ob / ms[1] for x in t], '{:.1f}')}")
            elif what == "whole process":
                print("  msprobe time / ours: no msprobe run, goal >= 10x not judged")
            if m and mcpu:
                print(f"  msprobe   CPU {spread(mcpu, '{:.2f}')} s; msprobe CPU / ours, per "
                      f"repeat: {spread(ratios(mcpu, cpu[:len(mcpu)]), '{:.1f}')}")
        print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if not ms:
            print("msprobe: " + ("skipped (--no-msprobe)" if args.no_msprobe else
                                 "not installed in benchmarks/.msprobe-venv (see this module's "
                                 "docstring); no side-by-side figure"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
