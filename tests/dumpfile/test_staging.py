"""Tensor mode's write path: one copy into a warm staging ring, bytes written straight to the
blob's allocated chunks, back-pressure when the ring is full, and a writer that fails or
stalls never stops training."""

import importlib
import logging
import os
import threading
import time

import pytest
import torch

import accuracy.dumpfile.writer as writer_mod
from accuracy import dumper, load_dump
from accuracy.dumpfile import staging

recorder_mod = importlib.import_module("accuracy.dumper.recorder")


def _no_private_copies(monkeypatch):
    def refuse(t):
        raise AssertionError("a CPU tensor was copied into fresh memory, not the ring")

    monkeypatch.setattr(recorder_mod, "_host_copy", refuse)


def test_cpu_tensors_are_copied_once_into_a_ring_reused_by_the_next_dump(tmp_path,
                                                                          monkeypatch):
    _no_private_copies(monkeypatch)
    xs = [torch.randn(300, 7) for _ in range(4)]
    ptrs = []
    for k in range(2):
        with dumper(str(tmp_path / f"d{k}.h5")) as dd:
            for x in xs:
                torch.tanh(x)
            ptrs.append(dd._writer._ring._buf.data_ptr())  # noqa: SLF001
        with load_dump(tmp_path / f"d{k}.h5") as d:
            assert d.verify() == []
            outs = [r.outputs[0].load() for r in d.records]
        assert all(torch.equal(o, torch.tanh(x)) for o, x in zip(outs, xs, strict=True))
    assert ptrs[0] == ptrs[1]  # the second dump wrote through the first one's warm pages


def test_tiny_ring_wraps_and_blocks_without_overwriting_bytes_not_yet_written(
        tmp_path, monkeypatch):
    """Tensors of mixed sizes through a ring that holds about two of them, with a slow disk:
    the training thread waits for room, and every stored tensor is what the op produced."""
    _no_private_copies(monkeypatch)
    real = writer_mod.DumpWriter._write_op

    def slow(self, *a, **kw):
        time.sleep(0.01)
        return real(self, *a, **kw)

    monkeypatch.setattr(writer_mod.DumpWriter, "_write_op", slow)
    sizes = [3000, 9000, 5000, 12000, 1000, 7000, 11000, 2000, 6000, 10000] * 2
    xs = [torch.full((n,), float(i)) for i, n in enumerate(sizes)]
    cap = 2 * 12000 * 4 + 4096  # about two of the largest tensors
    with dumper(str(tmp_path / "d.h5"), max_pending_bytes=cap, data_mode="output") as dd:
        for x in xs:
            x.neg()
        assert dd._writer._ring.capacity == cap  # noqa: SLF001
    with load_dump(tmp_path / "d.h5") as d:
        assert d.attrs["complete"] and d.verify() == []
        got = [r.outputs[0].load() for r in d.records]
    assert len(got) == len(xs)
    for i, (g, x) in enumerate(zip(got, xs, strict=True)):
        assert torch.equal(g, -x), f"tensor {i} was overwritten in the ring before its write"


def test_writer_failure_never_blocks_or_stops_training(tmp_path, monkeypatch, caplog):
    """The disk write fails mid-dump with the ring full: training goes on to the end with a
    clear log line, and the dump keeps what was committed, marked incomplete."""
    calls = []
    real = writer_mod.BlobSpace.write

    def failing(self, data, offset):
        calls.append(offset)
        if len(calls) > 6:
            raise OSError(5, "Input/output error (injected)")
        return real(self, data, offset)

    monkeypatch.setattr(writer_mod.BlobSpace, "write", failing)
    xs = [torch.full((4096,), float(i)) for i in range(40)]
    done = []
    with caplog.at_level(logging.ERROR):
        with dumper(str(tmp_path / "d.h5"), max_pending_bytes=3 * 4096 * 4, flush_ops=1):
            for x in xs:
                x.neg()
                done.append(1)
    assert len(done) == len(xs)
    assert "dump writer failed" in caplog.text and "training goes on" in caplog.text
    with load_dump(tmp_path / "d.h5") as d:
        assert not d.attrs["complete"]
        assert d.verify() == []


