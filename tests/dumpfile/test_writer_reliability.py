"""A dump survives a killed job and a full disk; the reader survives any file thrown at it."""

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accuracy import DumpError, dumper, load_dump
from accuracy.cli import main as cli_main
from accuracy.examples import lm_batch, lm_step, tiny_lm
from tests._support.crafted import heap_collections

# 25 kills at random moments in make test (each lands between other writes than the last);
# the soak run (ACCURACY_SLOW=1) kills 200 times
KILLS = int(os.environ.get("ACCURACY_KILLS", "200" if os.environ.get("ACCURACY_SLOW") else "25"))
BASE = torch.arange(64, dtype=torch.float32)
RUNNER = Path(__file__).parents[1] / "_support" / "kill_runner.py"
_CASE = itertools.count()


def _kill_children(out: Path, kills: int, seed: int, max_seconds: float = 150) -> list[Path]:
    """Run the fork-and-kill loop in a fresh process; returns the dumps it left."""
    proc = subprocess.run([sys.executable, str(RUNNER), str(out), str(kills), str(seed),
                           str(max_seconds)], capture_output=True, text=True,
                          timeout=max_seconds + 120, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["not_ready"] == 0, proc.stderr
    return [Path(p) for p in result["dumps"]]


def _check_dump_intact(path: Path) -> int:
    """Every committed record holds exactly what the child computed; returns ops found."""
    with load_dump(path) as d:
        for rec in d.records:
            assert rec.op == "aten.add.Tensor"
            args, _ = rec.call([None])
            i = args[1]
            assert torch.equal(rec.inputs[0].load(), BASE)
            assert torch.equal(rec.outputs[0].load(), BASE + i), f"op {rec.seq} damaged"
            assert rec.seq == int(i)  # nothing missing before the last commit
        return len(d.records)


def test_sigkill_at_random_moments_leaves_intact_dumps(tmp_path):
    dumps = _kill_children(tmp_path, KILLS, seed=1234)
    assert len(dumps) >= min(KILLS, 20), "too few kills ran within the time bound"
    found = [_check_dump_intact(p) for p in dumps]
    assert max(found) > 0  # the kills landed while ops were being recorded
    from accuracy.dumpfile.describe import describe  # backend attributes come at close only

    assert "backend cpu (from its tensors)" in describe(dumps[found.index(max(found))]).format()
    print(f"kills survived: {len(found)}/{len(dumps)}; ops recovered per dump "
          f"min {min(found)} max {max(found)}")


def test_recording_writes_nothing_to_the_hdf5_heap(tmp_path):
    """Once the file is live (SWMR), nothing goes to HDF5's global heap, whose in-place growth
    SWMR does not order: a kill while a collection grew once left committed op texts past the
    end of file the superblock records ("actual len exceeds EOA": the dump unreadable)."""
    from accuracy.dumpfile.writer import DumpWriter, OpEntry
    from accuracy.records import CallSite

    path = tmp_path / "live.h5"
    w = DumpWriter(path, {"mode": "statistics"}, flush_ops=16, flush_seconds=0.01)
    try:
        before = heap_collections(path)
        for seq in range(400):
            w.add_op(OpEntry(CallSite(seq, "aten.add.Tensor", "forward",
                                      f"Model.layers.{seq}.mlp", f"train.py:{seq}"),
                             stack="x" * 300, args="{}", n_in=0, n_out=0), [])
        deadline = time.monotonic() + 30
        while w._n_committed < 400 and time.monotonic() < deadline:  # all committed
            time.sleep(0.01)
        assert w._n_committed == 400
        assert heap_collections(path) == before
    finally:
        w.close({}, complete=True)
    with load_dump(path) as d:
        assert [r.module for r in d.records] == [f"Model.layers.{i}.mlp" for i in range(400)]
        assert d.records[7].stack == "x" * 300


_READ_LIVE = """
import sys
from accuracy import load_dump
bad = []
for _ in range(int(sys.argv[2])):
    try:
        with load_dump(sys.argv[1]) as d:
            len(d.records)
    except Exception as e:
        bad.append(str(e))
print(len(bad), bad[:1])
"""


def test_a_dump_being_written_reads_at_any_moment(tmp_path):
    """`accuracy verify` or a reader on a running job's dump sees the committed rows; it once
    read the tables before the counts, and a commit in between made it refuse the file as
    damaged ("/_status says 16384 ops, the table has 16128 rows", about 1 read in 8)."""
    from accuracy.dumpfile.writer import DumpWriter, OpEntry
    from accuracy.records import CallSite

    path = tmp_path / "live.h5"
    w = DumpWriter(path, {"mode": "statistics"}, flush_ops=4, flush_seconds=0.001)
    stop = threading.Event()

    def train() -> None:
        seq = 0
        while not stop.is_set() and seq < 200_000:
            for _ in range(8):
                w.add_op(OpEntry(CallSite(seq, "aten.add.Tensor", "forward", "m", "t.py:1"),
                                 stack="", args="{}", n_in=0, n_out=0), [])
                seq += 1
            time.sleep(0.004)

    t = threading.Thread(target=train)
    t.start()
    try:
        time.sleep(0.2)
        proc = subprocess.run([sys.executable, "-c", _READ_LIVE, str(path), "30"],
                              capture_output=True, text=True, timeout=240)
    finally:
        stop.set()
        t.join()
        w.close({}, complete=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("0 "), proc.stdout


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, check=False)
    return proc.returncode == 0


def test_disk_full_stops_dumping_not_training(tmp_path, caplog):
    disk = tmp_path / "small_disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "12m"):
        pytest.skip("needs root to mount a small tmpfs as a disk that fills up")
    try:
        model, batch = tiny_lm(), lm_batch()
        ref_model = tiny_lm()
        ref_loss = lm_step(ref_model, batch)
        with caplog.at_level(logging.ERROR):
            # every op's text commits after the disk filled (one batch, at close): the ops
            # recorded before it must still be there, whatever the writer thread's timing
            with dumper(dump_path=disk / "run.h5", flush_ops=1 << 20, flush_seconds=3600):
                loss = lm_step(model, batch)
        assert torch.equal(loss.detach(), ref_loss.detach())  # training went on, unchanged
        assert "disk almost full" in caplog.text and "mode='statistics'" in caplog.text
        with load_dump(disk / "run.h5") as d:
            assert not d.attrs["complete"] and d.records
            for rec in d.records:
                for t in rec.tensors:
                    if t.has_data:
                        assert t.load().shape == t.shape
        with pytest.raises(Exception, match="disk almost full"):
            with dumper(dump_path=disk / "strict.h5", strict=True):
                lm_step(model, batch)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.fixture(scope="module")
def good_dump_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "good.h5"
    x = torch.randn(8, 8)
    with dumper(dump_path=path):
        (x @ x).relu().sum()
    return path.read_bytes()


def _read_everything(path: Path) -> None:
    with load_dump(path) as d:
        d.summary()
        for rec in d.records:
            for t in rec.tensors:
                if t.has_data:
                    t.load()


# Derandomized by default: HDF5 2.0 itself can loop forever on some damaged attribute
# metadata (found by this fuzz, reported in the closing note), which no Python timeout can
# interrupt, so CI runs a fixed set of cases. ACCURACY_SLOW=1 explores new random cases.
@settings(max_examples=int(os.environ.get("ACCURACY_FUZZ_CASES", "150")), deadline=None,
          derandomize=not os.environ.get("ACCURACY_SLOW"),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reader_fuzz_mutated_and_truncated_files(tmp_path, good_dump_bytes, data):
    raw = bytearray(good_dump_bytes)
    kind = data.draw(st.sampled_from(["truncate", "flip", "overwrite", "zero_block"]))
    if kind == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 16))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "overwrite":
        i = data.draw(st.integers(0, len(raw) - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=64))
        raw[i: i + len(chunk)] = chunk
    else:
        i = data.draw(st.integers(0, len(raw) - 1))
        n = data.draw(st.integers(1, 4096))
        raw[i: i + n] = bytes(min(n, len(raw) - i))
    path = tmp_path / f"m{next(_CASE)}.h5"  # a new name each case: no HDF5 handle reuse
    path.write_bytes(bytes(raw))
    try:
        _read_everything(path)
    except DumpError as e:  # the only way a damaged file may fail: a reason naming the file
        assert str(path) in str(e)
    # The CLI answers with exit code 0 or a clean error (2), never a traceback.
    assert cli_main(["info", str(path)]) in (0, 2)


