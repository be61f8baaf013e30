"""`replay --tensors` beside its dump: reference outputs proven bit-identical to the device's
are rows naming the dump's bytes (schema 5, offset `IN_SOURCE`), not written again; readers
get the same tensors, verified against the same hashes, and a replay written anywhere else, or
moved without its dump, says so instead of reading other bytes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest
import torch

from accuracy.compare import compare
from accuracy.dumpfile import DumpError, load_dump, schema
from accuracy.dumpfile.describe import describe, verify_file
from accuracy.dumpfile.extract import extract_file
from accuracy.dumpfile.reader import DamagedDataError
from accuracy.replay import replay
from tests._support.lm_dumps import lm_dump

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _offsets(path):
    with h5py.File(path, "r") as f:
        return f[schema.TENSORS]["offset"]


def _bytes(t):
    return t.load().reshape(-1).view(torch.uint8)


def _outputs_equal_device(rep_path, dev_path):
    """Every output of `rep_path` with data: (held by the dump, written here) counts, after
    checking each loads to the device output's bytes where bit_exact."""
    held = own = 0
    with load_dump(rep_path) as rp, load_dump(dev_path) as dev:
        for rec in rp.records:
            exact = {o["idx"] for o in rec.extra["replay"]["outputs"] if o["bit_exact"]}
            for t in rec.outputs:
                if not t.has_data:
                    continue
                if t.dump is not rp:
                    held += 1
                    assert t.idx in exact, (rec.seq, rec.op)
                else:
                    own += 1
                if t.idx in exact:
                    s = dev.record(rec.seq).outputs[t.idx]
                    assert torch.equal(_bytes(t), _bytes(s)), (rec.seq, rec.op)
    return held, own


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A sim dump (some outputs differ from the reference) and its --tensors replay beside it."""
    d = tmp_path_factory.mktemp("beside")
    dev = lm_dump(d / "dev.h5", seed=0, profile="fp16-cube")
    r = replay(dev, d / "rep.h5", metrics_only=False)
    assert r.failed == 0
    return dev, d / "rep.h5"


def test_outputs_equal_to_the_device_are_named_not_written(pair):
    dev, rep = pair
    offsets = _offsets(rep)
    assert (offsets == schema.IN_SOURCE).sum() > 50
    with load_dump(rep) as rp:
        assert rp.attrs["schema_version"] >= schema.SOURCE_ROWS_SCHEMA
        assert rp.source_problem == ""
        s = rp.summary()
    held, own = _outputs_equal_device(rep, dev)
    assert held > 50 and own > 0  # fp16-cube matmuls differ: their references are written
    assert s["bytes_in_replayed_dump"] > 0
    assert s["bytes_written"] < s["bytes_in_replayed_dump"]
    v = verify_file(rep)
    assert v.ok, v.problems
    assert "in the replayed dump (equal to the device's)" in describe(rep).format()


def test_a_replay_elsewhere_holds_every_byte(pair, tmp_path):
    dev, beside = pair
    other = tmp_path / "elsewhere"
    other.mkdir()
    rep = other / "rep.h5"
    r = replay(dev, rep, metrics_only=False)
    assert r.held == 0 and "keep the two files" not in r.format()
    assert not (_offsets(rep) == schema.IN_SOURCE).any()
    with load_dump(rep) as rp, load_dump(dev) as d:
        assert rp.attrs["schema_version"] == schema.SCHEMA_VERSION
        # its bytes carry hashes: no sums, and bit-exact outputs take the device's statistics
        assert rp.attrs[schema.SUMS_ATTR] == schema.SUMS_OMITTED
        n = 0
        for rec in rp.records:
            exact = {o["idx"] for o in rec.extra["replay"]["outputs"] if o["bit_exact"]}
            for t in rec.outputs:
                assert "checksum" not in t.stats
                if t.idx in exact and t.has_data:
                    assert t.stats == d.record(rec.seq).outputs[t.idx].stats, rec.seq
                    n += 1
        assert n > 50
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(rep, alone / "rep.h5")  # no dump beside it: every tensor still reads
    held, own = _outputs_equal_device(alone / "rep.h5", dev)
    assert held == 0 and own > 50
    # the same tensors, the same figures, whichever way they were stored
    with load_dump(rep) as a, load_dump(beside) as b:
        assert [r.extra["replay"] for r in a.records] == [r.extra["replay"] for r in b.records]
        for ra, rb in zip(a.records, b.records, strict=True):
            for ta, tb in zip(ra.outputs, rb.outputs, strict=True):
                assert ta.has_data == tb.has_data
                if ta.has_data:
                    assert torch.equal(_bytes(ta), _bytes(tb)), ra.seq


def _own_rows(path):
    """(row holding the bytes, content hash, nbytes) of each output row with data in `path`."""
    with load_dump(path) as rp:
        return [(t.first, t.content_hash, t.nbytes) for rec in rp.records for t in rec.outputs
                if t.has_data and t.dump is rp]


def test_a_replay_elsewhere_writes_the_same_bytes_once(tmp_path):
    # a plain-CPU step: every output is the device's bits, and the dump stores some bytes
    # twice (a clone, a weight's `t` in forward and backward): replay.h5 holds them once
    dev = lm_dump(tmp_path / "dev.h5", seed=0)
    other = tmp_path / "elsewhere"
    other.mkdir()
    r = replay(dev, other / "rep.h5", metrics_only=False)
    assert r.failed == 0 and r.held == 0
    rows = _own_rows(other / "rep.h5")
    by_bytes: dict[tuple[int, int], set[int]] = {}
    for first, h, n in rows:
        by_bytes.setdefault((h, n), set()).add(first)
    assert all(len(firsts) == 1 for firsts in by_bytes.values())
    assert len(rows) > len(by_bytes) + 10  # rows share stored bytes
    with load_dump(dev) as d:
        stored_twice = {}
        for rec in d.records:
            for t in rec.outputs:
                if t.has_data and not t.is_link:
                    stored_twice.setdefault((t.content_hash, t.nbytes), set()).add(t.first)
        assert any(len(v) > 1 for v in stored_twice.values())  # the dump repeats bytes
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(other / "rep.h5", alone / "rep.h5")
    held, own = _outputs_equal_device(alone / "rep.h5", dev)  # each row reads its own bits
    assert held == 0 and own > 50
    assert verify_file(alone / "rep.h5").ok


def test_a_resumed_replay_elsewhere_links_only_the_same_bytes(tmp_path):
    # the interrupted replay.h5's rows and the dump's rows are numbered apart: a row of one
    # never names the bytes of the other's row of the same number
    dev = lm_dump(tmp_path / "dev.h5", seed=0)
    other = tmp_path / "elsewhere"
    other.mkdir()
    with load_dump(dev) as d:
        ops = sorted({rec.op for rec in d.records})
    replay(dev, other / "fresh.h5", metrics_only=False)
    replay(dev, other / "rep.h5", metrics_only=False, ops=ops[: len(ops) // 2])
    r = replay(dev, other / "rep.h5", metrics_only=False, resume=True)
    assert r.resumed > 50 and r.failed == 0
    assert verify_file(other / "rep.h5").ok
    with load_dump(other / "fresh.h5") as a, load_dump(other / "rep.h5") as b:
        n = 0
        for ra in a.records:
            rb = b.record(ra.seq)
            for ta, tb in zip(ra.outputs, rb.outputs, strict=True):
                assert ta.has_data == tb.has_data, ra.seq
                if ta.has_data:
                    assert torch.equal(_bytes(ta), _bytes(tb)), (ra.seq, ra.op, ta.idx)
                    n += 1
        assert n > 100


def test_compare_and_extract_give_the_same_answers(pair, tmp_path):
    dev, rep = pair
    gold = lm_dump(tmp_path / "gold.h5", seed=0)
    slim = tmp_path.parent / f"{tmp_path.name}-slim"
    slim.mkdir()
    shutil.copy(dev, slim / "dev.h5")
    replay(slim / "dev.h5", slim / "rep.h5")  # figures only
    a = compare(dev, gold, replay=rep)
    b = compare(slim / "dev.h5", gold, replay=slim / "rep.h5")
    keys = ("local_error_ratio", "local_bound", "local_verdict", "verdict")
    assert [[r.get(k) for k in keys] for r in a.rows] == [[r.get(k) for k in keys]
                                                          for r in b.rows]
    with load_dump(rep) as rp:
        rec = next(r for r in rp.records if any(t.dump is not rp for t in r.outputs))
        want = {t.idx: _bytes(t) for t in rec.outputs if t.has_data}
    extract_file(rep, tmp_path / "one.h5", op=rec.op, seq=rec.seq)
    with h5py.File(tmp_path / "one.h5", "r") as f:
        for idx, b in want.items():
            got = np.asarray(f[f"/{rec.op}/{rec.seq}/output/{idx}"]).reshape(-1).view(np.uint8)
            assert np.array_equal(got, b.numpy())


def test_moved_without_its_dump_says_where_the_bytes_are(pair, tmp_path):
    _, rep = pair
    shutil.copy(rep, tmp_path / "rep.h5")
    with load_dump(tmp_path / "rep.h5") as rp:
        assert all("replay" in r.extra for r in rp.records)  # figures need no dump
        held = [t for t in rp.tensors if t.offset == schema.IN_SOURCE]
        assert held and not any(t.has_data for t in held)
        assert "dev.h5" in rp.source_problem
        with pytest.raises(DumpError, match="equals the device output"):
            held[0].load()
    v = verify_file(tmp_path / "rep.h5")
    assert not v.ok and any("cannot be read" in p for p in v.problems)


def test_another_dump_of_that_name_is_not_read(pair, tmp_path):
    dev, rep = pair
    shutil.copy(rep, tmp_path / "rep.h5")
    lm_dump(tmp_path / "dev.h5", seed=1, profile="fp16-cube")  # same name and ops, other values
    with load_dump(tmp_path / "rep.h5") as rp, load_dump(dev) as d:
        held = [t for t in rp.tensors if t.offset == schema.IN_SOURCE]
        assert held and "do not match" in rp.source_problem
        with pytest.raises(DumpError, match="do not match"):
            held[0].load()
        for t in rp.tensors:  # rows still pointed there hold bytes equal in both dumps
            if t.dump is not rp:
                assert torch.equal(_bytes(t), _bytes(d.tensor_record(t.address)))


def test_damaged_dump_bytes_are_refused_through_the_replay(pair, tmp_path):
    dev, rep = pair
    for p in (dev, rep):
        shutil.copy(p, tmp_path / p.name)
    with load_dump(tmp_path / "rep.h5") as rp:
        t = next(t for t in rp.tensors if t.dump is not rp and t.nbytes >= 8)
        pos = t.dump.file_offset(t.offset, t.nbytes)
        assert pos is not None
    with open(tmp_path / "dev.h5", "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 1]))
    with load_dump(tmp_path / "rep.h5") as rp:
        again = next(x for x in rp.tensors if x.row == t.row)
        with pytest.raises(DamagedDataError):
            again.load()
        assert any(t.address in p for p in rp.verify())


def test_rows_held_elsewhere_need_schema_5(pair, tmp_path):
    _, rep = pair
    shutil.copy(rep, tmp_path / "rep.h5")
    with h5py.File(tmp_path / "rep.h5", "r+") as f:
        f.attrs["schema_version"] = schema.SOURCE_ROWS_SCHEMA - 1  # before held rows
    with pytest.raises(DumpError, match="negative data offset"):
        load_dump(tmp_path / "rep.h5")
    shutil.copy(rep, tmp_path / "nohash.h5")
    with h5py.File(tmp_path / "nohash.h5", "r+") as f:
        rows = f[schema.TENSORS][:]
        i = int(np.argmax(rows["offset"] == schema.IN_SOURCE))
        rows["hash"][i] = 0
        f[schema.TENSORS][i] = rows[i]
    with pytest.raises(DumpError, match="without a content hash"):
        load_dump(tmp_path / "nohash.h5")


def test_a_replay_of_a_replay_does_not_loop(pair, tmp_path, monkeypatch):
    """Two files naming each other as the replayed dump: each opens the other once, with
    its rows held elsewhere left unread, never in a loop."""
    from accuracy.dumpfile.reader import Dump

    _, rep = pair
    opened = []
    real = Dump.__init__

    def counting(self, path, **kw):
        opened.append(path)
        real(self, path, **kw)

    monkeypatch.setattr(Dump, "__init__", counting)
    shutil.copy(rep, tmp_path / "a.h5")
    shutil.copy(rep, tmp_path / "b.h5")
    for me, other in (("a.h5", "b.h5"), ("b.h5", "a.h5")):
        with h5py.File(tmp_path / me, "r+") as f:
            f.attrs["replayed_from"] = str(tmp_path / other)
            f.attrs.pop("attrs_hash", None)
    with load_dump(tmp_path / "a.h5") as a:
        held = [t for t in a.tensors if t.offset == schema.IN_SOURCE]
        assert held and "do not match" in a.source_problem
    assert len(opened) == 2  # a, then b (whose own held rows are not followed)


_KILLED = textwrap.dedent("""
    import sys, time
    from accuracy.replay import engine
    real, n = engine.replay_op, [0]
    def slow(rec, *a, **k):
        n[0] += 1
        if n[0] == 60:
            print("ready", flush=True)
            time.sleep(600)
        return real(rec, *a, **k)
    engine.replay_op = slow
    engine.replay(sys.argv[1], sys.argv[2], metrics_only=False)
