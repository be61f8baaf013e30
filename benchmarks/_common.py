"""Shared helpers for the benchmarks: timing, thread settings, goal verdicts and the msprobe
side-by-side runner. Imports no torch at module level: a bench script imports it before torch,
so that `threads_from_argv()` can set OMP_NUM_THREADS before torch reads it."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
MSPROBE_PY = HERE / ".msprobe-venv" / "bin" / "python"

THREADS_HELP = ("'both' (torch's default threads, then OMP_NUM_THREADS=1, each in a fresh "
                "process), 'default' (OMP_NUM_THREADS unset) or a number (OMP_NUM_THREADS)")


def _threads_value(argv: list[str]) -> str | None:
    """The value of the last `--threads X` / `--threads=X` in `argv`, or None."""
    value = None
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith("--threads="):
            value = a.split("=", 1)[1]
    return value


def threads_from_argv(argv: list[str] | None = None) -> None:
    """Set OMP_NUM_THREADS from `--threads N` in `argv` (default: sys.argv); `--threads
    default` removes it, so torch picks its own. Call at the very top of a bench script, under
    `if __name__ == "__main__":` and before torch is imported: torch (OpenMP) reads the variable
    once, at import. Child processes the script starts inherit the setting."""
    value = _threads_value(sys.argv[1:] if argv is None else argv)
    if value == "default":
        os.environ.pop("OMP_NUM_THREADS", None)
    elif value is not None and value.isdigit() and int(value) > 0:
        os.environ["OMP_NUM_THREADS"] = value
        if "torch" in sys.modules:  # imported too early: tell torch itself, as a fallback
            sys.modules["torch"].set_num_threads(int(value))


def _threads_arg(value: str) -> str:
    if value in ("", "both", "default") or (value.isdigit() and int(value) > 0):
        return value
    raise argparse.ArgumentTypeError(f"expected 'both', 'default' or a number, not {value!r}")


def add_threads_arg(ap: argparse.ArgumentParser, default: str = "") -> None:
    """The `--threads both|default|N` option (read again, before torch, by threads_from_argv).
    The empty default keeps the environment's OMP_NUM_THREADS."""
    ap.add_argument("--threads", type=_threads_arg, default=default, help=THREADS_HELP)


def run_both_threads(argv: list[str] | None = None, script: str | Path | None = None) -> int:
    """Run `script` (default: the running __main__ script) again with `argv` (default: this
    process's arguments), less any `--threads`, in two fresh processes, one after the other:
    torch's default threads (OMP_NUM_THREADS removed from the environment, `--threads
    default`), then `--threads 1`; a header line before each. Returns the first non-zero exit
    status, else 0."""
    argv = sys.argv[1:] if argv is None else argv
    if script is None:
        script = sys.modules["__main__"].__file__
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--threads":
            skip = True
        elif not a.startswith("--threads="):
            rest.append(a)
    rc = 0
    for setting, header in (("default", "default torch threads"), ("1", "OMP_NUM_THREADS=1")):
        env = dict(os.environ)
        env.pop("OMP_NUM_THREADS", None)
        print(f"=== {header} ===", flush=True)
        proc = subprocess.run([sys.executable, str(script), *rest, "--threads", setting],
                              env=env, check=False)
        rc = rc or proc.returncode
    return rc


def meets(value: float, goal: float, lower_is_better: bool = True, strict: bool = False) -> bool:
    """Whether `value` meets `goal` (at most it, or with lower_is_better=False at least it;
    strict: below / above it)."""
    if lower_is_better:
        return value < goal if strict else value <= goal
    return value > goal if strict else value >= goal


def verdict(value: float, goal: float, lower_is_better: bool = True, unit: str = "x", *,
            strict: bool = False, what: str | None = None, ok: bool | None = None) -> str:
    """'goal <= 1.3x: met' / 'goal >= 1.5 GB/s: not met'; `what` replaces the '<= 1.3x', `ok`
    (for a goal of several figures) the comparison of `value` with `goal`."""
    op = ("<" if strict else "<=") if lower_is_better else (">" if strict else ">=")
    if ok is None:
        ok = meets(value, goal, lower_is_better, strict)
    return f"goal {what or f'{op} {goal:g}{unit}'}: {'met' if ok else 'not met'}"


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


def interleaved(fns: dict[str, Callable[[], object]], repeat: int, warmup: int = 1,
                before: dict[str, Callable[[], object]] | None = None
                ) -> dict[str, list[float]]:
    """Wall times of each fn, run in turn (A B C A B C ...) so that a machine shared with
    other work slows every side alike; each fn gets `warmup` untimed runs first. `before`:
    untimed work run just before a side's every run (removing the last run's files, as
    msprobe_runner.py removes its run folder outside the clock)."""
    before = before or {}
    for _ in range(warmup):
        for k, fn in fns.items():
            if k in before:
                before[k]()
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            if k in before:
                before[k]()
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
