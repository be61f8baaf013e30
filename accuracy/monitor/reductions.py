"""A step's reductions: norm, min, max and (nan, inf) counts of many tensors, read back once.

What the monitor's `Collector` (figures.py) computes its figures with: a contiguous fp32/fp64
CPU tensor takes one native pass (`accuracy.native.stats_passes`, many tensors in one call);
the others one `_foreach_norm` for all and one `aminmax` each, left on their device as 0-d
tensors until `_read_back` fetches every figure of a step in one copy per device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from accuracy import native
from accuracy.dumpfile.stats import freed
from accuracy.native import fastpath

NAN = float("nan")


Value = Any  # a 0-d tensor still on its device, or a float read already (CPU)


_FLOAT = {float}


def _read_back(floats: list[Value], ints: list[Value]) -> tuple[list[float], list[float]]:
    """0-d tensors as Python floats: stacked per device (dtypes promoted), one copy to the host
    per device; counts (ints) kept apart so they stay exact. Floats pass through."""
    if {*map(type, floats), *map(type, ints)} <= _FLOAT:
        return list(floats), list(ints)  # on CPU every figure is read already
    out_f: list[float] = [NAN] * len(floats)
    out_i: list[float] = [NAN] * len(ints)
    groups: dict[torch.device, tuple[list[int], list[int]]] = {}
    for i, t in enumerate(floats):
        if isinstance(t, float):
            out_f[i] = t
        else:
            groups.setdefault(t.device, ([], []))[0].append(i)
    for i, t in enumerate(ints):
        if isinstance(t, float):
            out_i[i] = t
        else:
            groups.setdefault(t.device, ([], []))[1].append(i)
    for fi, ii in groups.values():
        parts = []
        if fi:
            parts.append(torch.stack([floats[i] for i in fi]).to(torch.float64))
        if ii:
            parts.append(torch.stack([ints[i] for i in ii]).to(torch.float64))
        vals = (torch.cat(parts) if len(parts) > 1 else parts[0]).cpu().tolist()
        for k, i in enumerate(fi):
            out_f[i] = vals[k]
        for k, i in enumerate(ii):
            out_i[i] = vals[len(fi) + k]
    return out_f, out_i


_LOW = (torch.float16, torch.bfloat16)

def _norms(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms, of 16-bit tensors accumulated and returned in float32: a bf16 norm keeps 3
    significant digits (an output of norm 31.94 read 32.0), a figure off by up to 0.4%."""
    low = [t.dtype in _LOW for t in ts]
    if not any(low):
        return list(torch._foreach_norm(ts))
    if all(low):
        return list(torch._foreach_norm(ts, 2, dtype=torch.float32))
    return [torch._foreach_norm([t], 2, dtype=torch.float32)[0] if lo else
            torch._foreach_norm([t])[0] for t, lo in zip(ts, low, strict=True)]


def _native_ok(t: torch.Tensor) -> bool:
    """Whether the native pass reads `t` as it is: its values contiguous fp32/fp64 host memory
    (attribute reads only: this runs for every tensor of every step)."""
    return (t.is_cpu and (t.dtype is torch.float32 or t.dtype is torch.float64)
            and t.layout is torch.strided and t.is_contiguous() and not t.is_neg()
            and t.numel() > 0)


def _cpu_rows(ts: list[torch.Tensor]) -> list[tuple[float, float, float] | None]:
    """(norm, min, max) of each contiguous fp32/fp64 CPU tensor of `ts`, all in one native
    call (min, max and an fp64 sum of squares in one pass each), where a `_foreach_norm` and
    an `aminmax` take two passes and four dispatches a tensor. None (the torch path then) for
    the other tensors, where the kernels are not built, and where a value or the sum of
    squares is not finite (the torch path counts NaN/inf)."""
    out: list[tuple[float, float, float] | None] = [None] * len(ts)
    # a freed storage (FSDP's unsharded parameters) is at address 0: not measured (NaN)
    ptrs = [(i, t.data_ptr()) for i, t in enumerate(ts) if _native_ok(t)]
    idx = [i for i, p in ptrs if p]
    if not idx:
        return out
    got = native.stats_passes([(p, ts[i].numel(), ts[i].dtype is torch.float32)
                               for i, p in ptrs if p], build=False)
    if got is None:
        return out
    for i, r in zip(idx, got, strict=True):
        if r is not None and math.isfinite(r[3]):
            out[i] = (math.sqrt(r[3]), r[0], r[1])
    return out


