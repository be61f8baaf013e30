"""Tensors read from the dump, kept across ops: each stored tensor is read once.

A dump stores each tensor's bytes once (`TensorRecord.first` is the row holding them), and a
step reuses most tensors: an op's output is the next op's input, weights are read forward and
backward. The cache keeps, per `first`, the decoded tensor, its copy with the recorded strides
restored, and its upcast copy, in one LRU bounded by bytes.

Cached tensors are shared between ops: they must never be written to. The engine gives mutable
ops (in-place, `out=`, registered references) private copies.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from accuracy.dumpfile.reader import TensorRecord
from accuracy.lru import BoundedLRU

_DEFAULT_BYTES = 1 << 30


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

    def _get(self, key: Any) -> torch.Tensor | None:
        t = self._items.get(key)
        if t is None:
            self.misses += 1
            return None
        self.hits += 1
        return t

    def _put(self, key: Any, t: torch.Tensor) -> torch.Tensor:
        return self._items.put(key, t)

    def load(self, t: TensorRecord) -> torch.Tensor:
        """The recorded tensor (contiguous, CPU), read from the file at most once per `first`."""
        key = ("raw", t.first, t.dtype, t.shape)
        hit = self._get(key)
        if hit is not None:
            return hit
        return self._put(key, t.dump.read_tensor_mapped(t))

    def input(self, t: TensorRecord, device: torch.device) -> torch.Tensor:
        """A recorded input on `device`, with its recorded strides where they are plain."""
        from accuracy.replay.rebuild import restore_strides

        stride = tuple(t.stride)
        key = ("in", t.first, t.dtype, t.shape, stride, str(device))
        hit = self._get(key)
        if hit is not None:
            return hit
        value = self.load(t)
        out = restore_strides(value, t, device)
        return out if out is value else self._put(key, out)

    def upcast(self, t: TensorRecord, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`value` (the cached input of `t`) converted to `dtype`, strides kept."""
        if value.dtype == dtype:
            return value
        key = ("up", t.first, t.dtype, t.shape, tuple(value.stride()), str(value.device), dtype)
        hit = self._get(key)
        if hit is not None:
            return hit
        return self._put(key, value.to(dtype))
