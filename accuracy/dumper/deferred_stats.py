"""Statistics of large CPU tensors computed on a helper thread, off the training thread.

With a spare core (torch using fewer threads than the machine has), the four reductions of a
large fp32/fp64 tensor (accuracy/dumpfile/stats.py) are most of the statistics dump's cost on
the training thread. torch and numpy release the GIL while they reduce, so a helper thread can
run them beside the next ops. The tensor must not change before its job runs: the recorder
waits for every pending job (`drain`) before any op that may write memory (a mutable or
non-ATen op, a collective) and before the dump leaves the step; ops that only read and
allocate cannot touch the pending tensors, which the jobs keep alive.

A job hands back placeholders the writer thread reads as it writes the row: the floats unpack
and the checksum converts with `int()`, each waiting for the job. A failed job stores "no
statistics" (nan_count -1), never a made-up figure.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from accuracy.dumpfile.stats import cpu_float_stats, takes_large_cpu_path

log = logging.getLogger(__name__)

_NAN = float("nan")
_NO_STATS = ((_NAN, _NAN, _NAN, _NAN, -1, -1), 0)


class _Job:
    __slots__ = ("done", "result", "x")

    def __init__(self, x: torch.Tensor) -> None:
        self.x: torch.Tensor | None = x
        self.result: Any = None
        self.done = threading.Event()

    def wait(self) -> Any:
        self.done.wait()
        return self.result


class _Floats:
    """[min, max, mean, l2, nan_count, inf_count] once the job is done."""

    __slots__ = ("_job",)

    def __init__(self, job: _Job) -> None:
        self._job = job

    def __iter__(self) -> Iterator[float]:
        return iter(self._job.wait()[0])

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> float:
        return self._job.wait()[0][i]


class _Checksum:
    """The bit-pattern sum once the job is done (`int(...)`)."""

    __slots__ = ("_job",)

    def __init__(self, job: _Job) -> None:
        self._job = job

    def __int__(self) -> int:
        return int(self._job.wait()[1])

    __index__ = __int__


class DeferredStats:
    """A helper thread computing `cpu_float_stats`, at most `max_pending` jobs ahead."""

    def __init__(self, max_pending: int = 64) -> None:
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pending: deque[_Job] = deque()
        self._room = threading.BoundedSemaphore(max_pending)
        self._thread = threading.Thread(target=self._run, name="accuracy-stats", daemon=True)
        self._thread.start()

    @staticmethod
    def wants(t: torch.Tensor) -> bool:
        """Whether `t` (detached, dense) goes to the helper thread."""
        return takes_large_cpu_path(t)

    def submit(self, t: torch.Tensor) -> tuple[_Floats, _Checksum]:
        """Queue `t`'s statistics (the caller keeps `t` unwritten until `drain`)."""
        pending = self._pending
        while pending and pending[0].done.is_set():
            pending.popleft()
        self._room.acquire()  # back-pressure: never more than max_pending tensors held
        job = _Job(t)
        pending.append(job)
        self._q.put(job)
        return _Floats(job), _Checksum(job)

    def drain(self) -> None:
        """Wait until every queued job is done (before memory may be written)."""
        pending = self._pending
        while pending:
            pending.popleft().done.wait()

    def close(self) -> None:
        self.drain()
        self._q.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                with torch._C._DisableTorchDispatch():
                    job.result = cpu_float_stats(job.x)
            except Exception:  # never the training's problem: the row says "no statistics"
                log.exception("statistics of a tensor failed; its row has none")
                job.result = _NO_STATS
            finally:
                job.x = None
                job.done.set()
                self._room.release()
