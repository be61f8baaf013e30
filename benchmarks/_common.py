"""Shared helpers for the benchmarks: timing and the msprobe side-by-side runner."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
MSPROBE_PY = HERE / ".msprobe-venv" / "bin" / "python"


def on_device(profile: str | None):
    """The `sim` accelerator with `profile`, or plain CPU (a null context) for None."""
    import contextlib

    if profile is None:
        return contextlib.nullcontext()
    from accuracy.device_backend import sim

    return sim(profile=profile)


def bare_step(model, batch, profile: str | None) -> None:
    """One bench step on the device `profile` names, gradients dropped after it."""
    from accuracy.examples import bench_step

    with on_device(profile):
        bench_step(model, batch)
    model.zero_grad(set_to_none=True)


def timed(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Median wall time of `fn` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], object]], repeat: int, warmup: int = 1
                ) -> dict[str, list[float]]:
    """Wall times of each fn, run in turn (A B C A B C ...) so that a machine shared with
    other work slows every side alike; each fn gets `warmup` untimed runs first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t0)
    return out


def spread(xs: list[float], fmt: str = "{:.3f}") -> str:
    """'median (min–max, n runs)' of repeated measurements."""
    return (f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–"
            f"{fmt.format(max(xs))}, n={len(xs)})")


def ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-repeat ratios a_i / b_i of two interleaved series."""
    return [x / y for x, y in zip(a, b, strict=True)]


def msprobe_available() -> bool:
    return MSPROBE_PY.exists()


def run_msprobe(*args: str, timeout: int = 600) -> dict:
    """Run benchmarks/msprobe_runner.py inside msprobe's own venv; returns its JSON line."""
    proc = subprocess.run(
        [str(MSPROBE_PY), str(HERE / "msprobe_runner.py"), *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"msprobe run failed: {proc.stderr[-2000:]}")
