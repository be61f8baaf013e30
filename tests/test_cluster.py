"""Compare and replay on a Dask LocalCluster (loopback, 2 workers), and the two-tier flow."""

import json
import os
import subprocess
import sys

import pytest

from accuracy.compare import batches, compare
from accuracy.dumper import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.replay import replay

distributed = pytest.importorskip("distributed")
sim = pytest.importorskip("accuracy.device_backend").sim

FAULT = dict(op="aten.native_layer_norm.default", module="encoder.layers.1.*", kind="bias",
             value=0.05)


def _dump(path, mode="tensor", faulty=False, **kw):
    if faulty:
        fault = sim.fault(FAULT["op"], module=FAULT["module"], kind="bias", value=0.05)
        with sim(profile="fp16-cube", faults=[fault]), dumper(str(path), mode, **kw):
            lm_step(tiny_lm(), lm_batch())
    else:
        with dumper(str(path), mode, **kw):
            lm_step(tiny_lm(), lm_batch())
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    return {"golden": _dump(d / "golden.h5"), "device": _dump(d / "device.h5", faulty=True),
            "dir": d}


@pytest.fixture(scope="module")
def client():
    from accuracy.cluster import dask_client

    with dask_client("local:2", timeout=60) as c:
        yield c


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(batches, "BATCH_BYTES", 256 << 10)  # many batches even on a tiny dump


def _same_rows(a, b):
    """Rows equal value for value (NaN equal to NaN, as the report files write them)."""
    return json.dumps(a, default=str) == json.dumps(b, default=str)


def _culprit(rep):
    c = rep.summary["culprit"]
    return c and (c["op"], c["seq_my"], c["io"], c["tensor_index"])


def test_compare_on_cluster_gives_the_local_rows_and_culprit(dumps, client, small_batches):
    from accuracy.compare.cluster import DaskRunner

    local = compare(dumps["device"], dumps["golden"])
    remote = compare(dumps["device"], dumps["golden"], runner=DaskRunner(client))
    assert len(remote.rows) == len(local.rows) > 0 and _same_rows(remote.rows, local.rows)
    assert _culprit(remote) == _culprit(local)
    assert remote.summary["culprit"]["op"] == FAULT["op"]
    assert remote.summary["bytes_compared"] == local.summary["bytes_compared"] > 0


def test_killed_worker_batch_is_rerun_and_report_is_complete(dumps, client, small_batches,
                                                            tmp_path):
    from accuracy.cluster import map_in_order
    from tests._support.cluster_tasks import die_once_then_compare, killed_pid

    marker = str(tmp_path / "killed")
    pids_before = set(client.run(os.getpid).values())

    def runner(batches, algs):
        return map_in_order(client, die_once_then_compare, batches, algs, marker,
                            name="test-kill")

    local = compare(dumps["device"], dumps["golden"])
    remote = compare(dumps["device"], dumps["golden"], runner=runner)
    assert killed_pid(marker) in pids_before  # a worker really died mid-compare
    assert _same_rows(remote.rows, local.rows)
    assert _culprit(remote) == _culprit(local)
    client.wait_for_workers(2, timeout=60)  # the nanny restarted it for the next tests


def _verdicts(rep):
    # Not the ratios themselves: a worker runs torch on one thread, and a reduction summed in
    # another order can make the same-dtype reference bit-exact or not (ratio 1 vs 0.64).
    return [(r["my_address"], r["verdict"], r["local_verdict"]) for r in rep.rows]


def test_metrics_only_replay_gives_full_replay_verdicts(dumps, client):
    from accuracy.dumpfile import load_dump
    from accuracy.replay.cluster import DaskReplayRunner

    d = dumps["dir"]
    ops = ["aten.native_layer_norm*", "aten.addmm*", "aten.mm*", "aten.add.*"]  # kept short
    (d / "apart").mkdir(exist_ok=True)  # not beside the dump: it holds every byte itself
    full = replay(dumps["device"], d / "apart" / "full.h5", overwrite=True, ops=ops,
                  metrics_only=False)
    slim = replay(dumps["device"], d / "slim.h5", metrics_only=True, overwrite=True, ops=ops,
                  runner=DaskReplayRunner(client))
    assert (slim.ok, slim.skipped, slim.failed) == (full.ok, full.skipped, full.failed)
    with load_dump(d / "slim.h5") as f:
        assert f.attrs["mode"] == "metrics"
        assert not any(t.has_data for r in f.records for t in r.tensors)
    assert (d / "slim.h5").stat().st_size < (d / "apart" / "full.h5").stat().st_size / 5
    rep_full = compare(dumps["device"], dumps["golden"], d / "apart" / "full.h5")
    rep_slim = compare(dumps["device"], dumps["golden"], d / "slim.h5")
    assert _verdicts(rep_slim) == _verdicts(rep_full)
    assert any(v[2] == "error" for v in _verdicts(rep_full))
    assert _culprit(rep_slim) == _culprit(rep_full)


