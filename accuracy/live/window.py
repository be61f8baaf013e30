"""The live check's window: device ops judged in batches, one wait for the device per window.

Checking a device op on the host needs its inputs and outputs there. Copied one op at a time,
each copy waits for the device to drain its queue (~3 waits per op: the device runs in step
with the host). Instead each copy is queued without waiting (`to_host`: pinned memory, an
event behind it), and the op's re-run and judgement wait in this window. The window closes
after `WINDOW_OPS` ops, once its copies hold `max_bytes`, or when the block ends: the device is
synchronised once, then the ops are re-run and judged in order.

The copies are queued before the op runs (inputs) and right after it (outputs), on the
device's queue, so they hold what the op read and wrote whatever later ops do. What waits is a
closure over those copies and the call's non-tensor arguments. Each copy in flight keeps its
device tensor alive until the window closes (a device may reuse freed memory before a queued
copy has read it): `max_bytes` bounds both the host copies and the device memory a window
keeps beyond the step's own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from accuracy.dumper.stats_window import WINDOW_OPS

log = logging.getLogger(__name__)

MAX_BYTES = 256 << 20  # host copies a window holds before it closes early


class _Hole:
    """Where a waiting call's tensor argument was (`check.fill_tensors` fills it again)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<tensor>"


HOLE = _Hole()


def to_host(t: torch.Tensor) -> Any:
    """A private host copy of `t` queued without waiting (`.wait()` gives the tensor)."""
    from accuracy.device_backend import backend_for_tensor

    return backend_for_tensor(t).to_host(t)


def on_device(tensors: list[torch.Tensor]) -> bool:
    """Whether any of `tensors` lives on an accelerator (a copy to the host would wait)."""
    return any(t.device.type not in ("cpu", "meta") for t in tensors)


class CheckWindow:
    """Checks waiting for one synchronisation: `add` a job (it judges one op and returns its
    result), `close` runs them in order and hands their results back."""

    def __init__(self, max_ops: int = WINDOW_OPS, max_bytes: int = MAX_BYTES) -> None:
        self.max_ops, self.max_bytes = max_ops, max_bytes
        self._jobs: list[Callable[[], Any]] = []
        self._bytes = 0
        self._devices: set[torch.device] = set()
        self.windows = 0  # windows closed with device copies in them

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: Callable[[], Any], nbytes: int = 0,
            devices: set[torch.device] | frozenset[torch.device] = frozenset()) -> list[Any]:
        """Queue `job`; the results of the window when this one filled it, else []."""
        self._jobs.append(job)
        self._bytes += nbytes
        self._devices |= devices
        if len(self._jobs) >= self.max_ops or self._bytes >= self.max_bytes:
            return self.close()
        return []

    def close(self) -> list[Any]:
        """Wait for the devices once, then run every job in order: their results."""
        jobs, devices = self._jobs, self._devices
        self._jobs, self._bytes, self._devices = [], 0, set()
        if not jobs:
            return []
        if devices:
            self.windows += 1
            _synchronize(devices)
        return [job() for job in jobs]


def _synchronize(devices: set[torch.device]) -> None:
    """One wait per device for everything queued (each copy's event is then done)."""
    from accuracy.device_backend import get_backend

    for device in devices:
        try:
            get_backend(device).synchronize()
        except Exception:  # noqa: BLE001 - each copy still waits for its own event
            log.debug("synchronising %s failed; the copies wait one by one", device,
                      exc_info=True)
