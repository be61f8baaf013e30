"""Our background threads yield the CPU to the training step's own threads.

A dump's writer thread hashes, writes and builds rows while the step runs. With torch's
intra-op threads on every core, each time it runs it takes a core from one of them inside a
parallel region, and the whole region waits for that thread. At the lowest priority it runs on
what the step leaves idle (its Python between ops, its waits) and, when the step waits for it
(the pending-bytes bound, the dump's close), on every core. Measured on the bench step, 2
threads on 2 cores: tensor dump 4.48x -> 3.90x the bare step, statistics dump 1.62x -> 1.56x
(benchmarks/HISTORY.md, 2026-11-30).

Linux only: there each thread has its own nice value (`setpriority` on its thread id);
elsewhere the call would renice the whole process, or another one, so nothing is done.
`ACCURACY_BACKGROUND_NICE` sets the value (default 19, the lowest priority; 0 leaves our
threads as they are).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

LOWEST = 19


def _wanted() -> int:
    text = os.environ.get("ACCURACY_BACKGROUND_NICE", "")
    if not text:
        return LOWEST
    try:
        return max(0, min(LOWEST, int(text)))
    except ValueError:
        log.warning("ACCURACY_BACKGROUND_NICE=%r is not a number from 0 to 19: %d is used",
                    text, LOWEST)
        return LOWEST


def lower_this_thread() -> bool:
    """Lower the calling thread's CPU priority (never raise it); True where it was set. Never
    the main thread: its nice value is the training step's own."""
    nice = _wanted()
    if nice == 0 or sys.platform != "linux":
        return False
    if threading.current_thread() is threading.main_thread():
        return False
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as e:  # a sandbox without the call: the thread keeps its priority
        log.debug("cannot lower the priority of thread %s: %s",
                  threading.current_thread().name, e)
        return False
    return True
