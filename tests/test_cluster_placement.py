"""cluster.Placement's decisions from the workers' answers (no cluster started: the answers
of a 3-node cluster are given by a stand-in for client.run)."""

import os

import pytest

pytest.importorskip("distributed")

from accuracy.cluster import ClusterError, Placement  # noqa: E402

A1, A2, B1, B2, C1 = ("tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002", "tcp://10.0.0.2:4001",
                      "tcp://10.0.0.2:4002", "tcp://10.0.0.3:4001")


class _Client:
    """Answers client.run(file_view, paths) with what each worker is said to see."""

    def __init__(self, sees):
        self.sees = sees

    def run(self, fn, paths):
        return {w: {p: (f"node of {w}", *sig) if (sig := self.sees[w].get(p)) else None
                    for p in paths} for w in self.sees}


def _sig(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def test_local_disks_give_host_restrictions_shared_storage_none(tmp_path):
    shared, on_a, on_b, elsewhere = (tmp_path / n for n in ("s.h5", "a.h5", "b.h5", "x.h5"))
    for p in (shared, on_a, on_b, elsewhere):
        p.write_bytes(b"x" * 10)
    s, a, b, x = map(str, (shared, on_a, on_b, elsewhere))
    sees = {w: {s: _sig(s), x: (10, 1)} for w in (A1, A2, B1, B2, C1)}  # x: another file
    sees[A1][a] = sees[A2][a] = _sig(a)  # a on node A's disk
    sees[B1][b] = _sig(b)  # b seen by one of node B's workers only (another mount)
    pl = Placement(_Client(sees), [s, a, b, x, s])
    assert pl.workers_for([s]) is None  # every worker: no restriction
    assert pl.workers_for([s, a]) == ["10.0.0.1"]  # node A: a restarted worker qualifies
    assert pl.workers_for([b]) == [B1]  # only that worker of node B
    with pytest.raises(ClusterError, match="different nodes"):
        pl.workers_for([a, b])
    with pytest.raises(ClusterError, match="no Dask worker can read .*x.h5"):
        pl.workers_for([x])  # same name, but not the file this process reads
