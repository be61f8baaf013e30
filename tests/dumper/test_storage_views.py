"""Views placed over the copy of their storage's current version (dumper/storage_views.py)."""

from __future__ import annotations

import torch

from accuracy.dumper.storage_views import StoredStorages
from accuracy.dumpfile.writer import TensorEntry


def _entry(row: int, t: torch.Tensor) -> TensorEntry:
    return TensorEntry(row, 0, 0, 0, "float32", tuple(t.shape), tuple(t.stride()), "cpu", None)


def test_a_view_is_placed_over_its_storage_only_while_that_version_is_current():
    w = torch.randn(6, 4)
    stored = StoredStorages()
    src = _entry(0, w)
    stored.stored(src, w)
    assert src.holder == 0
    view = w.t()
    out = _entry(1, view)
    assert stored.place(view, out, src, w)
    assert (out.holder, out.elem_offset, out.strided, out.first) == (0, 0, True, 1)
    part = w[2:, 1]
    out = _entry(2, part)
    assert stored.place(part, out, src, w) and out.elem_offset == 2 * 4 + 1
    w.add_(1.0)  # a new version: the copy no longer holds w's bytes
    out = _entry(3, w.t())
    assert not stored.place(w.t(), out, src, w) and out.holder == -1


def test_elements_sharing_bytes_or_another_storage_are_copied():
    w = torch.randn(1, 4)
    stored = StoredStorages()
    src = _entry(0, w)
    stored.stored(src, w)
    wide = w.expand(3, 4)  # zero strides: three elements in each stored element's bytes
    assert not stored.place(wide, _entry(1, wide), src, w)
    other = torch.randn(4, 1)
    assert not stored.place(other.t(), _entry(2, other.t()), src, w)


def test_a_dense_transposed_tensor_is_stored_as_its_storage_range():
    x = torch.randn(5, 3).t()  # dense, not contiguous
    rng = StoredStorages.extent(x)
    assert rng is not None and rng.is_contiguous() and rng.numel() == x.numel()
    assert StoredStorages.extent(torch.randn(3, 5)) is None  # contiguous: copied as is
    assert StoredStorages.extent(torch.randn(4, 6)[:, ::2]) is None  # gaps: gathered


def test_a_clone_is_read_from_its_input_only_when_it_holds_the_same_bits():
    x = torch.randn(4, 6).t()  # dense, stored as its storage range
    stored = StoredStorages()
    src = _entry(0, x)
    src.strided = True
    stored.stored(src, x)
    good = x.clone()
    assert stored.copy_of(good, _entry(1, good), src, x)
    wrong = x.clone()
    wrong[0, 0] += 1.0  # a device under test computed the clone wrong: it is stored
    assert not stored.copy_of(wrong, _entry(2, wrong), src, x)
