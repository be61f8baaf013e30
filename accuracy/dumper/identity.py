"""Values known about tensor *states*: keyed by object identity and checked against `_version`.

A tensor written in place bumps its version counter, so a cached value for an older state is
never returned. Used for the recorder's dedupe (row and statistics of a state already stored)
and the overflow watcher's probe values.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

if TYPE_CHECKING:
    from accuracy.aten import OpPlan


def storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` views the memory of `b` from the same element (strides may differ)."""
    try:
        return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                and a.storage_offset() == b.storage_offset() and a.dtype == b.dtype)
    except (RuntimeError, NotImplementedError):
        return False


def same_elements(plan: OpPlan, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> bool:
    """Whether an op's one output holds exactly its first input's elements: a view-like op
    (`aten.SAME_ELEMENTS`) whose output starts at the input's memory, same count. Memory is
    checked each time: a device or a sim fault may return fresh data from a "view"."""
    return (plan.same_elements and not plan.mutable and len(outs) == 1 and bool(ins)
            and outs[0].numel() == ins[0].numel() and same_memory(outs[0], ins[0]))


def _mem_keys(t: torch.Tensor) -> list[tuple]:
    """Keys of the elements `t` shows of its memory: its exact layout, and for a contiguous
    tensor its element count (a contiguous `[32, 64]` and `[2, 16, 64]` of the same memory
    hold the same elements in the same order)."""
    try:
        base = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, t.device)
    except (RuntimeError, NotImplementedError):
        return []
    if not base[0]:
        return []
    keys = [base + (tuple(t.shape), tuple(t.stride()))]
    if t.is_contiguous():
        keys.append(base + (t.numel(),))
    return keys


