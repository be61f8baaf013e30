"""Where the statistics dump's time goes, part by part, on the bench step of bench_dump.py.

Each variant switches off one more part of the statistics-mode dumper (monkeypatched in this
process only) and runs interleaved with the bare step: bare, an empty TorchDispatchMode, the
full statistics dump, and the dump without the statistics reductions, without the per-op
observers other than the recorder, without the argument JSON, and with the statistics'
Python path instead of the C++ module (a negative part: what the C++ path saves). A part's
cost is the full dump's time minus the variant's. Times are CPU seconds of the whole process
(the writer and statistics threads included) and of the training thread alone (what the step
waits for when a core is spare), which a shared machine disturbs less than wall time; wall
time beside them.
The same script runs on an older tree (parts it lacks are left as they are).

Run: .venv/bin/python benchmarks/bench_dump_parts.py [--repeat 7] [--threads both|N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from _common import threads_from_argv

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

import torch
from _common import add_threads_arg, run_both_threads
from torch.utils._python_dispatch import TorchDispatchMode

from accuracy import dumper
from accuracy.dumper import core, recorder
from accuracy.dumpfile import stats as stats_mod
from accuracy.examples import bench_setup, bench_step

try:
    from accuracy.native import fastpath
except ImportError:  # an older tree: no C++ statistics path
    fastpath = None


class _Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _patched(obj: object, name: str, value: object) -> Iterator[None]:
    # a class keeps its staticmethod wrapper (getattr would hand back the bare function)
    old = obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class _Nothing:
    def before(self, call):
        pass

    def after(self, call, outputs):
        pass

    def finish(self):
        return {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    model, batch = bench_setup()
    tmp = tempfile.mkdtemp(prefix="bench_parts_", dir="/dev/shm" if os.path.isdir("/dev/shm")
                           else None)
    path = os.path.join(tmp, "s.h5")

    def stats_dump() -> None:
        with dumper(dump_path=path, mode="statistics", overwrite=True):
            bench_step(model, batch)

    def empty_mode() -> None:
        with _Empty():
            bench_step(model, batch)

    def open_close() -> None:
        with dumper(dump_path=path, mode="statistics", overwrite=True, ops="no.such.op"):
            bench_step(model, batch)

    def without_stats() -> None:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_patched(recorder, "tensor_stats",
                                         lambda t, sums=True: stats_mod.EMPTY_STATS))
            deferred = getattr(recorder, "DeferredStats", None)  # absent before issue 31
            if deferred is not None:
                stack.enter_context(_patched(deferred, "wants", staticmethod(lambda t: False)))
            stats_dump()

    def without_observers() -> None:
        with _patched(core, "QuantFigures", _Nothing), _patched(core, "SubclassWatch", _Nothing):
            stats_dump()

    def python_stats() -> None:
        # the statistics dump's Python path (dumpfile/stats.py) instead of the C++ module
        # (accuracy/native/stats.cpp); absent before issue 51: the same dump
        if fastpath is None:
            stats_dump()
            return
        with _patched(fastpath, "_resolved", [None]), _patched(fastpath, "load", lambda: None):
            stats_dump()

    def without_args_json() -> None:
        with _patched(recorder, "encode_call", lambda *a: "[]"):
            stats_dump()

    variants: dict[str, Callable[[], None]] = {
        "bare step": lambda: bench_step(model, batch),
        "empty dispatch mode": empty_mode,
        "dump, no op recorded": open_close,
        "statistics dump": stats_dump,
        "  without reductions": without_stats,
        "  without QuantFigures+SubclassWatch": without_observers,
        "  without argument JSON": without_args_json,
        "  Python statistics path, not C++": python_stats,
    }
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    thread: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm-up
        fn()
    for _ in range(args.repeat):
        for k, fn in variants.items():
            c0, w0, t0 = time.process_time(), time.perf_counter(), time.thread_time()
            fn()
            thread[k].append(time.thread_time() - t0)
            cpu[k].append(time.process_time() - c0)
            wall[k].append(time.perf_counter() - w0)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    thr = {k: statistics.median(v) for k, v in thread.items()}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.repeat} "
          f"interleaved rounds, load average {os.getloadavg()[0]:.2f}; median CPU seconds "
          "per step: the process (all threads) and the training thread alone")
    print(f"{'variant':38s} {'cpu s':>7s} {'x bare':>7s} {'part ms':>8s} {'thread s':>9s} "
          f"{'x bare':>7s} {'part ms':>8s} {'wall s':>7s}")
    for k in variants:
        parts = []
        for m in (med, thr):
            if k.startswith("  "):
                parts.append(f"{(m['statistics dump'] - m[k]) * 1e3:8.1f}")
            elif k == "empty dispatch mode":
                parts.append(f"{(m[k] - m['bare step']) * 1e3:8.1f}")
            else:
                parts.append(f"{'':8s}")
        print(f"{k:38s} {med[k]:7.3f} {med[k] / med['bare step']:7.2f} {parts[0]} "
              f"{thr[k]:9.3f} {thr[k] / thr['bare step']:7.2f} {parts[1]} "
              f"{statistics.median(wall[k]):7.3f}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
