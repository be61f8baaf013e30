"""Replay's cheaper defaults: figures only unless tensors are asked for, each stored byte range
read once (whatever shapes its uses give it), reads running ahead on a second thread."""

from __future__ import annotations

import torch

from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumper.core import dumper
from accuracy.dumpfile import load_dump
from accuracy.dumpfile.reader import Dump
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.replay import replay


def _figures(path):
    with load_dump(path) as d:
        return {r.seq: r.extra["replay"] for r in d.records}


def test_default_stores_figures_only_and_compare_concludes_the_same(tmp_path):
    batch = lm_batch(batch=2, seq=16)
    gold, dev = tmp_path / "gold.h5", tmp_path / "dev.h5"
    with dumper(gold):
        lm_step(tiny_lm(), batch)
    fault = sim.fault("aten.addmm.default", module="encoder.layers.1.*", kind="bias",
                      value=0.05, occurrence=0)
    with sim(profile="fp16-cube", faults=[fault]), dumper(dev):
        lm_step(tiny_lm(), batch)
    slim = replay(dev, tmp_path / "slim.h5")
    full = replay(dev, tmp_path / "full.h5", metrics_only=False)
    assert slim.ok == full.ok and slim.failed == 0
    with load_dump(tmp_path / "slim.h5") as s, load_dump(tmp_path / "full.h5") as f:
        assert s.attrs["mode"] == "metrics" and f.attrs["mode"] == "tensor"
        assert not any(t.has_data for t in s.tensors)
        assert sum(t.has_data for t in f.tensors) > 100
    assert _figures(tmp_path / "slim.h5") == _figures(tmp_path / "full.h5")
    a = compare(dev, gold, replay=tmp_path / "slim.h5")
    b = compare(dev, gold, replay=tmp_path / "full.h5")
    keys = ("local_error_ratio", "local_bound", "local_verdict", "verdict")
    assert [[r.get(k) for k in keys] for r in a.rows] == [[r.get(k) for k in keys]
                                                          for r in b.rows]
    assert a.culprit is not None and a.culprit == b.culprit
    assert "encoder.layers.1" in str(a.culprit)


def test_each_stored_byte_range_is_read_once(tmp_path, monkeypatch):
    path = tmp_path / "views.h5"
    with dumper(path):
        x = torch.randn(6, 8)
        y = x.exp()
        z = y.view(48).view(4, 12).unsqueeze(0)  # three uses of y's bytes, three shapes
        (z * 2).sum()
    with load_dump(path) as d:
        ranges = {(t.offset, t.nbytes) for t in d.tensors if t.has_data}
        shared = [t for t in d.tensors if t.has_data and t.is_link]
        assert shared  # the views' outputs link to y's bytes
    reads: list[tuple[int, int]] = []
    real = Dump.read_tensor_mapped

    def counting(self, t):
        reads.append((t.offset, t.nbytes))
        return real(self, t)

    monkeypatch.setattr(Dump, "read_tensor_mapped", counting)
    r = replay(path, tmp_path / "r.h5")
    assert r.failed == 0 and r.ok >= 5
    assert len(reads) == len(set(reads)) and set(reads) <= ranges  # each range at most once
    with load_dump(path) as d:  # what the replayed ops made is proven by its content hash
        x_range = next((t.offset, t.nbytes) for t in d.records[1].inputs)
    assert reads == [x_range]  # so only x, the input no replayed op made, is read
    for info in _figures(tmp_path / "r.h5").values():
        assert all(o["bit_exact"] and o["error_ratio"] == 1.0 for o in info["outputs"])