def test_blob_chunks_lie_inside_the_file_as_soon_as_they_are_allocated(tmp_path):
    """A kill right after the blob grew must leave no index entry pointing past the end of
    the file (the reader refuses such a file as damaged): the file covers new chunks at once,
    before HDF5 flushes anything."""
    w = writer_mod.DumpWriter(tmp_path / "d.h5", {}, flush_seconds=3600, flush_ops=10 ** 6)
    try:
        space = w._space  # noqa: SLF001 - the writer thread is idle: grow the blob as it would
        space.grow(5 * space.chunk + 17)
        end = max(space._addr) + space.chunk  # noqa: SLF001
        assert len(space._addr) == 6  # noqa: SLF001
        assert os.stat(tmp_path / "d.h5").st_size >= end
    finally:
        w.close({}, complete=True)


def test_ring_falls_back_when_only_its_own_copies_hold_it():
    """An op whose own (not yet submitted) copies fill the ring gets a private copy for the
    next one rather than waiting for room that nothing will free."""
    ring = staging.StagingRing(4096)
    a = ring.stage(torch.zeros(800), lambda: True)  # 3200 bytes, not submitted
    assert a is not None
    t0 = time.monotonic()
    assert ring.stage(torch.zeros(400), lambda: True) is None
    assert time.monotonic() - t0 < 0.4
    a.submit()
    freed = threading.Timer(0.2, lambda: a.__del__())
    freed.start()
    b = ring.stage(torch.ones(400), lambda: True)  # waits for the writer to free `a`
    freed.join()
    assert b is not None and torch.equal(b.wait(), torch.ones(400))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float16, torch.complex64, torch.int8])
def test_staged_copy_holds_the_exact_bytes_of_any_dtype(dtype):
    ring = staging.StagingRing(1 << 16)
    src = (torch.randn(5, 3) * 4).to(dtype).t()  # not contiguous
    s = ring.stage(src, lambda: True)
    assert s is not None
    got = s.wait()
    assert got.is_contiguous() and got.dtype == dtype and torch.equal(got, src)


@pytest.mark.parametrize("staged", [True, False], ids=["staging-ring", "private-copies"])
def test_max_pending_bytes_blocks_the_training_thread(tmp_path, monkeypatch, staged):
    """With the disk stalled, the training thread stops once `max_pending_bytes` are waiting,
    and carries on (losing nothing) when the disk catches up: with CPU tensors staged in the
    writer's ring (sized to the budget), and with private copies (device tensors, or tensors
    the ring cannot take), where the pending-bytes count alone holds the training thread."""
    gate = threading.Event()
    real = writer_mod.DumpWriter._write_op
    if not staged:
        monkeypatch.setattr(writer_mod.DumpWriter, "stage", lambda self, t: None)

    def stalled(self, *a, **kw):
        gate.wait(120)
        return real(self, *a, **kw)

    monkeypatch.setattr(writer_mod.DumpWriter, "_write_op", stalled)
    xs = [torch.full((16384,), float(i)) for i in range(8)]  # 64 KiB each
    per_op = 2 * 16384 * 4  # input and output stored
    cap = 3 * per_op
    done: list[int] = []
    seen: list[int] = []
    errors: list[BaseException] = []

    def train():
        try:
            with dumper(str(tmp_path / "d.h5"), max_pending_bytes=cap) as dd:
                for i, x in enumerate(xs):
                    x.neg()
                    done.append(i)
                    seen.append(dd._writer._pending_bytes)  # noqa: SLF001
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=train, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # give a broken cap the chance to let a fourth op through
    assert len(done) == 3 and t.is_alive(), done
    assert max(seen) <= cap
    gate.set()
    t.join(120)
    assert not t.is_alive() and not errors, errors
    with load_dump(tmp_path / "d.h5") as d:
        got = [r.outputs[0].load() for r in d.records]
    assert len(got) == 8 and all(torch.equal(g, -x) for g, x in zip(got, xs, strict=True))

