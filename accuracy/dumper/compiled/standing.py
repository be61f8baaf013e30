"""Kernel hooks compiled in from the start: a program compiled before the dumper is recorded.

Jobs compile once, at their first step, and are dumped much later (`PrecisionDebugger` at step
5, the monitor's capture of a flagged step). A dumper hooks Inductor's code generation only
while it records, so those programs had no hook lines: their regions read `not-recorded`, and
the only remedy was a recompilation at the dumped step (minutes, and perhaps not the program
that ran). Once `watch_compiled()` ran, every program Inductor generates carries the hook
lines (accuracy/dumper/compiled/codegen.py), whether or not a dumper records: a line after
each launch that returns at once while no recording source listens (`launches.after_launch`),
so a later dumper records the launches of the very program that runs, without recompiling it.

The alternative, an instrumented twin rebuilt from Inductor's cached graph and swapped in for
the dumped step, was not taken: it is a second compile at the dumped step, of a program that
may differ from the one that ran (autotuning, dynamic shapes, cache state), and it does not
exist for a program with no cache entry. The hooks cost a Python call per kernel launch on
unrecorded steps (benchmarks/bench_compile.py, "standing hooks").

What `watch_compiled()` installs, for the rest of the process (or until `stop()`): the
code-generation wrapper, with its tag on torch's cache keys (hooked and plain programs are
never served for each other) and its random-number choice (codegen.random_mode); and the
dumper's two global module hooks (no-ops with no dumper active, kept for good): dynamo guards
a program that inlines module hooks on the global hook dicts being empty (a monitored model:
`len(_global_forward_hooks) != 0`), so a dumper adding them recompiled it at the dumped step.
They cost every eager module call a Python call (0.1-0.2 ms of a tiny Qwen2's 12-15 ms step,
1-1.5%). `ensure()`, what the debugger and the monitor call, puts them in at the start of the
first compile from then on (dynamo's compile-start callback, which runs before
dynamo traces, so the program is guarded on the hooks being there): loading dynamo is no sign
of a compile (`transformers` loads it in every eager forward), and a job that never compiles
pays nothing. Where torch has no such callback, `ensure()` puts them in at once once dynamo is
loaded.
"""

from __future__ import annotations

import logging
import sys
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, bool] = {}


def watch_compiled() -> bool:
    """Compile the kernel hooks into every program Inductor generates from now on (loads
    Inductor). Programs compiled before this call have none: a dumper says so of their regions
    (`BLIND:`). True if the hooks are in; False when Inductor cannot be hooked (logged)."""
    with _lock:
        if "on" in _state:
            return _state["on"]
        try:
            from accuracy.dumper.compiled import codegen

            codegen.install()  # held until stop()
            ok = codegen.installed()
            if ok:
                from accuracy.dumper import scope

                scope.install_kept_hooks()
        except Exception:  # noqa: BLE001 - the user's job goes on without standing hooks
            log.exception("cannot compile the kernel hooks into programs")
            ok = False
        _state["on"] = ok
        if ok:
            log.info("Inductor programs compiled from now on carry accuracy's kernel hooks "
                     "(idle while no dumper records)")
        return ok


def ensure() -> bool:
    """`watch_compiled()` at the start of the next compile (armed once dynamo is loaded; an
    eager job never loads Inductor on our account, nor pays for the module hooks). Cheap on
    every call after the first. True once the hooks are in."""
    if "on" in _state:
        return _state["on"]
    if "torch._dynamo" not in sys.modules:
        return False
    if _arm():
        return False
    return watch_compiled()


def _on_compile_start(_args: object) -> None:
    if "on" not in _state:
        watch_compiled()


def _start_callbacks() -> list | None:
    """Dynamo's compile-start callbacks (`torch._dynamo.reset()` empties the list), or None
    where this torch has none."""
    handler = getattr(sys.modules["torch._dynamo"], "callback_handler", None)
    callbacks = getattr(handler, "start_callbacks", None)
    return callbacks if isinstance(callbacks, list) else None


def _arm() -> bool:
    """Have dynamo call `watch_compiled()` when it starts its next compile; False where this
    torch has no compile-start callback."""
    callbacks = _start_callbacks()
    if callbacks is None:
        return False
    with _lock:
        if _on_compile_start not in callbacks:
            callbacks.append(_on_compile_start)
    return True


def _disarm() -> None:
    callbacks = _start_callbacks() if "torch._dynamo" in sys.modules else None
    if callbacks is not None and _on_compile_start in callbacks:
        callbacks.remove(_on_compile_start)


def watching() -> bool:
    """Whether programs compiled now carry the kernel hooks without a dumper."""
    return _state.get("on", False)


def stop() -> None:
    """Programs compiled from now on get no hook lines (those compiled with them keep them,
    idle); the global module hooks stay (compiled code may be guarded on them)."""
    with _lock:
        _disarm()
        if _state.pop("on", False):
            from accuracy.dumper.compiled import codegen

            codegen.uninstall()
