"""A cluster replay worker reads like an in-process replay: each stored byte range once
across its tasks, the reads running ahead on the reader thread (no Dask needed: `run_ops` is
the task function)."""

from __future__ import annotations

import threading

import torch

from accuracy.dumper.core import dumper
from accuracy.dumpfile import load_dump
from accuracy.dumpfile.reader import Dump
from accuracy.replay import replay
from accuracy.replay.cluster import run_ops


def test_worker_tasks_read_each_range_once_ahead_on_a_thread(tmp_path, monkeypatch):
    path = tmp_path / "views.h5"
    with dumper(path):
        x = torch.randn(6, 8)
        y = x.exp()
        z = y.view(48).view(4, 12).unsqueeze(0)  # three uses of y's bytes, three shapes
        (z * 2).sum()
    with load_dump(path) as d:
        seqs = [r.seq for r in d.records]
        ranges = {(t.offset, t.nbytes) for t in d.tensors if t.has_data}
        x = next((t.offset, t.nbytes) for t in d.records[0].outputs)  # randn's draw
    replay(path, tmp_path / "local.h5")
    with load_dump(tmp_path / "local.h5") as d:
        local = {r.seq: r.extra["replay"] for r in d.records}
    reads: list[tuple[int, int, str]] = []
    real = Dump.read_tensor_mapped

    def counting(self, t):
        reads.append((t.offset, t.nbytes, threading.current_thread().name))
        return real(self, t)

    monkeypatch.setattr(Dump, "read_tensor_mapped", counting)
    out = []
    for i in range(0, len(seqs), 2):  # several tasks on one worker thread
        out += run_ops(seqs[i:i + 2], str(path), "cpu", "fp64", True)
    # each range at most once; what the replayed ops made is proven by its content hash, so
    # only x (drawn by randn, an op replay refuses) is read
    assert x in ranges and [(o, n) for o, n, _ in reads] == [x]
    assert all(name.startswith("accuracy-replay-read") for *_, name in reads)
    assert {o.seq: o.replay_extra() for o in out} == local
    assert all(not o.tensors for o in out)
