"""Warm host memory that tensor-mode copies pass through on their way to the disk.

A private copy into freshly allocated memory costs the training thread about five times a
copy into memory already touched (each new page is faulted in and zeroed by the kernel first:
measured 1.1 against 4.7 GB per CPU second). So CPU tensors are copied once into a ring of
memory that is reused: the copy is the only work the training thread does for the bytes; the
writer thread hashes and writes them from the ring and frees the slot.

The ring is one preallocated byte buffer used first-in first-out. A copy that does not fit waits
while slots already handed to the writer are still being written (that is the back-pressure),
and falls back to a private copy when waiting cannot help (the writer has stopped, or the ring
holds only this op's own unsubmitted copies). One idle ring is kept for the next dump of the
process, so its pages stay warm; `release_idle()` frees it.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import torch

_ALIGN = 64  # slot starts: any dtype can view the bytes, cache-line aligned
RING_BYTES = 256 << 20  # most a ring holds (never more than the writer's pending budget)

_idle: list[StagingRing] = []
_idle_lock = threading.Lock()


class _Slot:
    __slots__ = ("start", "end", "freed", "submitted")

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end
        self.freed = False
        self.submitted = False  # handed to the writer thread: it will free it


class StagedCopy:
    """A tensor's bytes in a ring slot (the writer's `HostData`); the slot is freed when this
    object goes away."""

    __slots__ = ("_ring", "_slot", "_view")

    def __init__(self, ring: StagingRing, slot: _Slot, view: torch.Tensor) -> None:
        self._ring, self._slot, self._view = ring, slot, view

    def wait(self) -> torch.Tensor:
        return self._view

    def submit(self) -> None:
        self._ring.mark_submitted(self._slot)

    def __del__(self) -> None:
        self._ring.free(self._slot)


class StagingRing:
    """First-in first-out slots in one reusable byte buffer (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf: torch.Tensor | None = None  # allocated (not touched) on first use
        # reentrant: a StagedCopy may be freed by the garbage collector inside `stage`
        self._cond = threading.Condition(threading.RLock())
        self._slots: collections.deque[_Slot] = collections.deque()
        self._head = 0

    def stage(self, t: torch.Tensor, can_wait: Callable[[], bool]) -> StagedCopy | None:
        """Copy CPU tensor `t` into a slot; None when it cannot (too big, ring stuck)."""
        n = t.numel() * t.element_size()
        if n == 0 or n > self.capacity:
            return None
        with self._cond:
            while (start := self._fit(n)) is None:
                if not any(s.submitted and not s.freed for s in self._slots) or not can_wait():
                    return None
                self._cond.wait(0.5)
            slot = _Slot(start, start + n)
            self._slots.append(slot)
            self._head = -(-slot.end // _ALIGN) * _ALIGN
            if self._buf is None:
                self._buf = torch.empty(self.capacity, dtype=torch.uint8)
            buf = self._buf
        try:
            with torch._C._DisableTorchDispatch(), torch.no_grad():
                view = buf[start:start + n].view(t.dtype).view(t.shape)
                view.copy_(t)
        except Exception:  # an exotic layout or dtype: the caller makes a private copy
            self.free(slot)
            return None
        return StagedCopy(self, slot, view)

    def _fit(self, n: int) -> int | None:
        """Start of a free run of `n` bytes after the newest slot, or None."""
        slots = self._slots
        while slots and slots[0].freed:
            slots.popleft()
        if not slots:
            self._head = 0
            return 0
        head, tail = self._head, slots[0].start
        if slots[-1].start >= tail:  # not wrapped: free space after head, then before tail
            if head + n <= self.capacity:
                return head
            return 0 if n <= tail else None
        return head if head + n <= tail else None

    def mark_submitted(self, slot: _Slot) -> None:
        with self._cond:
            slot.submitted = True

    def free(self, slot: _Slot) -> None:
        with self._cond:
            slot.freed = True
            self._cond.notify_all()

    def busy(self) -> bool:
        with self._cond:
            return any(not s.freed for s in self._slots)


def acquire(budget: int) -> StagingRing:
    """A ring for one writer: the idle one when it fits the budget, else a new one."""
    capacity = max(0, min(RING_BYTES, budget))
    with _idle_lock:
        for i, ring in enumerate(_idle):
            if ring.capacity == capacity and not ring.busy():
                return _idle.pop(i)
    return StagingRing(capacity)


def give_back(ring: StagingRing) -> None:
    """Keep `ring` (its pages warm) for the next writer of this process; one is kept."""
    if ring.busy():
        return
    with _idle_lock:
        _idle[:] = [ring]


def release_idle() -> None:
    """Free the idle ring's memory."""
    with _idle_lock:
        _idle.clear()
