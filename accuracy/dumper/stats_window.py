"""Statistics and host copies of accelerator tensors, fetched once per window of ops.

Reading a figure computed on an accelerator waits for the device: one read per tensor is one
synchronisation per tensor, tens of µs of a stalled device each. Here each tensor's figures
stay on its device (`dumpfile/stats.py` gives them as a float64 [6] tensor and a checksum
tensor) until the window closes, every `WINDOW_OPS` recorded ops: then the window's figures
are stacked into one device tensor, copied to the host without blocking, and one event is
recorded after that copy. The writer thread waits for that event once per window, and on an
in-order queue every host copy of a tensor dump queued before it is done by then too, so a
tensor dump waits once per window as well.

The writer writes rows in order and waits (on a threading event) for a window still open;
the training thread closes it, so it must always be closed: at `WINDOW_OPS` ops, when the
step leaves the dumper, at close (also when the block raised), and early in a tensor dump
before the bytes it holds (device copies, and CPU tensors staged for the writer behind it)
reach a quarter of what the writer may queue or stage: the writer, waiting for this window,
would otherwise leave the training thread waiting for room in its queue or staging ring.
A window whose fetch fails says "no statistics" in its rows (nan, counts -1), never a
made-up figure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)

WINDOW_OPS = 64
_NAN = float("nan")
_NO_FIGURES = (_NAN, _NAN, _NAN, _NAN, -1, -1)


class _Fetch:
    """One device's figures of one window: stacked, copied to the host, read once."""

    __slots__ = ("_checksums", "_copy", "_done", "_floats", "_lock", "_values", "device")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._floats: list[torch.Tensor] = []
        self._checksums: list[Any] = []
        self._done = threading.Event()  # set when the window is closed (fetch queued or not)
        self._lock = threading.Lock()
        self._copy: Any = None
        self._values: list[tuple[tuple[float, ...], int]] | None = None

    def add(self, floats: torch.Tensor, checksum: Any) -> int:
        self._floats.append(floats)
        self._checksums.append(checksum)
        return len(self._floats) - 1

    def __len__(self) -> int:
        return len(self._floats)

    def close(self) -> None:
        """Queue the one copy of this window's figures (training thread)."""
        try:
            if self._floats:
                self._copy = _start_fetch(self._floats, self._checksums)
        except Exception:  # never the training's problem: the rows say "no statistics"
            log.exception("fetching a window of statistics from %s failed; its rows have "
                          "none", self.device)
            self._copy = None
        finally:
            self._floats, self._checksums = [], []
            self._done.set()

    def wait(self) -> None:
        """Block until the window closed and its copy is on the host (writer thread)."""
        self._done.wait()
        self.values()

    def values(self) -> list[tuple[tuple[float, ...], int]]:
        self._done.wait()
        with self._lock:
            if self._values is None:
                self._values = _read_fetch(self._copy, self.device)
                self._copy = None
            return self._values


def _start_fetch(floats: list[torch.Tensor], checksums: list[Any]) -> Any:
    """Stack the figures into one int64 device tensor ([n*6] float bits, then the checksums
    of 4-byte-or-smaller types, then the 8-byte ones) and start its one host copy."""
    from accuracy.device_backend import backend_for_tensor

    with torch._C._DisableTorchDispatch(), torch.no_grad():
        parts = [torch.stack(floats).view(torch.int64).reshape(-1)]
        narrow = [c for c in checksums if isinstance(c, torch.Tensor) and c.dtype != torch.int64]
        wide = [c for c in checksums if isinstance(c, torch.Tensor) and c.dtype == torch.int64]
        if narrow:
            parts.append(torch.stack(narrow).to(torch.int64))
        if wide:
            parts.append(torch.stack(wide))
        packed = torch.cat(parts) if len(parts) > 1 else parts[0]
        order = [(isinstance(c, torch.Tensor), isinstance(c, torch.Tensor)
                  and c.dtype == torch.int64) for c in checksums]
        return backend_for_tensor(packed).to_host(packed), order


