"""Each storage version's bytes stored once: views of them become strided rows.

A tensor dump copies a tensor's bytes when it first sees its state. The views a step makes of
it (`t` and `transpose` of weights, `select`, `squeeze`, `permute` of activations) hold no
new bytes: their elements are some of the stored ones, in another order. A view op's output
whose elements lie inside the bytes stored for its input's storage (the same storage, whose
state the input's record proves current: all views of one base share its version counter)
is written as a strided row over them (schema 6, docs/dump-format.md): where its element 0
lies and its strides. The writer hashes its elements in order, so the row's content hash is
what a copy's would be. Anything else (another storage, elements sharing bytes as `expand`
makes them, a layout the bytes do not cover) is copied as before.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from accuracy.dumpfile.layout import problem as layout_problem
from accuracy.dumpfile.layout import row_major
from accuracy.dumpfile.writer import TensorEntry

_UNBOUNDED = 1 << 62
# view ops whose arguments name absolute places in memory: never replayed over another layout
_ABSOLUTE = re.compile(r"as_strided|_reshape_alias|set_|from_blob")


def over(src: TensorEntry, n: int) -> torch.Tensor:
    """A meta tensor with `src`'s shape laid out as its values lie in the `n` stored
    elements: a view op applied to it lays its output out the same way."""
    g = torch.empty(n, device="meta")
    return g.as_strided(src.shape, src.layout or src.stride, src.elem_offset)


def _version_of(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter: never placed over
        return -1


class StoredStorages:
    """Row holding a copy in storage order -> (storage pointer, its first element's storage
    offset, elements, dtype, the storage version copied): where each stored copy lies."""

    def __init__(self) -> None:
        self._holders: dict[int, tuple[int, int, int, torch.dtype, int]] = {}

    @staticmethod
    def extent(t: torch.Tensor) -> torch.Tensor | None:
        """The storage range a dense non-contiguous `t` fills (a transposed or permuted
        tensor: its elements in storage order, one plain copy), to store instead of gathering
        its elements; None for a contiguous tensor or one with gaps or shared bytes."""
        if t.is_contiguous() or t.numel() == 0:
            return None
        shape, stride = tuple(t.shape), tuple(t.stride())
        if any(s < 0 for s in stride) or layout_problem(shape, stride, 1, 0, t.numel()):
            return None
        return t.as_strided((t.numel(),), (1,), t.storage_offset())

    def stored(self, entry: TensorEntry, t: torch.Tensor) -> None:
        """`entry` copies `t`'s bytes in storage order (`t` contiguous, or its `extent`)."""
        if not (t.is_contiguous() or entry.strided):
            return
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return
        version = _version_of(t)
        if ptr and version >= 0:
            self._holders[entry.row] = (ptr, t.storage_offset(), t.numel(), t.dtype, version)
            entry.holder, entry.elem_offset = entry.row, 0

    def place(self, t: torch.Tensor, entry: TensorEntry, src: TensorEntry,
              base_tensor: torch.Tensor, view: tuple[Any, tuple, dict, int] | None = None
              ) -> bool:
        """Make `entry` (a view op's output `t`) a strided row over the bytes stored for its
        input `src` (the tensor `base_tensor`), when they are the copy of the storage's
        current version and hold all of `t`'s elements; False: copy it. `view`: the op
        (func, args, kwargs, output index), replayed on the meta device over `src`'s layout
        when `src`'s values are not where its own memory is (a clone read from its input's
        bytes): torch's own view rules then give the output's layout in the stored bytes."""
        held = self._holders.get(src.holder)
        if held is None or t.dtype != held[3] or t.numel() == 0:
            return False
        ptr, base, n, _, version = held
        if _version_of(base_tensor) != version:  # the storage was written since it was copied
            return False
        if len(src.layout or src.stride) != len(src.shape):
            return False
        if src.layout not in ((), src.stride):
            return view is not None and self._replayed(t, entry, src, base_tensor, view, n)
        try:
            if t.untyped_storage().data_ptr() != ptr:
                return False
            shape, stride, start = tuple(t.shape), tuple(t.stride()), t.storage_offset()
        except (RuntimeError, NotImplementedError):
            return False
        # inside the input's own elements (as recorded) and the stored copy, no two
        # elements in the same bytes (the reader refuses such a row)
        lo_in = base + src.elem_offset
        if not (_inside(start - lo_in, shape, stride, src.shape, src.layout or src.stride)
                and start >= base and not layout_problem(shape, stride, 1, start - base, n)):
            return False
        entry.holder, entry.elem_offset, entry.strided = src.holder, start - base, True
        entry.layout = stride
        entry.first = entry.row
        entry.nbytes = t.numel() * t.element_size()
        return True

    def _replayed(self, t: torch.Tensor, entry: TensorEntry, src: TensorEntry,
                  base_tensor: torch.Tensor, view: tuple[Any, tuple, dict, int], n: int
                  ) -> bool:
        func, args, kwargs, idx = view
        if not args or args[0] is not base_tensor or _ABSOLUTE.search(str(func)):
            return False
        try:
            with torch._C._DisableTorchDispatch():
                if t.untyped_storage().data_ptr() != base_tensor.untyped_storage().data_ptr():
                    return False  # not a view of its input's memory (a device's fresh data)
                size = base_tensor.untyped_storage().nbytes() // base_tensor.element_size()
                mine = torch.empty(size, device="meta").as_strided(
                    base_tensor.shape, base_tensor.stride(), base_tensor.storage_offset())
                real = _pick(func(mine, *args[1:], **kwargs), idx)
                # the op did what torch's view rules say: its output is that view of its input
                if real is None or (tuple(real.shape), real.stride(), real.storage_offset()) \
                        != (tuple(t.shape), t.stride(), t.storage_offset()):
                    return False
                out = _pick(func(over(src, n), *args[1:], **kwargs), idx)
        except Exception:  # noqa: BLE001 - an op the meta device lacks: copy instead
            return False
        if out is None or tuple(out.shape) != tuple(t.shape):
            return False
        stride, start = tuple(out.stride()), out.storage_offset()
        if layout_problem(tuple(out.shape), stride, 1, start, n):
            return False
        entry.holder, entry.elem_offset, entry.strided = src.holder, start, True
        entry.layout = stride
        entry.first = entry.row
        entry.nbytes = t.numel() * t.element_size()
        return True

    def reshaped(self, entry: TensorEntry, src: TensorEntry) -> None:
        """Give `entry` (a reshape of `src`'s values: its link) where those values lie in the
        stored bytes, when torch's view rules can say it (else none: later views copy)."""
        held = self._holders.get(src.holder)
        if held is None:
            return
        if src.layout in ((), src.stride):  # row-major in place: the same elements, in order
            entry.holder, entry.elem_offset, entry.layout = (src.holder, src.elem_offset,
                                                             entry.stride)
            return
        try:
            with torch._C._DisableTorchDispatch():
                out = over(src, held[2]).view(entry.shape)
        except RuntimeError:  # not a view of that layout
            return
        entry.holder, entry.elem_offset = src.holder, out.storage_offset()
        entry.layout = tuple(out.stride())

    def copy_of(self, t: torch.Tensor, entry: TensorEntry, src: TensorEntry,
                base_tensor: torch.Tensor) -> bool:
        """Make `entry` (a `clone` of `src`, the tensor `base_tensor`: `.contiguous()` of a
        transposed view, say) a strided row reading `src`'s elements where they are stored,
        when it holds their very bits (checked: on CPU only), no copy. Its recorded strides
        stay its own (replay rebuilds it so); the row reads through `src`'s layout. False:
        copy it."""
        held = self._holders.get(src.holder)
        if held is None or t.dtype != held[3] or t.numel() == 0 \
                or tuple(t.shape) != tuple(src.shape) or _version_of(base_tensor) != held[4] \
                or not _same_bits(t, base_tensor):
            return False
        entry.holder, entry.elem_offset, entry.strided = src.holder, src.elem_offset, True
        entry.layout = src.layout or src.stride
        entry.first = entry.row
        entry.nbytes = t.numel() * t.element_size()
        return True


