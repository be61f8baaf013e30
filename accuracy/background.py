"""Our background threads may yield the CPU to the training step's own threads (opt-in).

A dump's writer thread hashes, writes and builds rows while the step runs. With torch's
intra-op threads on every core, each time it runs it takes a core from one of them inside a
parallel region, and the whole region waits for that thread. At a lower priority it runs on
what the step leaves idle. Measured on the bench step, 2 threads on 2 cores, nice 19: tensor
dump 4.48x -> 3.90x the bare step, statistics dump 1.62x -> 1.56x (benchmarks/HISTORY.md,
2026-11-30). Not the default: on a machine other busy processes share (a data loader's workers,
other jobs), a writer at nice 19 gets a sliver of a core, and a tensor dump's step then waits
for it (the pending-bytes bound), for as long as those processes run; and an unprivileged
thread cannot take its priority back.

`ACCURACY_BACKGROUND_NICE=N` (1 to 19) asks for it. Linux only: there each thread has its own
nice value (`setpriority` on its thread id); elsewhere the call would renice the whole process,
or another one, so nothing is done.
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
        return 0
    try:
        return max(0, min(LOWEST, int(text)))
    except ValueError:
        log.warning("ACCURACY_BACKGROUND_NICE=%r is not a number from 0 to 19: our threads "
                    "keep their priority", text)
        return 0


def lower_this_thread() -> bool:
    """Lower the calling thread's CPU priority to `ACCURACY_BACKGROUND_NICE` (never raise
    it); True where it was set. Never the main thread: its nice value is the training step's
    own."""
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