""")


def test_a_killed_tensors_replay_leaves_a_readable_partial(tmp_path):
    dev = lm_dump(tmp_path / "dev.h5", seed=0)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", _KILLED, str(dev), str(tmp_path / "rep.h5")],
                         stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        time.sleep(2.5)  # the writer commits what waits after its flush interval (1 s)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    partial = tmp_path / "rep.h5.partial"
    with load_dump(partial) as rp:
        assert not rp.closed_cleanly and len(rp.records) >= 50
    held, own = _outputs_equal_device(partial, dev)
    assert held > 20
    assert verify_file(partial, allow_incomplete=True).ok  # what it kept is sound ...
    assert "INCOMPLETE" in verify_file(partial).format()  # ... and it says it is cut short
    r = replay(dev, tmp_path / "rep.h5", metrics_only=False, resume=True)
    assert r.resumed >= 50 and r.failed == 0
    held, _ = _outputs_equal_device(tmp_path / "rep.h5", dev)
    assert held > 50 and r.held == held  # the resumed ones: loaded, written again
    assert "dev.h5 beside it (keep the two files together)" in r.format()


def test_server_windowed_view_reads_the_dump_bytes(pair):
    """The server streams a big tensor in windows from the file holding it: for a replay's
    row held by the replayed dump, that dump (not the replay's own blob)."""
    from accuracy.server.boundedread import TensorSource, ViewLimits

    _, rep = pair
    with load_dump(rep) as rp:
        t = max((t for t in rp.tensors if t.dump is not rp), key=lambda t: t.nbytes)
        src = TensorSource(rp, t, ViewLimits())
        src.whole = False  # stream it as a tensor over the budget would be
        src._check_layout()
        got = torch.cat([x for _, x in src.pieces()])
        assert torch.equal(got, t.load().to(torch.float64).reshape(-1))


def test_a_collective_is_bit_exact_only_with_the_same_bits():
    """`bit_exact` says the reference has the device's bits (a `--tensors` replay then names
    the device's bytes for it): +0.0 against -0.0 is equal in value, not in bits."""
    from accuracy.replay.collectives import _metrics

    want = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert _metrics(0, torch.tensor([0.0, 1.0]), want, 2)["bit_exact"]
    assert not _metrics(0, torch.tensor([-0.0, 1.0]), want, 2)["bit_exact"]


def test_server_view_without_the_dump_says_where_the_bytes_are(pair, tmp_path):
    from accuracy.server.boundedread import TensorSource, ViewLimits
    from accuracy.server.errors import ApiError

    _, rep = pair
    shutil.copy(rep, tmp_path / "rep.h5")
    with load_dump(tmp_path / "rep.h5") as rp:
        t = next(t for t in rp.tensors if t.offset == schema.IN_SOURCE)
        with pytest.raises(ApiError, match="replayed dump") as e:
            TensorSource(rp, t, ViewLimits())
        assert e.value.status == 409



def test_an_uploaded_replay_never_reads_another_run(pair, tmp_path):
    """Uploads sit in the server's runs/ under ids, beside other users' runs: a replay whose
    replayed_from names another stored run (crafted, or by chance) reads nothing from it."""
    from accuracy.server.storage import Storage
    from tests._support.crafted import reseal

    dev, rep = pair
    storage = Storage(tmp_path / "data")
    try:
        up = storage.tmp_path()
        shutil.copy(dev, up)
        dev_run = storage.add_uploaded(up, "dev.h5")
        crafted = storage.tmp_path()
        shutil.copy(rep, crafted)
        with h5py.File(crafted, "r+") as f:
            f.attrs["replayed_from"] = os.path.basename(dev_run.path)
            reseal(f)
        rep_run = storage.add_uploaded(crafted, "rep.h5")
        rp = storage.dump(rep_run.id)
        held = [t for t in rp.tensors if t.offset == schema.IN_SOURCE]
        assert held and all(t.dump is rp and not t.has_data for t in held)
        assert "uploaded to a server" in rp.source_problem
        with load_dump(rep_run.path) as local:  # the same file opened as a user would
            assert any(t.dump is not local for t in local.tensors)
    finally:
        storage.close()