def _inside(off: int, shape: tuple[int, ...], stride: tuple[int, ...],
            in_shape: tuple[int, ...], in_stride: tuple[int, ...]) -> bool:
    """Whether a layout starting `off` elements after the input's element 0 stays within the
    input's span (its lowest to its highest element)."""
    if off < 0 or any(s < 0 for s in stride) or any(s < 0 for s in in_stride):
        return False
    reach = off + sum((m - 1) * s for m, s in zip(shape, stride, strict=True))
    in_reach = sum((m - 1) * s for m, s in zip(in_shape, in_stride, strict=True))
    return reach <= in_reach < _UNBOUNDED


def _pick(out: Any, idx: int) -> torch.Tensor | None:
    if isinstance(out, list | tuple):
        out = out[idx] if idx < len(out) else None
    return out if isinstance(out, torch.Tensor) else None


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a clone holds its input's very bits (a device under test may compute a clone
    wrong: then it is stored). CPU only: on an accelerator the answer would sync each op."""
    bits = _BITS.get(a.element_size())
    if bits is None or a.device.type != "cpu" or b.device != a.device:
        return False
    try:
        with torch._C._DisableTorchDispatch():
            return bool(torch.equal(a.view(bits), b.view(bits)))
    except RuntimeError:
        return False


def state(entry: TensorEntry) -> tuple[Any, ...]:
    """What the recorder remembers of a stored state: its row and statistics, and where its
    bytes lie when known (a later view of it can be placed there)."""
    if entry.holder >= 0:
        return (entry.first, entry.stats, entry.holder, entry.elem_offset,
                entry.layout or entry.stride, entry.shape)
    return (entry.first, entry.stats)


def restore(entry: TensorEntry, seen: tuple[Any, ...]) -> None:
    """Fill `entry` from a remembered state (`state`)."""
    entry.first, entry.stats = seen[0], seen[1]
    if len(seen) > 2:
        holder, offset, lay, shape = seen[2:]
        if tuple(shape) != tuple(entry.shape):  # another view of the same elements (an alias)
            if not (row_major(shape, lay) and row_major(entry.shape, entry.stride)):
                return  # where its values lie is not known in its own shape
            lay = entry.stride
        entry.holder, entry.elem_offset, entry.layout = holder, offset, lay