def test_cli_info_json_on_killed_dump_reports_incomplete(tmp_path, capsys):
    (path,) = _kill_children(tmp_path, 1, seed=7)
    assert cli_main(["info", "--json", str(path)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["complete"] is False and info["closed_cleanly"] is False


def test_chunks_past_the_committed_bytes_may_lie_past_the_measured_end(tmp_path):
    """The race behind the live read above: the writer allocates the blob's next chunk, the
    reader measures the file, then extends it over the chunk. Chunks past the committed bytes
    are never read, so they are not judged; a committed chunk past the end still is."""
    import h5py
    import numpy as np

    from accuracy.dumpfile import validate

    with h5py.File(tmp_path / "f.h5", "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((64,))
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        space = h5py.h5s.create_simple((128,), (h5py.h5s.UNLIMITED,))
        blob = h5py.Dataset(h5py.h5d.create(f.id, b"blob", h5py.h5t.STD_U8LE, space, dcpl=dcpl))
        first_chunk_end, second_chunk_end = (
            blob.id.get_chunk_info_by_coord((c,)).byte_offset + 64 for c in (0, 64))
        assert second_chunk_end > first_chunk_end
        status = np.array([0, 0, 0, 64], np.int64)
        table = f.create_dataset("t", (0,), np.int64)
        assert validate.check_index(status, table, table, blob, first_chunk_end) == (0, 0, 64)
        with pytest.raises(validate.LayoutError, match="outside the file"):
            validate.check_index(status, table, table, blob, first_chunk_end - 1)


def test_a_long_statistics_dump_keeps_no_memory_per_row(tmp_path):
    """A statistics dump over a long run: rows that hold no bytes leave nothing behind in
    the writer once committed (it kept a dict entry per row, ~110 bytes, for the whole run:
    gigabytes over a long run of a large model)."""
    import gc
    import tracemalloc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    writer_code = tracemalloc.Filter(True, "*accuracy/dumpfile/writer.py")
    tracemalloc.start()
    try:
        with dumper(dump_path=tmp_path / "long.h5", mode="statistics", flush_ops=64) as dp:
            sizes = []
            for step in range(61):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                dp.step()
                if step in (20, 60):
                    gc.collect()
                    snap = tracemalloc.take_snapshot().filter_traces([writer_code])
                    sizes.append(sum(s.size for s in snap.statistics("filename")))
    finally:
        tracemalloc.stop()
    rows = len(load_dump(tmp_path / "long.h5").tensors)
    assert rows > 5000  # 40 steps of ~90 rows between the two snapshots
    assert sizes[1] - sizes[0] < 64 << 10, sizes
