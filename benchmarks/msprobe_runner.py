"""Runs inside benchmarks/.msprobe-venv (never the project's venv): msprobe dumps of the
benchmark transformer step, timed the same way as ours. Prints one JSON line.

Usage: msprobe_runner.py [--model bench|gpt2] dump statistics|tensor OUT_DIR [REPEAT]
       msprobe_runner.py interleaved REPEAT OUT_DIR   (bare, statistics, tensor in turn, as
                                                       bench_dump.py times ours)
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import bench_models

MODEL = "bench"  # `--model NAME` before the command: benchmarks/bench_models.py


def setup():
    """(model, batch, step) of the model named by `--model` (bench_models.setup)."""
    return bench_models.setup(MODEL)


def dump(task: str, out_dir: str, repeat: int) -> dict:
    """`repeat` timed L1 dumps of the step after one untimed warm-up; the last one is kept."""
    out = Path(out_dir)
    model, batch, step = setup()
    times, sizes = [], []
    for i in range(repeat + 1):
        run_dir = out / f"run{i}"
        elapsed = _timed_dump(_debugger(task, run_dir), model, batch, step)
        if i:  # the first run warms up
            times.append(elapsed)
            sizes.append(sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()))
    return {"task": task, "seconds": statistics.median(times), "bytes": sizes[-1],
            "dump_dir": str(out / f"run{repeat}")}


def _timed_dump(debugger, model, batch, step) -> float:
    """Seconds of one step under msprobe (its config was written before the clock starts)."""
    t0 = time.perf_counter()
    debugger.start(model)
    step(model, *batch)
    debugger.stop()
    debugger.step()
    return time.perf_counter() - t0


def _debugger(task: str, run_dir: Path):
    from msprobe.pytorch import PrecisionDebugger

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = run_dir.with_suffix(".json")
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps({
        "task": task, "dump_path": str(run_dir), "rank": [], "step": [], "level": "L1",
        task: {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }))
    PrecisionDebugger._instance = None
    return PrecisionDebugger(config_path=str(cfg))


def interleaved(repeat: int, out_dir: str) -> dict:
    """Bare, L1 statistics and L1 tensor steps in turn; one untimed warm-up round first."""
    model, batch, step = setup()
    out = Path(out_dir)
    times: dict[str, list[float]] = {"bare": [], "statistics": [], "tensor": []}
    sizes: dict[str, int] = {}
    for i in range(repeat + 1):
        for kind in times:
            if kind == "bare":
                t0 = time.perf_counter()
                step(model, *batch)
                elapsed = time.perf_counter() - t0
            else:
                run_dir = out / f"{kind}{i}"
                elapsed = _timed_dump(_debugger(kind, run_dir), model, batch, step)
                sizes[kind] = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
                shutil.rmtree(run_dir, ignore_errors=True)
            if i:
                times[kind].append(elapsed)
    return {**times, "bytes": sizes}


def bare(repeat: int) -> dict:
    model, batch, step = setup()
    step(model, *batch)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step(model, *batch)
        times.append(time.perf_counter() - t0)
    return {"task": "bare", "seconds": statistics.median(times)}


if __name__ == "__main__":
    if sys.argv[1] == "--model":
        MODEL = sys.argv[2]
        del sys.argv[1:3]
    kind = sys.argv[1]
    if kind == "interleaved":
        print(json.dumps(interleaved(int(sys.argv[2]), sys.argv[3])))
    elif kind == "bare":
        print(json.dumps(bare(int(sys.argv[2]) if len(sys.argv) > 2 else 5)))
    else:
        print(json.dumps(dump(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4
                              else 3)))
