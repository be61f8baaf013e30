"""Replay settles a bit-identical output by its content hash, without reading it; an output
that differs by any bit (a fault, however small) is read and measured as before."""

from __future__ import annotations

from fnmatch import fnmatch

import pytest

from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumper.core import dumper
from accuracy.dumpfile import load_dump
from accuracy.dumpfile.checksum import NO_HASH
from accuracy.dumpfile.reader import Dump
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.replay import replay
from accuracy.replay.ops import StoredOutput

LAYER = "encoder.layers.1.*"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """A golden CPU dump and a device dump whose only fault is a 1e-6 bias on one GEMM."""
    tmp = tmp_path_factory.mktemp("proof")
    batch = lm_batch(batch=2, seq=16)
    with dumper(tmp / "gold.h5"):
        lm_step(tiny_lm(), batch)
    fault = sim.fault("aten.addmm.default", module=LAYER, kind="bias", value=1e-6,
                      occurrence=0)
    with sim(profile="exact", faults=[fault]) as s, dumper(tmp / "dev.h5"):
        lm_step(tiny_lm(), batch)
    assert len(s.applied) == 1
    return tmp / "gold.h5", tmp / "dev.h5", s.applied[0]["call"]


def _figures(path):
    with load_dump(path) as d:
        return {r.seq: r.extra["replay"] for r in d.records}


def _replay_counting_reads(dump, out, monkeypatch):
    reads: set[tuple] = set()
    real = Dump.read_tensor_mapped

    def counting(self, t):
        reads.add(t.bytes_key)  # a view (schema 6) is read through its strides: its own
        return real(self, t)

    with monkeypatch.context() as m:
        m.setattr(Dump, "read_tensor_mapped", counting)
        r = replay(dump, out)
    assert r.failed == 0
    return reads


def _own_outputs(rec):
    """Outputs this op made, read (if they are) under a bytes key of their own: not links
    to bytes read before, nor a strided row (schema 6) read in its holder's very layout (a
    clone of its input: the holder's key); a view read through its own strides counts."""
    return [t for t in rec.outputs if t.has_data and not t.is_link
            and not (t.strided and t.byte_layout is None) and t.content_hash != NO_HASH]


def test_bit_identical_outputs_keep_their_figures_without_being_read(dumps, tmp_path,
                                                                    monkeypatch):
    _, dev, _ = dumps
    reads = _replay_counting_reads(dev, tmp_path / "hashed.h5", monkeypatch)
    monkeypatch.setattr(StoredOutput, "same_bits", lambda self, ref: None)  # read everything
    read_all = _replay_counting_reads(dev, tmp_path / "read.h5", monkeypatch)
    assert _figures(tmp_path / "hashed.h5") == _figures(tmp_path / "read.h5")
    proven = 0
    with load_dump(dev) as d:
        figures = _figures(tmp_path / "hashed.h5")
        for rec in d.records:
            info = figures[rec.seq]
            if info["status"] != "ok" or not info["outputs"] or not all(
                    o["bit_exact"] for o in info["outputs"]):
                continue
            for t in _own_outputs(rec):
                assert t.bytes_key in read_all
                assert t.bytes_key not in reads, (rec.op, rec.seq)
                proven += 1
    assert proven > 100


def test_a_faulted_op_is_read_and_measured_never_settled_by_hash(dumps, tmp_path,
                                                                monkeypatch):
    gold, dev, seq = dumps
    out = tmp_path / "replay.h5"
    reads = _replay_counting_reads(dev, out, monkeypatch)
    figures = _figures(out)
    with load_dump(dev) as d:
        faulted = d.record(seq)
        assert faulted.op == "aten.addmm.default" and fnmatch(faulted.module, "*" + LAYER)
        outs = _own_outputs(faulted)
        assert outs and all(t.bytes_key in reads for t in outs)
    info = figures[faulted.seq]
    assert info["status"] == "ok"
    o = info["outputs"][0]
    assert o["bit_exact"] is False and o["err_device"] > 0 and o["error_ratio"] > 1
    assert [s for s, f in figures.items() if f["status"] == "ok" and any(
        not x["bit_exact"] for x in f["outputs"])] == [faulted.seq]
    report = compare(dev, gold, replay=out)
    assert report.culprit is not None and "encoder.layers.1" in str(report.culprit)
