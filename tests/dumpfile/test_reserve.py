"""Disk space held ahead of HDF5's writes: a disk another program fills never breaks a dump.

A flush that meets ENOSPC half-way would leave index entries past the end-of-allocation the
superblock records, and the dump's committed rows would read as "actual len exceeds EOA". Here
the disk's answers are simulated, so every ordering is tried on any file system
(tests/scenarios/test_crafted_dump_files.py fills a real tmpfs).
"""

import errno
import logging
import os

import pytest

from accuracy import dumper, load_dump
from accuracy.dumpfile import reserve, writer
from accuracy.examples import lm_batch, lm_step, tiny_lm


def _held_past_end(path) -> int:
    st = os.stat(path)
    return st.st_blocks * 512 - st.st_size


@pytest.fixture
def holds_space(tmp_path):
    f = tmp_path / "probe"
    fd = os.open(f, os.O_RDWR | os.O_CREAT)
    try:
        probe = reserve.SpaceReserve(fd)
        probe.renew(1 << 20)
        if not probe.supported:
            pytest.skip("this file system cannot hold blocks past a file's end (fallocate)")
    finally:
        os.close(fd)


def _disk_filled_after_first_commit():
    """SpaceReserve.renew failing with ENOSPC once the first commit's space was held (the
    disk fills up during the run)."""
    real, commits = reserve.SpaceReserve.renew, []

    def renew(res, nbytes):
        if commits:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if nbytes == writer._CLOSE_ROOM:
            commits.append(nbytes)
        return real(res, nbytes)
    return renew


def _dump_under(monkeypatch, tmp_path, renew, **kw):
    monkeypatch.setattr(reserve.SpaceReserve, "renew", renew)
    path = tmp_path / "run.h5"
    model, batch = tiny_lm(), lm_batch()
    with dumper(dump_path=path, flush_ops=64, **kw):
        loss = lm_step(model, batch)
    assert loss.isfinite()  # the step ran to the end
    return path


def test_a_disk_that_gives_no_more_space_stops_recording_with_a_readable_dump(
        tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.ERROR):
        path = _dump_under(monkeypatch, tmp_path, _disk_filled_after_first_commit())
    assert "disk full" in caplog.text and "No space left on device" in caplog.text
    with load_dump(path) as d:
        assert not d.attrs["complete"]
        assert 0 < len(d.records) < 300  # what came before is kept, nothing after
        assert d.verify() == []


def test_rows_are_written_only_into_space_held_first(tmp_path, monkeypatch):
    real = reserve.SpaceReserve.renew
    rows_room = 5 << 20  # what each flush's rows say they need: that hold, and only it, fails
    monkeypatch.setattr(writer.DumpWriter, "_pending_rows_size", lambda self: rows_room)

    def for_rows_fails(res, nbytes):  # the hold taken before a flush's rows (the ops' text,
        # in the blob, holds its own first), and the smaller one the close asks after that
        if nbytes in (rows_room + writer._HEADROOM, rows_room + writer._CLOSE_ROOM):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(res, nbytes)
    path = _dump_under(monkeypatch, tmp_path, for_rows_fails, mode="statistics")
    with load_dump(path) as d:
        assert d.records == [] and d.verify() == []


def test_rows_are_committed_only_into_space_held_after_the_flush(tmp_path, monkeypatch):
    real = reserve.SpaceReserve.renew

    def for_commit_fails(res, nbytes):  # HDF5's flush may have freed what was held before
        if nbytes == writer._CLOSE_ROOM:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(res, nbytes)
    path = _dump_under(monkeypatch, tmp_path, for_commit_fails)
    with load_dump(path) as d:  # the rows are in the file, the commit that shows them is not
        assert d.records == [] and d.verify() == []


def test_a_blob_growth_the_disk_cannot_hold_stops_before_hdf5_allocates_it(
        tmp_path, monkeypatch, caplog):
    real = reserve.SpaceReserve.renew

    def for_big_holds_fails(res, nbytes):
        if nbytes > 6 << 20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(res, nbytes)
    with caplog.at_level(logging.ERROR):
        path = _dump_under(monkeypatch, tmp_path, for_big_holds_fails, mode="tensor")
    # at the blob's growth from 4 to 8 MiB (an 8 MiB hold), of a step's ~5.7 MB
    assert "disk full" in caplog.text
    with load_dump(path) as d:
        assert not d.attrs["complete"] and d.records
        assert d.verify() == []


def test_an_abandoned_dump_gives_its_held_space_back(tmp_path, monkeypatch, holds_space):
    def close_fails(self, attrs, complete):
        raise OSError(errno.ENOSPC, "No space left on device")  # HDF5 failed: the abandon path

    monkeypatch.setattr(writer.DumpWriter, "_finish", close_fails)
    path = tmp_path / "run.h5"
    with dumper(dump_path=path, mode="tensor", flush_ops=64):
        lm_step(tiny_lm(), lm_batch())
    assert _held_past_end(path) < 1 << 20
    with load_dump(path) as d:  # what was committed before the failed close is kept
        assert d.records and d.verify() == []