def _replay_figures(path):
    from accuracy.dumpfile import load_dump

    with load_dump(path) as f:
        return json.dumps([(r.seq, r.extra.get("replay")) for r in f.records], default=str)


REPLAYED = ["aten.mm*", "aten.addmm*", "aten.add.Tensor"]  # 42 ops: 3 batches of 16


@pytest.fixture(scope="module")
def whole(dumps):
    """An uninterrupted in-process replay of REPLAYED: (result, path)."""
    out = dumps["dir"] / "whole.h5"
    return replay(dumps["device"], out, ops=REPLAYED, metrics_only=True, overwrite=True), out


def test_replay_killed_worker_redoes_only_its_batch(dumps, client, whole, tmp_path):
    """A worker SIGKILLed inside a replay batch: the scheduler reruns that batch elsewhere,
    no other op is replayed twice, and the output is the one of an uninterrupted replay."""
    from accuracy.cluster import map_in_order
    from accuracy.dumpfile import load_dump
    from accuracy.replay import engine
    from tests._support.cluster_tasks import replay_logged

    whole, whole_path = whole
    logs = tmp_path / "logs"
    logs.mkdir()
    with load_dump(dumps["device"]) as d:
        first = min(r.seq for r in engine._select(d, REPLAYED))  # starts the first batch

    def runner(path, batches, on, upcast, metrics_only):
        return map_in_order(client, replay_logged, batches, path, on, upcast, metrics_only,
                            str(logs), first, name="test-replay-kill")

    res = replay(dumps["device"], tmp_path / "r.h5", ops=REPLAYED, metrics_only=True,
                 runner=runner)
    assert (logs / "killed").exists()  # a worker really died after its batch's first op
    ran = [int(x) for p in logs.glob("ran-*") for x in p.read_text().split()]
    assert len(set(ran)) == res.total == whole.total == 42
    assert sorted(ran) == sorted([*set(ran), first])  # only the killed op's batch redone
    assert _replay_figures(tmp_path / "r.h5") == _replay_figures(whole_path)
    client.wait_for_workers(2, timeout=60)


def test_replay_on_cluster_resumes_what_it_finished(dumps, client, whole, tmp_path):
    """The client interrupted after 2 of 3 batches: --resume sends only the rest out."""
    from accuracy.replay.cluster import DaskReplayRunner

    whole, whole_path = whole
    sent: list[int] = []

    def interrupted(path, batches, *args):
        for i, out in enumerate(DaskReplayRunner(client)(path, batches, *args)):
            if i == 2:
                raise KeyboardInterrupt  # Ctrl-C on the client, two batches written
            yield out

    def counting(path, batches, *args):
        sent.extend(s for b in batches for s in b)
        return DaskReplayRunner(client)(path, batches, *args)

    out = tmp_path / "r.h5"
    with pytest.raises(KeyboardInterrupt):
        replay(dumps["device"], out, ops=REPLAYED, metrics_only=True, runner=interrupted)
    assert not out.exists() and (tmp_path / "r.h5.partial").exists()
    again = replay(dumps["device"], out, ops=REPLAYED, metrics_only=True, resume=True,
                   runner=counting)
    assert again.resumed == 32 and len(sent) == 10 == again.total - again.resumed
    assert _replay_figures(out) == _replay_figures(whole_path)
    assert (again.ok, again.skipped, again.failed) == (whole.ok, whole.skipped, whole.failed)


def _rank_copy(src, dst, rank, world_size=2):
    import shutil

    import h5py

    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs["rank"], f.attrs["world_size"] = rank, world_size
        from tests._support.crafted import reseal

        reseal(f)  # the attributes' hash, recomputed for the new rank
    return str(dst)


