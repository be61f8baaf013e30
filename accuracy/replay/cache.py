"""Tensors read from the dump, kept across ops: each stored tensor is read once.

A dump stores each tensor's bytes once (`TensorRecord.first` is the row holding them), and a
step reuses most tensors: an op's output is the next op's input (a view's output often *is*
its input's bytes), weights are read forward and backward. The cache keeps, per stored byte
range, the decoded tensor (reshaped for each use), its copy with the recorded strides
restored, and its upcast copy, in one LRU bounded by bytes.

`prefetch` reads (maps and checks against the stored checksum) the tensors of the next ops
on a background thread while the current op runs: numpy's checksum and torch's kernels both
release the GIL, so a replay uses a second core.

Cached tensors are shared between ops: they must never be written to. The engine gives mutable
ops (in-place, `out=`, registered references) private copies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

import torch

from accuracy.dumpfile import OpRecord, TensorRecord, schema
from accuracy.dumpfile.checksum import NO_HASH
from accuracy.lru import BoundedLRU

_DEFAULT_BYTES = 1 << 30
_AHEAD_OPS, _AHEAD_BYTES = 8, 64 << 20  # how far the reader runs ahead of the replay
_AHEAD_KEEP, _AHEAD_KEEP_BYTES = 256, 256 << 20  # prefetched reads waiting to be used


def _budget() -> int:
    try:
        return int(os.environ.get("ACCURACY_REPLAY_CACHE_MB", "")) << 20
    except ValueError:
        return _DEFAULT_BYTES


class TensorCache:
    """A bounded LRU of tensors keyed by (first row, variant); `max_bytes=0` disables it."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = _budget() if max_bytes is None else max_bytes
        self._items: BoundedLRU[Any, torch.Tensor] = BoundedLRU(
            max_cost=self.max_bytes, cost=lambda t: t.untyped_storage().nbytes())
        self.hits = self.misses = 0
        self._ahead: dict[Any, Future[torch.Tensor]] = {}  # in submission order
        self._ahead_bytes: dict[Any, int] = {}
        self._ahead_total = 0
        self._reader: ThreadPoolExecutor | None = None

    def _get(self, key: Any) -> torch.Tensor | None:
        t = self._items.get(key)
        if t is None:
            self.misses += 1
            return None
        self.hits += 1
        return t

    def _put(self, key: Any, t: torch.Tensor) -> torch.Tensor:
        return self._items.put(key, t)

    @staticmethod
    def _raw_key(t: TensorRecord) -> Any:
        # the stored bytes and what they are checked against: uses of one byte range with
        # other shapes share the read; one claiming another checksum is read (and refused);
        # a view read through its strides (schema 6) is its own values
        return ("raw", id(t.dump), t.offset, t.nbytes, t.dtype, t.stats.get("checksum"),
                t.byte_layout)

    def load(self, t: TensorRecord) -> torch.Tensor:
        """The recorded tensor (contiguous, CPU), read from the file at most once per byte
        range (`first`), whatever shape each use gives it."""
        key = self._raw_key(t)
        hit = self._get(key)
        if hit is None:
            value = self._prefetched(key)
            if value is None:
                value = t.dump.read_tensor_mapped(t)
            hit = self._put(key, value.reshape(-1))
        return hit.view(t.shape) if tuple(hit.shape) != tuple(t.shape) else hit

    def holds(self, t: TensorRecord) -> bool:
        """Whether `t`'s stored bytes are in the cache (a cheap `load`)."""
        return self.max_bytes > 0 and self._raw_key(t) in self._items

    def adopt(self, t: TensorRecord, value: torch.Tensor) -> None:
        """Serve later reads of `t`'s stored bytes with `value`, a contiguous CPU tensor
        proven to hold them (its content hash is the stored one): read from memory, not the
        file. Must never be written to afterwards, like every cached tensor."""
        if self.max_bytes > 0 and t.has_data:
            key = self._raw_key(t)
            if key not in self._items:
                self._put(key, value.reshape(-1))

    def _prefetched(self, key: Any) -> torch.Tensor | None:
        """What the reader thread made for `key`, or None (never asked for, or dropped).

        A failed read raises here what reading it now would (a damaged tensor...)."""
        pending = self._ahead.pop(key, None)
        if pending is None:
            return None
        self._ahead_total -= self._ahead_bytes.pop(key, 0)
        try:
            return pending.result()
        except CancelledError:  # dropped unread (or the read it needed was)
            return None

    def _submit(self, key: Any, nbytes: int, fn: Any, *args: Any) -> None:
        assert self._reader is not None
        self._ahead[key] = self._reader.submit(fn, *args)
        self._ahead_bytes[key] = nbytes
        self._ahead_total += nbytes

    def prefetch(self, records: Iterable[TensorRecord], device: torch.device | None = None,
                 skip: Callable[[Any], bool] | None = None) -> None:
        """Start reading these tensors on the reader thread, unless cached or underway, and
        for inputs whose recorded strides `input` restores, that copy on `device` too.
        `skip(key)`: True for keys (`_raw_key`) not to read ahead (the replay expects to
        adopt them).

        Bounded by the caller (a few ops ahead); outside `read_ahead` it does nothing.
        """
        if self._reader is None or self.max_bytes <= 0:
            return
        for t in records:
            if not t.has_data or t.nbytes > self.max_bytes:
                continue
            key = self._raw_key(t)
            if skip is not None and skip(key) and key not in self._items:
                continue
            raw: Any = self._items.get(key)
            if raw is None:
                raw = self._ahead.get(key)
                if raw is None:
                    self._submit(key, t.nbytes, t.dump.read_tensor_mapped, t)
                    raw = self._ahead[key]
            if device is None or t.io != schema.INPUT or not _restored_copy(t):
                continue
            in_key = ("in", key, t.shape, tuple(t.stride), str(device))
            if in_key not in self._ahead and in_key not in self._items:
                self._submit(in_key, t.nbytes, _restore, raw, t, device)
        # reads nobody took (ops skipped before reading their tensors) are dropped, oldest
        # first, so they never hold more than a few ops' worth of memory
        while self._ahead and (len(self._ahead) > _AHEAD_KEEP or self._ahead_total > min(
                self.max_bytes, _AHEAD_KEEP_BYTES)):
            key = next(iter(self._ahead))
            self._ahead.pop(key).cancel()
            self._ahead_total -= self._ahead_bytes.pop(key)

    def read_ahead(self, recs: Sequence[OpRecord], device: torch.device | None = None,
                   ops: int = _AHEAD_OPS, nbytes: int = _AHEAD_BYTES,
                   refused: Callable[[OpRecord], bool] = lambda rec: True
                   ) -> Iterator[OpRecord]:
        """`recs`, in order, while a reader thread fetches the stored tensors of the next
        `ops` ops (at most `nbytes` of them beyond the current op), inputs with their
        strides restored on `device`. `refused(rec)`: whether the replay refuses `rec` for
        sure (`ops.refused_for_sure`); the outputs of ops it re-runs are not read ahead,
        their hashes may prove them. By default every op's bytes are read ahead."""
        if self._reader is not None:  # already reading ahead for an enclosing loop
            yield from recs
            return
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="accuracy-replay-read")
        sizes: dict[int, int] = {}
        ahead = nxt = 0
        made = _hashed_outputs(recs, refused)
        try:
            for i, rec in enumerate(recs):
                while nxt < len(recs) and nxt <= i + ops:
                    tensors = [t for t in recs[nxt].tensors if t.has_data]
                    size = sum(t.nbytes for t in tensors)
                    if nxt > i and ahead and ahead + size > nbytes:
                        break
                    # bytes an op of this replay makes (hashed) are not read ahead: its
                    # reference's bytes are checked against the hash and, equal, adopted
                    self.prefetch(tensors, device,
                                  lambda k, at=nxt: made.get(k, at + 1) <= at)
                    sizes[nxt] = size
                    ahead += size
                    nxt += 1
                ahead -= sizes.pop(i, 0)
                yield rec
        finally:
            reader, self._reader = self._reader, None
            for f in self._ahead.values():
                f.cancel()
            reader.shutdown(wait=True)
            self._ahead.clear()
            self._ahead_bytes.clear()
            self._ahead_total = 0

    def input(self, t: TensorRecord, device: torch.device) -> torch.Tensor:
        """A recorded input on `device`, with its recorded strides where they are plain."""
        from accuracy.replay.rebuild import restore_strides

        stride = tuple(t.stride)
        key = ("in", self._raw_key(t), t.shape, stride, str(device))
        hit = self._get(key)
        if hit is not None:
            return hit
        made = self._prefetched(key)
        if made is not None:
            return self._put(key, made)
        value = self.load(t)
        out = restore_strides(value, t, device)
        return out if out is value else self._put(key, out)

    def upcast(self, t: TensorRecord, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`value` (the cached input of `t`) converted to `dtype`, strides kept."""
        if value.dtype == dtype:
            return value
        key = ("up", self._raw_key(t), t.shape, tuple(value.stride()), str(value.device), dtype)
        hit = self._get(key)
        if hit is not None:
            return hit
        return self._put(key, value.to(dtype))


def _hashed_outputs(recs: Sequence[OpRecord],
                    refused: Callable[[OpRecord], bool]) -> dict[Any, int]:
    """Stored bytes first made by an op of `recs` as an output that has a content hash
    (`_raw_key` -> that op's position), not seen as an input before it. Ops whose replay is
    refused for sure (random draws, compiled kernels...) and workspace outputs (never
    compared) make nothing here: theirs are read ahead like any input. An rng-tagged op
    that is re-run (attention with dropout_p=0) does make its outputs."""
    from accuracy.aten import workspace_outputs

    seen: set[Any] = set()
    made: dict[Any, int] = {}
    for i, rec in enumerate(recs):
        for t in rec.inputs:
            if t.has_data:
                seen.add(TensorCache._raw_key(t))
        if refused(rec):
            continue
        scratch = workspace_outputs(rec.op)
        for t in rec.outputs:
            key = TensorCache._raw_key(t)
            if t.has_data and t.content_hash != NO_HASH and key not in seen \
                    and t.idx not in scratch:
                made.setdefault(key, i)
    return made


def _restored_copy(t: TensorRecord) -> bool:
    """Whether `input` gives `t` a strided copy (recorded strides, plain, not contiguous)."""
    from accuracy.replay.rebuild import _non_overlapping

    stride, shape = tuple(t.stride), tuple(t.shape)
    if not stride or len(stride) != len(shape):
        return False
    expected, acc = [], 1
    for n in reversed(shape):
        expected.append(acc)
        acc *= n
    return stride != tuple(reversed(expected)) and _non_overlapping(shape, stride)


def _restore(raw: torch.Tensor | Future[torch.Tensor], t: TensorRecord,
             device: torch.device) -> torch.Tensor:
    """On the reader thread: `t` with its recorded strides, from its read (done or queued
    before this job on the same single thread)."""
    from accuracy.replay.rebuild import restore_strides

    value = raw.result() if isinstance(raw, Future) else raw
    return restore_strides(value.reshape(-1).view(t.shape), t, device)