def test_space_already_held_is_not_allocated_again(tmp_path, monkeypatch, holds_space):
    """The writer renews its hold before every HDF5 write; where the blocks past the end
    already cover the need, no allocation is made (each walks the held pages again), and
    where they do not, the hold grows to cover it."""
    calls = []
    real = reserve._fallocate
    monkeypatch.setattr(reserve, "_fallocate", lambda *a: calls.append(a[3]) or real(*a))
    f = tmp_path / "held"
    fd = os.open(f, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"x" * (8 << 20))  # blocks below the end are the file's, not held
        res = reserve.SpaceReserve(fd)
        res.renew(4 << 20)
        assert _held_past_end(f) >= 4 << 20 and len(calls) == 1
        res.renew(4 << 20)
        res.renew(3 << 20)
        assert len(calls) == 1  # held already: nothing allocated
        res.renew(64 << 20)
        assert len(calls) == 2 and _held_past_end(f) >= 64 << 20
    finally:
        os.close(fd)


def test_ops_recorded_before_the_disk_filled_are_committed_at_close(tmp_path, monkeypatch):
    """The disk fills between two commits: the ops recorded before it are kept, not only
    those of the last commit. Their texts go into blob room already held; before, tensor
    bytes had taken it, the close asked for new chunks the full disk refused, and a real
    tmpfs filled under a step kept 41-99 of its 538 recorded ops (sometimes none)."""
    real, grown = reserve.SpaceReserve.renew, []

    def full_after_three_growths(res, nbytes):  # what is held stays; nothing more is given
        if nbytes >= writer._HEADROOM:  # a growth of the blob (or the flush that never comes)
            if len(grown) == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            grown.append(nbytes)
        return real(res, nbytes)

    monkeypatch.setattr(reserve.SpaceReserve, "renew", full_after_three_growths)
    path = tmp_path / "run.h5"
    model, batch = tiny_lm(), lm_batch()
    with dumper(dump_path=path, flush_ops=100_000, flush_seconds=3600):  # no commit before
        lm_step(model, batch)
    with load_dump(path) as dump:
        assert not dump.attrs["complete"]
        assert len(dump.records) > 50  # every op before the refused growth
        assert [r.seq for r in dump.records] == list(range(len(dump.records)))
        assert dump.verify() == []


def _tensor(row: int, seq: int, idx: int, nbytes: int):
    import torch

    from accuracy.dumpfile.writer import TensorEntry
    return TensorEntry(row=row, seq=seq, io=1, idx=idx, dtype="uint8", shape=(nbytes,),
                       stride=(1,), device="cpu", stats=None,
                       data=torch.zeros(nbytes, dtype=torch.uint8), first=row, nbytes=nbytes)


def test_tensor_bytes_leave_the_texts_room_and_a_failed_op_leaves_no_row(tmp_path, monkeypatch):
    """Op 0's tensor fills the blob's first 1 MiB chunk exactly, then the disk is full. Op 1's
    first tensor fits, its second (16 MiB) is refused. The close commits op 0, whole (its
    text in room kept before its tensor took the chunk), and none of op 1's rows."""
    import time

    import h5py

    from accuracy.dumpfile.writer import DumpWriter, OpEntry
    from accuracy.records import CallSite

    real, full = reserve.SpaceReserve.renew, []

    def disk_full_after_op_0(res, nbytes):  # held blocks stay; nothing more is given
        if full and nbytes >= writer._HEADROOM:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(res, nbytes)

    monkeypatch.setattr(reserve.SpaceReserve, "renew", disk_full_after_op_0)
    path = tmp_path / "run.h5"
    w = DumpWriter(path, {"mode": "tensor"}, flush_ops=100_000, flush_seconds=3600)

    def op(seq: int, tensors: list) -> None:
        w.add_op(OpEntry(CallSite(seq, "aten.add.Tensor", "forward", "m", "t.py:1"),
                         stack="", args="{}", n_in=0, n_out=len(tensors)), tensors)
    op(0, [_tensor(0, 0, 0, 1 << 20)])
    deadline = time.monotonic() + 60
    while w.bytes_written < 1 << 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    full.append(True)  # another program takes the rest of the disk
    op(1, [_tensor(1, 1, 0, 512 << 10), _tensor(2, 1, 1, 16 << 20)])
    with pytest.raises(writer.DumpWriteError, match="disk full"):
        w.close({}, complete=True)
    with load_dump(path) as d:
        assert [r.seq for r in d.records] == [0] and d.verify() == []
    with h5py.File(path, "r") as f:
        assert list(f["_status"][:2]) == [1, 1]  # one op, its one tensor row


def test_a_closed_tensor_dump_holds_its_data_not_its_last_growth(tmp_path):
    """The blob grows by up to 64 MiB at a time; the chunks a closed dump did not fill are
    given back (holes), so the disk holds the data and the index, not the last growth."""
    path = tmp_path / "run.h5"
    with dumper(dump_path=path, mode="tensor"):
        lm_step(tiny_lm(), lm_batch())
    with load_dump(path) as d:
        data = d.blob_len
    if not _punches_holes(tmp_path / "probe"):
        pytest.skip("this file system cannot give blocks of a file back (no hole punching)")
    held = os.stat(path).st_blocks * 512
    assert held <= data + (2 << 20), (held, data)  # a chunk and the index tables at most


def _punches_holes(probe) -> bool:
    probe.write_bytes(b"x" * (256 << 10))
    fd = os.open(probe, os.O_RDWR)
    try:
        before = os.fstat(fd).st_blocks
        reserve.punch_hole(fd, 0, 256 << 10)
        return os.fstat(fd).st_blocks < before
    finally:
        os.close(fd)