def test_each_rank_goes_to_the_workers_that_can_read_its_files(dumps, client, small_batches,
                                                                tmp_path):
    """Two ranks' dumps, each on one worker's 'disk' only: every batch of a multi-rank
    compare runs on the worker that can read its rank's files; a pair no single worker can
    read is refused with a clear error before anything runs."""
    from distributed import get_task_stream

    from accuracy.cluster import ClusterError
    from accuracy.compare.cluster import DaskRunner
    from accuracy.compare.multirank import compare_ranks
    from tests._support.cluster_tasks import hide, unhide

    client.wait_for_workers(2, timeout=60)
    w1, w2 = sorted(client.scheduler_info()["workers"])
    files = {(side, rank): _rank_copy(dumps[src], tmp_path / f"{side}_rank{rank}.h5", rank)
             for side, src in (("m", "device"), ("g", "golden")) for rank in (0, 1)}
    pattern = [str(tmp_path / f"{side}_rank{{rank}}.h5") for side in ("m", "g")]
    local = compare_ranks(*pattern)
    client.run(hide, [files["m", 0], files["g", 0]], workers=[w2])
    client.run(hide, [files["m", 1], files["g", 1]], workers=[w1])
    try:
        with get_task_stream(client) as ts:  # a misplaced batch fails: its worker cannot open
            remote = compare_ranks(*pattern, runner=DaskRunner(client, retries=0))
        for rank in (0, 1):
            assert _same_rows(remote.per_rank[rank].rows, local.per_rank[rank].rows)
        runs: dict[str, list] = {}  # keys are accuracy-compare-<token of the call>-<batch>
        for t in ts.data:
            if str(t["key"]).startswith("accuracy-compare-"):
                runs.setdefault(str(t["key"]).split("-")[2], []).append(t)
        calls = sorted(runs.values(), key=lambda ts: min(s["start"] for t in ts
                                                         for s in t["startstops"]))
        assert len(calls) == 2 and all(len(c) > 1 for c in calls)  # one call per rank
        # each rank's call on one worker, the two on different ones (which rank is which is
        # proven above: with retries=0 a batch sent to the worker that cannot open its files
        # fails the compare; start times do not order the calls under load)
        assert sorted(({t["worker"] for t in c} for c in calls), key=sorted) == [{w1}, {w2}]
        with pytest.raises(ClusterError, match="different nodes"):
            compare(files["m", 0], files["g", 1], runner=DaskRunner(client))
        client.run(hide, [files["m", 0]], workers=[w1])
        with pytest.raises(ClusterError, match="no Dask worker can read"):
            compare(files["m", 0], files["g", 0], runner=DaskRunner(client))
        # a host restriction (what Placement gives for a node's local disk) is one Dask runs
        assert client.submit(os.getpid, workers=["127.0.0.1"], allow_other_workers=False,
                             pure=False).result(timeout=60) > 0
    finally:
        client.run(unhide)


def test_two_tier_flow_names_the_full_dump_culprit(dumps, tmp_path):
    from accuracy.compare.suspects import select_suspects, write_selection

    full = compare(dumps["device"], dumps["golden"])
    g, m = _dump(tmp_path / "g_stats.h5", "statistics"), _dump(
        tmp_path / "m_stats.h5", "statistics", faulty=True)
    compare(m, g).write(tmp_path / "stats_report", ("json",))
    sel = select_suspects(tmp_path / "stats_report")
    ends = [x["why"] for x in sel["my"] if x["why"].startswith("end of module")]
    # the end of the call each suspect runs in, not every row of its modules (all calls,
    # the optimizer's updates of their parameters)
    assert max(map(ends.count, ends), default=0) <= len(sel["suspects"])
    path = write_selection(sel, tmp_path / "suspects.json")
    g2 = _dump(tmp_path / "g_sel.h5", select=path)
    m2 = _dump(tmp_path / "m_sel.h5", faulty=True, select=path)
    second = compare(m2, g2)
    assert _culprit(second) == _culprit(full)
    assert second.summary["culprit"]["op"] == FAULT["op"]
    assert 0 < second.summary["ops_my"] <= len(sel["my"]) < full.summary["ops_my"] / 5
    assert os.path.getsize(m2) < os.path.getsize(dumps["device"]) / 3


def test_selection_file_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a selection written by `accuracy suspects`"):
        dumper(str(tmp_path / "x.h5"), select=bad)
    with pytest.raises(FileNotFoundError, match="accuracy suspects"):
        dumper(str(tmp_path / "x.h5"), select=tmp_path / "missing.json")


def _cli(*args, check_dask=False):
    code = ("import sys; from accuracy.cli import main; rc = main(sys.argv[1:]); "
            + ("assert 'distributed' not in sys.modules and 'dask' not in sys.modules, "
               "'dask imported'; " if check_dask else "") + "sys.exit(rc)")
    # Each run its own hash seed: module rows that end at the same op must come out in one
    # order whatever the seed (compare.align once ordered them by a set).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=180, start_new_session=True, env=env)


def test_cli_without_cluster_does_not_import_dask(dumps, tmp_path):
    p = _cli("compare", "-m", dumps["device"], "-g", dumps["golden"], "-o", tmp_path / "rep",
             "--no-progress", check_dask=True)
    assert p.returncode == 0, p.stderr
    p = _cli("replay", dumps["device"], "-o", tmp_path / "r.h5", "--metrics-only", "-q",
             "--op", "aten.mm*", check_dask=True)
    assert p.returncode == 0, p.stderr


