"""Tensor reads for views under a memory budget.

A dump's index says how large a tensor is, but the bytes can be tiny on disk (compressed, or
never written and read back as HDF5's fill value): a 60 KB file can hold a 64M-element tensor.
Viewing it whole costs about 40 bytes per element in float64 copies and masks. So the size is
computed from the index row before anything is read: a tensor whose view fits the budget is
loaded whole (through the reader, with its checks); a larger one is streamed in windows that
fit it, and the views (histogram, downsampled values) are computed window by window, with the
same results. A blob stored in chunks larger than a quarter of the budget is refused: reading any
part of a chunk decompresses all of it.

A semaphore bounds how many views run at once, so the server's total is a few budgets.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from accuracy.dumpfile import Dump, DumpError, TensorRecord, schema
from accuracy.server.errors import ApiError, scrub

DEFAULT_VIEW_MEMORY = 256 * 1024 * 1024
DEFAULT_CONCURRENT_VIEWS = 2
WORK_BYTES_PER_ELEMENT = 64  # float64 copies, masks and indices the views make per element
MAX_VIEW_ELEMENTS = 64 * 1024 * 1024  # beyond this a view takes too long, whatever its memory


@dataclass
class ViewLimits:
    """The memory budget of one tensor view, and how many views may run at once."""

    budget_bytes: int = DEFAULT_VIEW_MEMORY
    concurrent: int = DEFAULT_CONCURRENT_VIEWS
    _slots: threading.BoundedSemaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.budget_bytes = max(16 * 1024 * 1024, int(self.budget_bytes))
        self._slots = threading.BoundedSemaphore(max(1, int(self.concurrent)))

    @property
    def window_elements(self) -> int:
        return max(1024, self.budget_bytes // 2048)

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self._slots:
            yield


class TensorSource:
    """One tensor of a dump, read whole when its view fits the budget, else in windows."""

    def __init__(self, d: Dump, t: TensorRecord, limits: ViewLimits) -> None:
        if t.offset == schema.IN_SOURCE:
            raise ApiError(409, f"{t.address}: this reference output equals the device output, "
                                "whose bytes are in the replayed dump; it is not beside this "
                                "replay (keep the two files in one folder)")
        if not t.has_data:
            raise ApiError(409, f"{t.address} has statistics only (dumped in statistics mode or "
                                "filtered); dump in tensor mode to view its values")
        try:
            self.dtype = schema.torch_dtype(t.dtype)
        except ValueError:
            raise ApiError(422, f"{t.address} has a dtype this server cannot read") from None
        self.itemsize = torch.empty(0, dtype=self.dtype).element_size()
        self.numel = math.prod(int(s) for s in t.shape) if t.shape else 1
        if any(int(s) < 0 for s in t.shape) or self.numel * self.itemsize != t.nbytes:
            raise ApiError(422, f"{t.address}: its index row is inconsistent (shape and size "
                                "disagree); the dump is damaged")
        if self.numel > MAX_VIEW_ELEMENTS:
            raise ApiError(413, f"{t.address} has {self.numel} elements; views are limited to "
                                f"{MAX_VIEW_ELEMENTS}")
        # t.dump: the file holding the bytes (a replay's row may be held by the replayed dump)
        self.d, self.t, self.limits = t.dump, t, limits
        self.whole = self.numel * WORK_BYTES_PER_ELEMENT <= limits.budget_bytes
        if not self.whole:
            self._check_layout()

    def _check_layout(self) -> None:
        if self.t.offset + self.t.nbytes > self.d.blob_len:
            raise ApiError(410, f"{self.t.address} points past the end of the data")
        chunk = self.d.chunk_bytes
        if chunk * 4 > self.limits.budget_bytes:
            raise ApiError(413, f"{self.t.address}: the file stores its data in chunks of "
                                f"{chunk} bytes, too large to read under this server's view "
                                f"memory budget of {self.limits.budget_bytes} bytes")

    def tensor(self) -> torch.Tensor:
        """The whole tensor (only when it fits the budget)."""
        assert self.whole
        try:
            return self.t.load()
        except DumpError as e:
            raise ApiError(410, scrub(str(e), self.d.path)) from None

    def pieces(self, align: int = 1) -> Iterator[tuple[int, torch.Tensor]]:
        """(first element, values) windows of the flattened tensor as float64 (|x| for
        complex). No window crosses a multiple of `align` unless it holds whole multiples."""
        if self.whole:
            yield 0, _as_f64(self.tensor())
            return
        w, n = self.limits.window_elements, self.numel
        if align <= w:
            size = (w // align) * align
            spans = ((s, min(s + size, n)) for s in range(0, n, size))
        else:  # a bucket larger than a window: windows inside one bucket at a time
            spans = ((s, min(s + w, b + align, n)) for b in range(0, n, align)
                     for s in range(b, min(b + align, n), w))
        item, base, t = self.itemsize, self.t.offset, self.t
        running = self.d.new_check(t)
        check, stored = running if running is not None else (None, 0)
        ref = t.ref() if t.byte_layout is not None else None  # a view: read via its strides
        parts = ref.n_values // max(ref.numel, 1) if ref is not None else 1
        try:
            for s, e in spans:  # the spans cover the tensor once, in order
                if ref is not None:
                    raw = self.d.read_range(ref, s * parts, e * parts).copy()
                else:
                    raw = self.d.read_bytes(base + s * item, (e - s) * item, t.address)
                if check is not None:
                    check.update(raw)
                yield s, _as_f64(torch.from_numpy(raw).view(self.dtype))
            if check is not None:  # verified like a whole read, before any figure is served
                self.d.check_checksum(t.address, check.value, stored)
        except DumpError as e:
            raise ApiError(410, scrub(str(e), self.d.path)) from None
        except (OSError, RuntimeError, ValueError, TypeError) as e:
            raise ApiError(410, f"{t.address}: damaged data ({type(e).__name__})") from None


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = t.abs()
    return t.detach().to(torch.float64).reshape(-1)


def stream_histogram(sources: list[TensorSource], bins: int) -> dict:
    """`tensorview.histogram` computed window by window (two passes: range, then counts)."""
    bins = max(1, min(int(bins), 1024))
    lo, hi = math.inf, -math.inf
    nans, infs = [0] * len(sources), [0] * len(sources)
    for i, s in enumerate(sources):
        for _, x in s.pieces():
            fin = torch.isfinite(x)
            if not bool(fin.all()):
                nans[i] += int(torch.isnan(x).sum())
                infs[i] += int(torch.isinf(x).sum())
                x = x[fin]
            if x.numel():
                a, b = torch.aminmax(x)
                lo, hi = min(lo, float(a)), max(hi, float(b))
    if lo > hi:
        lo, hi = 0.0, 1.0
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts = []
    for s in sources:
        acc = torch.zeros(bins, dtype=torch.int64)
        for _, x in s.pieces():
            fin = torch.isfinite(x)
            if not bool(fin.all()):
                x = x[fin]
            if x.numel():
                acc += torch.histc(x, bins=bins, min=lo, max=hi).to(torch.int64)
        counts.append(acc.tolist())
    return {"edges": torch.linspace(lo, hi, bins + 1, dtype=torch.float64).tolist(),
            "counts": counts, "nan": nans, "inf": infs, "numel": [s.numel for s in sources]}


def stream_downsample(s: TensorSource, max_points: int) -> dict:
    """`tensorview.downsample` computed window by window: per-bucket min, max and mean of the
    finite values, windows aligned on bucket boundaries."""
    n = s.numel
    max_points = max(1, min(int(max_points), 100_000))
    if n == 0:
        return {"numel": 0, "bucket": 1, "index": [], "min": [], "max": [], "mean": []}
    step = max(1, math.ceil(n / max_points))
    m = math.ceil(n / step)
    big = torch.finfo(torch.float64).max
    mins = torch.full((m,), big, dtype=torch.float64)
    maxs = torch.full((m,), -big, dtype=torch.float64)
    sums = torch.zeros(m, dtype=torch.float64)
    cnt = torch.zeros(m, dtype=torch.int64)
    per_bucket = not s.whole and step > s.limits.window_elements
    for start, x in s.pieces(align=step):
        b0 = start // step
        if not per_bucket:  # whole buckets (the tensor's last one may be short)
            k = math.ceil(x.numel() / step)
            if x.numel() != k * step:
                x = torch.cat([x, torch.full((k * step - x.numel(),), torch.nan,
                                             dtype=torch.float64)])
            x = x.view(k, step)
        else:  # part of one bucket
            k = 1
            x = x.view(1, -1)
        valid = torch.isfinite(x)
        if bool(valid.all()):
            lo, hi = torch.aminmax(x, dim=1)
            sm, c = x.sum(dim=1), torch.full((k,), x.shape[1], dtype=torch.int64)
        else:
            lo = torch.where(valid, x, big).amin(dim=1)
            hi = torch.where(valid, x, -big).amax(dim=1)
            sm, c = torch.where(valid, x, 0.0).sum(dim=1), valid.sum(dim=1)
        sl = slice(b0, b0 + k)
        mins[sl] = torch.minimum(mins[sl], lo)
        maxs[sl] = torch.maximum(maxs[sl], hi)
        sums[sl] += sm
        cnt[sl] += c
    empty = (cnt == 0).tolist()
    means = sums / cnt.clamp(min=1)

    def col(v: torch.Tensor) -> list[float | None]:
        return [None if e else float(a) for a, e in zip(v.tolist(), empty, strict=True)]

    return {"numel": n, "bucket": step, "index": [i * step for i in range(m)],
            "min": col(mins), "max": col(maxs), "mean": col(means)}


def histogram_of(sources: list[TensorSource], bins: int) -> dict:
    """Histograms over shared edges, whole or streamed, one budgeted view at a time."""
    from accuracy.server import tensorview

    with sources[0].limits.slot():
        if all(s.whole for s in sources):
            return tensorview.histogram([s.tensor() for s in sources], bins)
        return stream_histogram(sources, bins)


def downsample_of(source: TensorSource, max_points: int) -> dict:
    from accuracy.server import tensorview

    with source.limits.slot():
        if source.whole:
            return tensorview.downsample(source.tensor(), max_points)
        return stream_downsample(source, max_points)


def heatmap_of(my: TensorSource, golden: TensorSource, max_cells: int) -> dict:
    """The error heat map needs both tensors whole: refused beyond the budget."""
    from accuracy.server import tensorview

    if not (my.whole and golden.whole):
        raise ApiError(413, "these tensors are too large for a heat map under this server's view "
                            f"memory budget of {my.limits.budget_bytes} bytes (its operator "
                            "can raise --view-memory-mb); the histograms still work")
    with my.limits.slot():
        try:
            return tensorview.error_heatmap(my.tensor(), golden.tensor(), max_cells)
        except ValueError as e:
            raise ApiError(409, str(e)) from None