def _read_fetch(fetched: Any, device: torch.device) -> list[tuple[tuple[float, ...], int]]:
    if fetched is None:
        return []
    copy, order = fetched
    try:
        host = copy.wait()
    except Exception:
        log.exception("reading a window of statistics from %s failed; its rows have none",
                      device)
        return []
    n = len(order)
    floats = host[: 6 * n].view(torch.float64).reshape(n, 6).tolist()
    sums = host[6 * n:].tolist()
    n_narrow = sum(1 for tensor, wide in order if tensor and not wide)
    narrow, wide = iter(sums[:n_narrow]), iter(sums[n_narrow:])
    out = []
    for row, (tensor, is_wide) in zip(floats, order, strict=True):
        checksum = (next(wide) if is_wide else next(narrow)) if tensor else 0
        mn, mx, mean, l2, nans, infs = row
        out.append(((mn, mx, mean, l2, int(nans), int(infs)), checksum))
    return out


class _Figures:
    """[min, max, mean, l2, nan_count, inf_count] of one tensor, once its window is read."""

    __slots__ = ("_fetch", "_i", "_got")

    def __init__(self, fetch: _Fetch, i: int) -> None:
        self._fetch: _Fetch | None = fetch
        self._i = i
        self._got: tuple[tuple[float, ...], int] | None = None

    def _row(self) -> tuple[tuple[float, ...], int]:
        """Its row, read once: then it lets go of its window (the dumper keeps figures of
        tensors it has seen for the whole run: each would keep its window's 64 ops' rows)."""
        fetch = self._fetch
        if fetch is not None:
            values = fetch.values()
            self._got = values[self._i] if self._i < len(values) else (_NO_FIGURES, 0)
            self._fetch = None
        return self._got  # type: ignore[return-value]

    def __iter__(self) -> Iterator[float]:
        return iter(self._row()[0])

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> float:
        return self._row()[0][i]


class _Checksum:
    """The tensor's bit-pattern sum once its window is read (`int(...)`)."""

    __slots__ = ("_figures",)

    def __init__(self, figures: _Figures) -> None:
        self._figures = figures

    def __int__(self) -> int:
        return int(self._figures._row()[1])

    __index__ = __int__


class _WindowCopy:
    """A tensor dump's host copy: ready once its window's fetch is (same in-order queue)."""

    __slots__ = ("_copy", "_fetch")

    def __init__(self, copy: Any, fetch: _Fetch) -> None:
        self._copy, self._fetch = copy, fetch

    def wait(self) -> torch.Tensor:
        self._fetch.wait()
        copy = self._copy
        return copy if isinstance(copy, torch.Tensor) else copy.wait()


class StatsWindow:
    """The open window of accelerator figures and copies, one fetch per device."""

    def __init__(self, max_bytes: int, ops: int = WINDOW_OPS) -> None:
        self._fetches: dict[torch.device, _Fetch] = {}
        self._ops = 0
        self._bytes = 0
        self.max_ops = ops
        self.max_bytes = max_bytes
        self.windows_closed = 0

    @staticmethod
    def wants(stats: Any) -> bool:
        """Whether `stats` (as `tensor_stats` gives them) are still on a device."""
        return isinstance(stats[0], torch.Tensor)

    def _fetch(self, device: torch.device) -> _Fetch:
        fetch = self._fetches.get(device)
        if fetch is None:
            fetch = self._fetches[device] = _Fetch(device)
        return fetch

    def figures(self, stats: tuple[torch.Tensor, Any]) -> tuple[_Figures, _Checksum]:
        """Place a tensor's device figures in the window; what the writer reads later."""
        floats, checksum = stats
        fetch = self._fetch(floats.device)
        figures = _Figures(fetch, fetch.add(floats, checksum))
        return figures, _Checksum(figures)

    def hold(self, nbytes: int) -> None:
        """Make room for `nbytes` more bytes the writer reaches behind this window (a copy,
        a staged CPU tensor): the window is closed first when they would fill it."""
        if self._fetches and (self._bytes + nbytes) * 4 >= self.max_bytes:
            self.close()
        self._bytes += nbytes

    def copy(self, t: torch.Tensor, start: Any) -> _WindowCopy:
        """A tensor dump's host copy of `t`, started by `start(t)`, read after the window."""
        self.hold(t.numel() * t.element_size())
        return _WindowCopy(start(t), self._fetch(t.device))

    def op_written(self) -> None:
        """One more op recorded: close the window at its size."""
        self._ops += 1
        if self._ops >= self.max_ops:
            self.close()

    def close(self) -> None:
        """Close the window: each device's figures fetched with one copy."""
        fetches, self._fetches = self._fetches, {}
        self._ops = self._bytes = 0
        for fetch in fetches.values():
            fetch.close()
        if fetches:
            self.windows_closed += 1