def test_cli_cluster_local_report_matches_and_bad_spec_is_refused(dumps, tmp_path, capsys):
    from accuracy.cli import main

    p = _cli("compare", "-m", dumps["device"], "-g", dumps["golden"], "-o", tmp_path / "a",
             "--no-progress", "--formats", "json")
    assert p.returncode == 0, p.stderr
    p = _cli("compare", "-m", dumps["device"], "-g", dumps["golden"], "-o", tmp_path / "b",
             "--no-progress", "--formats", "json", "--cluster", "local:1")
    assert p.returncode == 0, p.stderr
    rows_a = json.loads((tmp_path / "a" / "rows.json").read_text())
    rows_b = json.loads((tmp_path / "b" / "rows.json").read_text())
    assert rows_a and _same_rows(rows_a, rows_b)
    rc = main(["compare", "-m", str(dumps["device"]), "-g", str(dumps["golden"]),
               "--cluster", "lcoal:2"])
    assert rc == 2 and "write local:N" in capsys.readouterr().err


def _open_on_workers():
    from accuracy.compare import cluster

    return sorted(cluster._READER["files"])


def _forget_open_files():
    from accuracy.compare import cluster

    with cluster._LOCK:
        if cluster._READER["reader"] is not None:
            cluster._READER["reader"].close()
        cluster._READER["reader"], cluster._READER["files"] = None, {}


def test_workers_open_the_dumps_while_the_client_aligns(dumps, client):
    """compare() hands the runner its dumps as it starts; the workers say what they see and
    open those dumps then, so the first task does not open them (~18 ms per dump, per
    worker) and the placement question is answered before the batches exist."""
    from accuracy.compare.cluster import DaskRunner

    client.wait_for_workers(2, timeout=60)
    paths = sorted(str(dumps[k].resolve()) for k in ("device", "golden"))
    asked: list[list[str]] = []

    class Runner(DaskRunner):
        def prepare(self, p):
            asked.append(sorted(p))
            super().prepare(p)

    client.run(_forget_open_files)
    runner = Runner(client)
    runner.prepare(paths)
    runner._asked[1].result(timeout=60)  # noqa: SLF001 - the answers it waits for
    assert list(client.run(_open_on_workers).values()) == [paths, paths]  # no task ran
    local = compare(dumps["device"], dumps["golden"])
    asked.clear()
    remote = compare(dumps["device"], dumps["golden"], runner=Runner(client))
    assert asked == [sorted(str(dumps[k]) for k in ("device", "golden"))]  # compare asked
    assert _same_rows(remote.rows, local.rows)


def test_opening_ahead_never_closes_a_file_a_task_may_be_reading(tmp_path):
    """A dump replaced at the same path while a worker has the old one open: opening ahead
    (on the worker's event loop) leaves the open reader alone; the next task reopens."""
    import shutil

    from accuracy.compare import cluster

    a = tmp_path / "a.h5"
    shutil.copy(_dump(tmp_path / "src.h5"), a)
    _forget_open_files()
    try:
        reader = cluster._reader_for_paths({str(a)})
        before = reader.dump(str(a))
        st = os.stat(a)
        os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "another file" now
        view = cluster.see_and_open([str(a)], cluster.signatures([str(a)]))
        assert view[str(a)] is not None
        assert cluster._READER["reader"] is reader and reader.dump(str(a)) is before
        assert cluster._reader_for_paths({str(a)}) is not reader  # a task reopens it
    finally:
        _forget_open_files()


def test_a_failed_first_answer_is_asked_again(dumps, client):
    """When the question asked as compare() starts failed, placement asks the workers again
    (as it did before it was asked early) and the compare completes with the local rows."""
    from accuracy.cluster import Asked
    from accuracy.compare.cluster import DaskRunner
    from tests._support.cluster_tasks import refuse_to_answer

    failed: list[Asked] = []

    class Runner(DaskRunner):
        def prepare(self, p):
            paths = sorted(os.path.abspath(x) for x in p)
            failed.append(Asked(self.client, refuse_to_answer, paths, {}))
            self._asked = (frozenset(paths), failed[-1])

    client.wait_for_workers(2, timeout=60)
    local = compare(dumps["device"], dumps["golden"])
    remote = compare(dumps["device"], dumps["golden"], runner=Runner(client))
    with pytest.raises(OSError, match="could not answer"):
        failed[0].result(timeout=60)
    assert _same_rows(remote.rows, local.rows)