def _numel_of(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _span(offset: int, shape: Any, stride: Any) -> tuple[int, int]:
    """The lowest and highest element offsets a strided layout reaches."""
    lo = hi = offset
    for n, s in zip(shape, stride, strict=True):
        if n > 1:
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
    return lo, hi


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether a layout's elements fill one range of memory with no gap or overlap (a
    permutation of a contiguous layout)."""
    expected = 1
    for n, s in sorted(((n, s) for n, s in zip(shape, stride, strict=True) if n != 1),
                       key=lambda ns: ns[1]):
        if s != expected:
            return False
        expected *= n
    return True


class TensorStates:
    """id -> (weakref, _version, value, storage pointer or 0)."""

    def __init__(self, track_storage: bool = False, prune_at: int = 200_000) -> None:
        self._map: dict[int, tuple[weakref.ref, int, Any, int]] = {}
        # memory key (`_mem_keys`) -> (weakref, _version, value, its storage's weak reference)
        # of the last tensor put there with `memory=True`
        self._mem: dict[tuple, tuple[weakref.ref, int, Any, Any]] = {}
        self._ptr_keys: dict[int, set[tuple]] = {}  # storage pointer -> its memory keys
        self._track = track_storage  # needed by forget_aliases
        self._prune_at = prune_at

    def get(self, t: torch.Tensor) -> Any:
        """The value of `t`'s current state, or None. Tracking storage, also None when `t`'s
        memory moved since: FSDP2 frees an unsharded parameter with `storage.resize_(0)` and
        gathers it into fresh memory each step, a write no version counter of the parameter
        sees (its step-2 values were recorded again at step 3)."""
        hit = self._map.get(id(t))
        if hit is None or hit[0]() is not t:
            return None
        try:
            if t._version != hit[1]:
                return None
        except RuntimeError:  # inference tensors have no version counter
            return None
        if self._track and hit[3] != storage_ptr(t):
            return None
        return hit[2]

    def get_alias(self, t: torch.Tensor) -> Any:
        """The value of the state of another tensor object over the same elements of the
        same memory (same storage, offset and dtype, and same shape and strides, or both
        contiguous with as many elements), or None. Inductor's generated code hands buffers
        to its kernels as fresh reinterpreted views (`reinterpret_tensor(buf3, ...)`: a new
        object with its own version counter), and deletes a buffer whose memory it reuses,
        so the identity key alone never finds what the launch that wrote `buf3` stored.
        That object's version is checked while it lives; once it is gone, the memory's
        storage must be the one it wrote (a weak reference to it has not expired). Only
        what was put with `memory=True`; writers through an alias that bump no shared
        version counter must `forget_aliases`."""
        if not self._track:
            return None
        for key in _mem_keys(t):
            hit = self._mem.get(key)
            if hit is None:
                continue
            if _still_current(key, hit, t):
                return hit[2]
        return None

    def has_memory(self) -> bool:
        """Whether any write was remembered by its memory (a compiled program ran)."""
        return bool(self._mem)

    def get_view(self, t: torch.Tensor) -> Any:
        """The value of the write (put with `memory=True`) whose elements hold all of `t`'s,
        when `t` is another view of part of them (`hidden[:, 0]` of a kernel's output, a
        permuted or strided `reinterpret_tensor` of it), or None. Not the same state: `t`'s
        values are a subset, in its own order. The write must be dense (its elements fill
        one range of its memory) and still current, as for `get_alias`."""
        if not self._track or not self._mem:
            return None
        try:
            ptr = t.untyped_storage().data_ptr()
            lo, hi = _span(t.storage_offset(), t.shape, t.stride())
        except (RuntimeError, NotImplementedError):
            return None
        if not ptr or t.numel() == 0:
            return None
        for key in self._ptr_keys.get(ptr, ()):
            if len(key) != 6 or key[2] != t.dtype or key[3] != t.device:
                continue
            off, shape, stride = key[1], key[4], key[5]
            n = _numel_of(shape)
            if not (off <= lo and hi < off + n and _dense(shape, stride)):
                continue
            hit = self._mem.get(key)
            if hit is None:
                continue
            if _still_current(key, hit, t):
                return hit[2]
        return None

    def put(self, t: torch.Tensor, value: Any, version: int | None = None,
            memory: bool = False) -> None:
        """Remember `value` for `t`'s current state, or for state `version` (an `out=`
        argument, whose counter is bumped after the dispatch mode returns). `memory`: also
        for other tensor objects over the same elements (`get_alias`; what compiled code's
        launches write)."""
        try:
            entry = (weakref.ref(t), t._version if version is None else version, value,
                     storage_ptr(t) if self._track else 0)
        except (RuntimeError, TypeError):
            return
        self._map[id(t)] = entry
        if self._track and memory:
            try:
                alive = StorageWeakRef(t.untyped_storage())
            except (RuntimeError, NotImplementedError):
                alive = None
            if alive is not None:
                keys = self._ptr_keys.setdefault(entry[3], set())
                for key in _mem_keys(t):
                    self._mem[key] = (*entry[:3], alive)
                    keys.add(key)
        if len(self._map) > self._prune_at:  # drop entries of dead tensors
            self._map = {k: v for k, v in self._map.items() if v[0]() is not None}
            self._mem = {k: v for k, v in self._mem.items() if not v[3].expired()}
            live = set(self._mem)
            self._ptr_keys = {p: ks & live for p, ks in self._ptr_keys.items() if ks & live}
            self._prune_at = max(self._prune_at, 2 * len(self._map))

    def forget(self, t: torch.Tensor) -> None:
        self._map.pop(id(t), None)

    def forget_memory(self, t: torch.Tensor) -> None:
        """Forget the writes remembered by their memory (`put(memory=True)`) over `t`'s
        storage: an eager in-place op wrote there through a tensor object of its own, whose
        version counter the remembered write's object does not share."""
        ptr = storage_ptr(t)
        if ptr and self._mem:
            for key in self._ptr_keys.pop(ptr, ()):
                self._mem.pop(key, None)

    def forget_aliases(self, t: torch.Tensor) -> None:
        """Forget every tensor sharing `t`'s memory: for writers that bump no version counter
        (collectives, custom ops), views and bases of what they wrote are stale too."""
        self.forget(t)
        ptr = storage_ptr(t)
        if ptr:
            for key in [k for k, v in self._map.items() if v[3] == ptr]:
                del self._map[key]
            for key in self._ptr_keys.pop(ptr, ()):
                self._mem.pop(key, None)


def _still_current(key: tuple, hit: tuple, t: torch.Tensor) -> bool:
    """Whether a write remembered by its memory (`key` -> `hit`) still holds for `t`: its
    tensor object, while it lives, has the version it had and covers the same elements;
    once gone, the memory's storage is the one it wrote (its weak reference not expired)."""
    src = hit[0]()
    if src is t:
        return False
    if src is None:
        return not hit[3].expired()
    if key not in _mem_keys(src):
        return False
    try:
        return src._version == hit[1]
    except RuntimeError:
        return False