def _norm_values(ts: list[torch.Tensor]) -> list[Value]:
    """L2 norms of `ts`: read at once through the native pass where `_cpu_rows` takes the
    tensor, the others batched in one `_foreach_norm` (0-d tensors, read back later)."""
    ext = fastpath.loaded()
    out: list[Value]
    rest: list[int]
    if ext is not None:  # the C++ module's norms; what it declines (not freed) takes torch's
        vals, rest = ext.norms(ts)
        out = vals[0::3]
    else:
        out, rest = [], []
        for i, row in enumerate(_cpu_rows(ts)):
            if row is None:
                if not freed(ts[i]):
                    rest.append(i)
                out.append(NAN)
            else:
                out.append(row[0])
    if rest:
        for i, n in zip(rest, _norms([ts[i] for i in rest]), strict=True):
            out[i] = n
    return out


class _Reductions:
    """Norm, min, max and (nan, inf) counts of a list of tensors. A contiguous fp32/fp64 CPU
    tensor takes one native pass (`_cpu_rows`); the others one `_foreach_norm` for all and one
    `aminmax` each. On an accelerator they stay 0-d tensors on their device until
    `_read_back` (the step never waits); on CPU, where reading one is a load from memory and
    the norm is read anyway to decide on the counts, they are read at once."""

    def __init__(self) -> None:
        self.floats: list[Value] = []   # norm, min, max per entry
        self.ints: list[Value] = []     # nan, inf of the entries that have counts
        self.counted: dict[int, int] = {}      # entry -> position of its nan count in ints
        self.n = 0

    def add(self, ts: list[torch.Tensor]) -> range:
        """Reduce `ts` (under _NoDispatch); returns the entries made."""
        entries = self.reserve(len(ts))
        self.fill(entries, ts)
        return entries

    def reserve(self, k: int) -> range:
        """`k` entries whose figures come later (`fill`); NaN until then."""
        first = self.n
        self.floats += (NAN, NAN, NAN) * k
        self.n += k
        return range(first, self.n)

    def fill(self, entries: Sequence[int], ts: list[torch.Tensor]) -> None:
        """The figures of `ts` into the reserved `entries`: the native pass (as `_cpu_rows`
        takes a tensor, in one loop: this runs for every output and gradient of every step)
        for all it takes in one call, the torch path for the rest."""
        ext = fastpath.loaded()
        if ext is not None:
            self._fill_ext(ext, entries, ts)
            return
        blocks: list[tuple[int, int, bool]] = []
        native_at: list[int] = []   # positions in ts of the blocks
        rest: list[int] = []        # positions in ts of the torch path's tensors
        for k, t in enumerate(ts):
            dt = t.dtype
            if (t.is_cpu and (dt is torch.float32 or dt is torch.float64)
                    and t.layout is torch.strided and t.is_contiguous() and not t.is_neg()
                    and (n := t.numel()) > 0):
                # a freed storage (FSDP's unsharded parameters) is at address 0: NaN
                if p := t.data_ptr():
                    blocks.append((p, n, dt is torch.float32))
                    native_at.append(k)
            elif not freed(t):
                rest.append(k)
        if blocks:
            got = native.stats_passes(blocks, build=False)
            if got is None:  # the kernels are not built (or not loaded yet)
                rest += native_at
            else:
                f = self.floats
                for k, r in zip(native_at, got, strict=True):
                    if r is not None and math.isfinite(r[3]):
                        e = 3 * entries[k]
                        f[e:e + 3] = (math.sqrt(r[3]), r[0], r[1])
                    else:  # a value or the sum of squares not finite: counted there
                        rest.append(k)
        if rest:  # an output as its module returned it: detached, no graph
            self._torch([ts[k].detach() for k in rest], [entries[k] for k in rest])

    def _fill_ext(self, ext: Any, entries: Sequence[int], ts: list[torch.Tensor]) -> None:
        """`fill` through the C++ module (accuracy/native/stats.cpp, `norms`): the checks, the
        passes over torch's threads and the figures of every tensor in one call, with fp16
        and bf16 too; what it declines takes the torch path."""
        vals, declined = ext.norms(ts)
        f = self.floats
        for k, e in enumerate(entries):
            f[3 * e:3 * e + 3] = vals[3 * k:3 * k + 3]
        if declined:
            self._torch([ts[k].detach() for k in declined], [entries[k] for k in declined])

    def copy(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Each `(entry, source)`: the entry takes the figures (and counts) of `source`, an
        entry of the same tensor filled already."""
        f = self.floats
        for e, src in pairs:
            f[3 * e:3 * e + 3] = f[3 * src:3 * src + 3]
            if src in self.counted:
                self.counted[e] = self.counted[src]

    def _torch(self, ts: list[torch.Tensor], entries: list[int]) -> None:
        """The torch path of `ts`, into the places of `entries`."""
        for e, t, nrm in zip(entries, ts, _norms(ts), strict=True):
            if t.device.type == "cpu":
                n = float(nrm)
                lo, hi = (float(x) for x in torch.aminmax(t)) if t.numel() else (NAN, NAN)
                self.floats[3 * e:3 * e + 3] = (n, lo, hi)
                if not math.isfinite(n):  # a finite norm proves there is no nan or inf
                    self.counted[e] = len(self.ints)
                    counts = (float(torch.isnan(t).sum()), float(torch.isinf(t).sum()))
                    self.ints += counts
                    if counts == (0.0, 0.0):  # every value finite: the squares overflowed
                        self.floats[3 * e] = _scaled_norm(t, max(abs(lo), abs(hi)))
            else:
                lo, hi = torch.aminmax(t) if t.numel() else (nrm.new_full((), NAN),) * 2
                self.floats[3 * e:3 * e + 3] = (nrm, lo, hi)
                self.counted[e] = len(self.ints)
                self.ints += (torch.isnan(t).sum(), torch.isinf(t).sum())


def _scaled_norm(t: torch.Tensor, largest: float) -> float:
    """The L2 norm of finite values whose sum of squares overflows (fp32 above about 1.8e19
    summed in fp32, as torch's norms sum it; fp64 above about 1e154): summed over the values
    divided by the largest magnitude, in double."""
    if largest == 0.0:
        return 0.0
    return largest * float(torch.linalg.vector_norm(t.double() / largest))


Row = tuple[float, float, float, float, float]


Columns = tuple[list[float], list[float], list[float], list[float], list[float]]


def _columns(red: _Reductions, f: list[float], c: list[float]) -> Columns:
    """(norm, min, max, nan, inf) columns over the entries of `red`, from its read-back floats
    and counts (slices, not a tuple per entry: this runs every step)."""
    end = 3 * red.n
    nan, inf = [0.0] * red.n, [0.0] * red.n
    for e, at in red.counted.items():
        nan[e], inf[e] = c[at], c[at + 1]
    return f[0:end:3], f[1:end:3], f[2:end:3], nan, inf


def _combine(rows: list[Row]) -> Row:
    """Several tensors (or calls) as one figure: L2 of the norms, min, max, summed counts."""
    if len(rows) == 1:
        return rows[0]
    lo, hi = [r[1] for r in rows], [r[2] for r in rows]
    return (math.sqrt(sum(r[0] * r[0] for r in rows)),
            NAN if any(math.isnan(x) for x in lo) else min(lo),  # NaN wins, as in torch
            NAN if any(math.isnan(x) for x in hi) else max(hi),
            sum(r[3] for r in rows), sum(r[4] for r in rows))
