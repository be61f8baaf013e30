"""Rows still waiting in memory reach the file when the process is told to stop (SIGTERM).

The monitor writes its rows in batches (series.py), so a process that dies loses the rows not
yet written. At a normal exit or an exception the writers are closed by their finalizers; a
SIGTERM (a scheduler's preemption, `kill`, torchrun stopping its workers) runs no finalizer, so
the first monitor made on the main thread puts a handler in front of the one in force: it
writes every live writer's waiting rows, then hands the signal on (to the earlier Python
handler, or, where there was none, to the default action: the process still dies of SIGTERM,
with its exit status). A handler that C code installed (not visible from Python) is left
alone. A SIGTERM that arrives while a writer is in the middle of writing is handed on when
that write ends, so the file never holds half a batch. kill -9 runs nothing: it loses the
rows waiting then (docs/monitor.md says how many at most).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from typing import Any

log = logging.getLogger(__name__)

_writers: weakref.WeakSet[Any] = weakref.WeakSet()
_previous: Any = None
_installed = False
_deferred: tuple[int, Any] | None = None  # a SIGTERM that came in mid-write


def register(writer: Any) -> None:
    """Write `writer`'s waiting rows (its `flush()`) on SIGTERM; `writer.writing` says when
    it is in the middle of a write."""
    _writers.add(writer)
    _install()


def _install() -> None:
    global _installed, _previous
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGTERM)
        if prev is None:  # installed from C: not ours to wrap
            return
        signal.signal(signal.SIGTERM, _on_term)
    except (ValueError, OSError) as e:  # no signals here (an embedded interpreter)
        log.debug("monitor: no SIGTERM handler: %s", e)
        return
    _previous, _installed = prev, True


def _on_term(signum: int, frame: Any) -> None:
    global _deferred
    if any(getattr(w, "writing", False) for w in list(_writers)):
        _deferred = (signum, frame)  # handed on by `write_ended` once that write is done
        return
    _flush_all()
    _hand_on(signum, frame)


def write_ended() -> None:
    """Called by a writer after each write: hands on a SIGTERM that arrived during it."""
    global _deferred
    if _deferred is None:
        return
    signum, frame = _deferred
    _deferred = None
    _flush_all()
    _hand_on(signum, frame)


def _flush_all() -> None:
    for w in list(_writers):
        try:
            w.flush()
        except Exception:  # noqa: BLE001 - the others are still written
            log.exception("monitor: writing the waiting rows on SIGTERM failed")


def _hand_on(signum: int, frame: Any) -> None:
    prev = _previous
    if callable(prev):
        prev(signum, frame)
    elif prev == signal.SIG_IGN:
        return
    else:  # the default action: die of the signal, as without us
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
