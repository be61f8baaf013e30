"""Many ranks: 2 CPU ranks with gloo record collectives truly, replay skips and checks them,
and the merged compare names the faulty rank while the healthy one only inherits.

One pair of rank processes (tests/_support/multirank_worker.py) runs every scenario, started once
for the module: importing torch in a fresh process dominates the cost here.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import h5py
import pytest
import torch

from accuracy.cli import main
from accuracy.compare.multirank import compare_ranks
from accuracy.dumper.core import dumper
from accuracy.dumpfile import schema
from accuracy.dumpfile.reader import load_dump
from accuracy.dumpfile.writer import DumpWriter, OpEntry, TensorEntry
from accuracy.records import CallSite
from accuracy.replay.collectives import check_collectives, replay_ranks
from tests._support.crafted import as_vlen_op_table
from tests._support.ranks import run_ranks

WORLD = 2
SCENARIOS = ("functional,dtensor,fsdp,ranks,ddp-golden,ddp-fault,ddp-fp16,fsdp-gold-a,"
             "fsdp-gold-b,fsdp-fault,fsdp-fault-bf16,fsdp-live,fsdp-overflow,fsdp-monitor,"
             "tp-gold,tp-sim,tp-scale,tp-monitor,ddp-monitor-one-rank,fsdp-steps")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Both ranks run every scenario once; each rank in its own process group, bounded."""
    out = tmp_path_factory.mktemp("ranks")
    worker = [sys.executable, "-m", "tests._support.multirank_worker", SCENARIOS, str(out)]
    run_ranks([worker] * WORLD)
    return out


def _result(runs: Path, scenario: str, rank: int) -> dict:
    return json.loads((runs / scenario / f"result_{rank}.json").read_text())


def _one(d, name: str):
    (rec,) = [r for r in d.records if r.op == name]
    return rec


def test_collective_outputs_are_the_reduced_tensors(runs):
    inputs = []
    for rank in range(WORLD):
        res = _result(runs, "functional", rank)
        with load_dump(runs / "functional" / f"run_{rank}.h5") as d:
            ar = _one(d, "c10d.allreduce_.default")
            inputs.append(ar.inputs[0].load())
            # the recorded output is what all_reduce really left in the tensor, on every rank
            assert ar.outputs[0].load().tolist() == res["buf"]
            assert ar.outputs[0].first != ar.inputs[0].first  # not linked to pre-reduce bytes
            ag = _one(d, "c10d.allgather_.default")
            assert [t.load().tolist() for t in ag.outputs] == res["gathered"]
            fr = _one(d, "_c10d_functional.all_reduce.default")
            assert fr.outputs[0].load().tolist() == res["y"]
            # a later op reading the reduced tensor sees the reduced values, not a stale record
            assert _one(d, "aten.add.Tensor").inputs[0].load().tolist() == res["y"]
            # epochs: 3 collectives in order, each op tagged with how many came before it
            coll = [r for r in d.records if "collective" in r.extra
                    and r.extra["collective"]["kind"] != "wait"]
            assert [r.epoch for r in coll] == [0, 1, 2]
            assert _one(d, "aten.add.Tensor").epoch == 1  # after the first collective
            note = ar.extra["collective"]
            assert note["kind"] == "all_reduce" and note["reduce_op"] == "sum"
            assert note["group_ranks"] == [0, 1] and note["issued"] > 0
            assert d.attrs["local_rank"] == rank and d.attrs["collectives"] == 3
            assert d.attrs["process_group"]["backend"] == "gloo"
    assert torch.equal(torch.stack(inputs).sum(0),
                       torch.tensor(_result(runs, "functional", 0)["buf"]))


def test_dtensor_and_functional_record_and_replay_skips_collectives(runs, tmp_path):
    for scenario in ("functional", "dtensor"):
        for rank in range(WORLD):
            with load_dump(runs / scenario / f"run_{rank}.h5") as d:
                assert d.attrs["complete"] and len(d.records) > 5
        results, counts = replay_ranks(runs / scenario / "run_{rank}.h5",
                                       tmp_path / (scenario + "_{rank}.h5"))
        assert set(results) == {0, 1} and counts["checked"] >= 2 and counts["mismatched"] == 0
        with load_dump(tmp_path / f"{scenario}_0.h5") as rp:
            for r in rp.records:
                if r.op.startswith(("c10d.", "_c10d_functional.")):
                    assert r.extra["replay"]["reason"].startswith("collective"), r.op
    with load_dump(runs / "dtensor" / "run_0.h5") as d:
        assert d.attrs["device_meshes"][0]["shape"] == [WORLD]
        assert any("dtensor" in r.extra for r in d.records)


def test_fsdp2_records_and_its_collectives_check_out(runs, tmp_path):
    """fully_shard frees parameter storage by resizing it: recording must leave it resizable,
    and the reduce-scatter input written by a custom op must not be a stale record."""
    results, counts = replay_ranks(runs / "fsdp" / "run_{rank}.h5", tmp_path / "r_{rank}.h5")
    assert counts == {"checked": 12, "unchecked": 0, "mismatched": 0, "p2p_checked": 0,
                      "p2p_unchecked": 0, "p2p_mismatched": 0, "p2p_unpaired_sends": 0}
    with load_dump(runs / "fsdp" / "run_0.h5") as d:
        kinds = [r.extra["collective"]["kind"] for r in d.records if "collective" in r.extra]
        assert kinds.count("all_gather") == 4 and kinds.count("reduce_scatter") == 2


def test_ranks_filter_records_only_the_chosen_ranks(runs):
    assert not (runs / "ranks" / "run_0.h5").exists()
    assert _result(runs, "ranks", 0) == {"active": False, "t": [3.0, 3.0, 3.0]}
    with load_dump(runs / "ranks" / "run_1.h5") as d:
        assert d.attrs["ranks_recorded"] == [1]
        assert [r.op for r in d.records if r.op.startswith("c10d")] == ["c10d.allreduce_.default"]


def test_ddp_fault_on_rank_1_names_rank_1_and_spares_rank_0(runs, tmp_path):
    dev, gold = runs / "ddp-fault", runs / "ddp-golden"
    replay_ranks(dev / "run_{rank}.h5", tmp_path / "replay_{rank}.h5")
    report = compare_ranks(dev / "run_{rank}.h5", gold, tmp_path / "replay_{rank}.h5")
    s = report.summary
    assert s["first_rank"] == 1
    assert s["culprit"]["rank"] == 1 and s["culprit"]["op"] == "aten.addmm.default"
    r0, r1 = s["ranks"]
    assert r0["culprit"] is None and r0["label"] == "inherited"
    assert r0["inherited"]["via"] == "c10d.allreduce_.default"
    assert r1["label"] == "culprit" and r1["culprit"]["op"] == "aten.addmm.default"
    # the bucket all-reduce output is the sum of both ranks' recorded inputs (checked offline)
    with load_dump(tmp_path / "replay_0.h5") as rp:
        (ar,) = [r for r in rp.records if r.op == "c10d.allreduce_.default"]
        assert ar.extra["replay"]["outputs"][0]["error_ratio"] <= 2
    paths = report.write(tmp_path / "report", ("json", "csv", "html"))
    rows = list(csv.DictReader(paths["csv"].open()))
    assert {r["Rank"] for r in rows} == {"0", "1"}
    assert (tmp_path / "report" / "rank1" / "index.html").exists()
    assert "diverged first" in paths["html"].read_text()


def test_cli_pairs_by_rank_and_refuses_mismatches(runs, tmp_path, capsys):
    dev, gold = runs / "ddp-fault", runs / "ddp-golden"
    assert main(["compare", "-m", str(dev / "run_0.h5"), "-g", str(gold / "run_1.h5")]) == 2
    assert "rank 0" in capsys.readouterr().err
    code = main(["compare", "-m", str(dev / "run_{rank}.h5"), "-g", str(gold), "-o",
                 str(tmp_path / "rep"), "--formats", "json,csv"])
    out = capsys.readouterr().out
    assert code == 0 and "diverged first: rank 1" in out
    # rank 0 only inherited the error through the all-reduce: labelled so, never a culprit
    assert re.search(r"rank 0: \w+ +inherited via c10d\.allreduce_\.default", out), out
    # the culprit's number is its Index in the merged rows.csv (and #M in rank1's own)
    m = re.search(r"rank 1: \w+ +culprit #(\d+) \(rank1/rows\.csv #(\d+)\) (\S+)", out)
    assert m, out
    merged = {r["Index"]: r for r in csv.DictReader(open(tmp_path / "rep" / "rows.csv"))}
    own = {r["Index"]: r for r in csv.DictReader(open(tmp_path / "rep" / "rank1" / "rows.csv"))}
    assert merged[m[1]]["Rank"] == "1" and merged[m[1]]["Op"] == m[3] == own[m[2]]["Op"]
    assert merged[m[1]]["NPU Name"] == own[m[2]]["NPU Name"]
    assert (own[m[2]]["Rank"], own[m[2]]["Epoch"]) == ("1", merged[m[1]]["Epoch"])
    assert all(r["Rank"] == "1" for r in own.values())
    single = tmp_path / "single"
    single.mkdir()
    with dumper(single / "run.h5"):  # a one-rank run: world size 1
        torch.ones(2).sum()
    assert main(["compare", "-m", str(dev), "-g", str(single)]) == 2
    assert "world sizes differ" in capsys.readouterr().err


def _write_rank(path: Path, rank: int, x: torch.Tensor, y: torch.Tensor) -> None:
    w = DumpWriter(path, {"mode": "tensor", "rank": rank, "world_size": 2})
    entries = []
    for io, t in ((schema.INPUT, x), (schema.OUTPUT, y)):
        row = w.new_row()
        entries.append(TensorEntry(row=row, seq=0, io=io, idx=0, dtype="float32",
                                   shape=tuple(t.shape), stride=tuple(t.stride()), device="cpu",
                                   stats=None, data=t.clone(), first=row,
                                   nbytes=t.numel() * 4))
    note = {"kind": "all_reduce", "reduce_op": "sum", "group": "0", "group_ranks": [0, 1],
            "group_index": 0}
    w.add_op(OpEntry(CallSite(0, "c10d.allreduce_.default", "backward", "", ""), stack="",
                     args="{}", n_in=1, n_out=1, extra={"collective": note}, epoch=0), entries)
    w.close({}, complete=True)


def test_the_rank_placeholder_stands_for_a_number_only(tmp_path):
    """'g/{rank}.h5' names g/0.h5 and g/1.h5, not the g/replay_0.h5 a replay wrote beside them
    (that once stopped replay --overwrite and compare: 'both hold rank 0')."""
    from accuracy.ranks import find_rank_files

    a = torch.randn(8)
    for r in (0, 1):
        _write_rank(tmp_path / f"{r}.h5", r, a, a)
        _write_rank(tmp_path / f"replay_{r}.h5", r, a, a)
        _write_rank(tmp_path / f"run_{r}_old.h5", r, a, a)
        _write_rank(tmp_path / f"run_{r}.h5", r, a, a)
    for stem in ("", "run_"):
        files = find_rank_files(tmp_path / f"{stem}{{rank}}.h5").files
        assert files == {r: tmp_path / f"{stem}{r}.h5" for r in (0, 1)}


def test_offline_check_catches_a_broken_all_reduce(tmp_path):
    a, b = torch.randn(64), torch.randn(64)
    good = a + b
    _write_rank(tmp_path / "r0.h5", 0, a, good)
    _write_rank(tmp_path / "r1.h5", 1, b, good * 1.01)  # a communication library gone wrong
    dumps = {r: load_dump(tmp_path / f"r{r}.h5") for r in (0, 1)}
    try:
        out = check_collectives(dumps)
    finally:
        for d in dumps.values():
            d.close()
    assert out[0][0].outputs[0]["error_ratio"] <= 2
    assert out[1][0].outputs[0]["error_ratio"] > 1000


def test_schema_1_dump_reads_with_epoch_unknown(tmp_path):
    path = tmp_path / "old.h5"
    with dumper(path):
        torch.ones(3).mul(2)
    with h5py.File(path, "r+") as f:  # rewrite as a schema-1 file: op rows without epoch
        as_vlen_op_table(f, schema.OP_ROW_V1)
        f.attrs["schema_version"] = 1
        del f[schema.BATCHES]  # a schema-1 file has no metadata hashes
        del f.attrs["attrs_hash"]
    with load_dump(path) as d:
        assert d.records and all(r.epoch == schema.UNKNOWN_EPOCH for r in d.records)


def test_server_shows_ranks(runs):
    """Runs carry their rank (API model and runs list); a multi-rank report page its ranks.
    Rendered in-process: a live server indexes files in a child process (slow here)."""
    from types import SimpleNamespace

    from accuracy.server.db import Run
    from accuracy.server.routers.ui import templates
    from accuracy.server.schemas import RunOut

    dev, gold = runs / "ddp-fault", runs / "ddp-golden"
    listed = []
    for rank in range(WORLD):
        with load_dump(dev / f"run_{rank}.h5") as d:
            summary = d.summary()
        listed.append(Run(id=f"{rank:032d}", name=f"dev {rank}", source="register", path="",
                          created="now", ops=1, complete=True, file_bytes=1,
                          summary=json.dumps(summary, default=str)))
        assert (RunOut.of(listed[-1]).rank, RunOut.of(listed[-1]).world_size) == (rank, WORLD)
    page = templates.env.get_template("runs.html").render(runs=listed, reports=[], jobs=[])
    assert "<td>0/2</td>" in page and "<td>1/2</td>" in page
    s = compare_ranks(dev / "run_{rank}.h5", gold).summary
    page = templates.env.get_template("report.html").render(
        report=SimpleNamespace(id="r", name="ddp"), summary=s, counts=s["counts"], rows=[],
        total=s["rows"], culprit=s["culprit"], first_divergence=s["first_divergence"],
        suspects=s["suspects"])
    assert "diverged first: rank 1" in page
    assert re.search(r'rank 0 <span class="pill v-\w+">\w+</span> inherited', page), page


# -- FSDP2, tensor parallel, DDP under a lower precision (issue 25) ---------------------------


def test_fsdp2_gold_vs_gold_judges_no_uninitialised_bytes(runs, tmp_path):
    """Two identical CPU runs: the all-gather buffers are uninitialised until the copy-in and
    the all-gather fill them; their views are recorded as not data and never judged."""
    a, b = runs / "fsdp-gold-a", runs / "fsdp-gold-b"
    s = compare_ranks(a / "x_{rank}.h5", b).summary
    assert s["counts"].get("error", 0) == 0 and s["counts"].get("warning", 0) == 0, s["counts"]
    assert s["first_rank"] is None and s["culprit"] is None
    with load_dump(a / "x_0.h5") as d:
        (cin, *_) = [r for r in d.records if r.op == "fsdp.all_gather_copy_in.default"]
        # the buffer going in, and the buffer coming out (half of it another rank's, still
        # unfilled) are not data; this rank's shard (output 0) is
        assert cin.extra["uninitialized_io"] == {"input": [2], "output": [1]}
        assert cin.outputs[0].has_data and not cin.outputs[1].has_data
        ag = next(r for r in d.records if r.op == "c10d._allgather_base_.default")
        assert ag.outputs[0].has_data  # filled by the all-gather: data again
    # with the replay: AdamW's in-place updates of the DTensor parameters' local shards bump
    # no version counter, and a stale record of a shard would be a false local error
    replay_ranks(a / "x_{rank}.h5", tmp_path / "r_{rank}.h5")
    s = compare_ranks(a / "x_{rank}.h5", b, tmp_path / "r_{rank}.h5").summary
    assert s["counts"].get("error", 0) == 0, s["counts"]
    with load_dump(tmp_path / "r_0.h5") as rp:
        steps = [r for r in rp.records if r.op == "aten.addcdiv_.default"]
        assert steps and all(r.extra["replay"]["status"] == "ok" for r in steps)


def test_fsdp2_live_check_skips_unfilled_buffers_and_judges_the_compute(runs):
    """Live check over two FSDP2 steps (gold, CPU): the copy-in reads the all-gather buffer
    while other ranks' parts of it are unfilled (not judged, whatever it held), and every
    matmul and layer norm runs on parameters the all-gather filled (judged), also in the
    second step, whose parameters FSDP2 freed and brought back with `storage.resize_`."""
    compute = ("aten.addmm.default", "aten.mm.default", "aten.native_layer_norm.default",
               "aten.native_layer_norm_backward.default", "aten.gelu.default")
    for rank in range(WORLD):
        res = _result(runs, "fsdp-live", rank)
        assert res["errors"] == [] and "warning" not in res["counts"], res["counts"]
        ops = res["ops"]
        copy_in = [o for o in ops if o["op"] == "fsdp.all_gather_copy_in.default"]
        assert copy_in and all(o["status"] == "skipped" and
                               o["reason"].startswith("uninitialised memory") for o in copy_in)
        judged = [o for o in ops if o["op"] in compute]
        assert all(o["status"] == "ok" and o["verdict"] == "pass" for o in judged), [
            (o["seq"], o["op"], o["reason"]) for o in judged if o["status"] != "ok"]
        assert sum(o["op"] == "aten.addmm.default" for o in judged) == 4  # 2 linears x 2 steps


def test_fsdp2_fault_on_rank_1_is_found_and_rank_1_diverged_first(runs):
    s = compare_ranks(runs / "fsdp-fault" / "x_{rank}.h5", runs / "fsdp-gold-a").summary
    assert s["first_rank"] == 1
    assert s["culprit"]["rank"] == 1 and s["culprit"]["op"] == "aten.native_layer_norm.default"
    r0, r1 = s["ranks"]
    assert r1["label"] == "culprit" and r0["label"] == "inherited"
    assert r0["inherited"]["via"] == "c10d._reduce_scatter_base_.default"


def test_a_fault_below_the_error_threshold_still_makes_its_rank_first(runs, tmp_path):
    """bf16 on both ranks, a 1% fault in rank 1's layer norm: its output is not yet an
    accumulated error (the error grows later, on both ranks, after the collectives), but the
    kernel fault is where divergence starts: rank 1, at its epoch, diverged first."""
    dev = runs / "fsdp-fault-bf16" / "x_{rank}.h5"
    replay_ranks(dev, tmp_path / "r_{rank}.h5")
    s = compare_ranks(dev, runs / "fsdp-gold-a", tmp_path / "r_{rank}.h5").summary
    assert s["culprit"]["rank"] == 1 and s["culprit"]["op"] == "aten.native_layer_norm.default"
    assert s["first_rank"] == 1, [(e["rank"], e["label"]) for e in s["ranks"]]
    assert s["ranks"][1]["label"] == "culprit" and s["ranks"][0]["culprit"] is None


def test_ddp_inherited_label_names_the_recorded_all_reduce(runs):
    """Rank 0 at fp16 deviates a little before any collective (its own rounding); the error
    of rank 1 comes in through the recorded all-reduce, and the label says so."""
    s = compare_ranks(runs / "ddp-fp16" / "run_{rank}.h5", runs / "ddp-golden").summary
    r0 = s["ranks"][0]
    assert r0["label"] == "inherited", r0
    assert r0["inherited"]["via"] == "c10d.allreduce_.default"
    assert r0["inherited"]["epoch"] == 0


def test_tensor_parallel_under_sim_fp16_rounds_local_shards(runs):
    gold, dev = _result(runs, "tp-gold", 0), _result(runs, "tp-sim", 0)
    assert dev["y"] != gold["y"]  # rounded to fp16 inside the DTensor ops
    assert torch.allclose(torch.tensor(dev["y"]), torch.tensor(gold["y"]), rtol=1e-2, atol=1e-3)
    s = compare_ranks(runs / "tp-sim" / "run_{rank}.h5", runs / "tp-gold").summary
    assert s["counts"].get("error", 0) == 0, s["counts"]


def test_tensor_parallel_replay_reruns_dtensor_ops_and_a_different_scalar_is_named(runs,
                                                                                    tmp_path):
    dev = runs / "tp-scale" / "run_{rank}.h5"
    replay_ranks(dev, tmp_path / "r_{rank}.h5")
    with load_dump(runs / "tp-scale" / "run_0.h5") as d, load_dump(tmp_path / "r_0.h5") as rp:
        status = {r.seq: r.extra["replay"] for r in rp.records}
        on_dtensors = [r for r in d.records if "dtensor" in r.extra]
        ran = [r for r in on_dtensors if status[r.seq]["status"] == "ok"]
        assert any(r.op == "aten.addmm.default" for r in ran)  # the Colwise linear
        for r in on_dtensors:  # the rest: DTensor moved data inside them, said so
            if r not in ran:
                assert status[r.seq]["reason"].startswith("collective"), status[r.seq]
    # gold against itself with its replay: no op re-run on shards its kernel did not see
    # (RowwiseParallel's bias goes Replicate -> Partial inside addmm) gets a local error
    gold = runs / "tp-gold" / "run_{rank}.h5"
    replay_ranks(gold, tmp_path / "g_{rank}.h5")
    s = compare_ranks(gold, runs / "tp-gold", tmp_path / "g_{rank}.h5").summary
    assert s["counts"].get("error", 0) == 0 and s["culprit"] is None, s["counts"]
    s = compare_ranks(dev, runs / "tp-gold", tmp_path / "r_{rank}.h5").summary
    assert s["verdict"] == "error"
    cul = s["culprit"]
    assert cul["op"] == "aten.mul.Tensor" and "arguments differ" in cul["message"], cul
    assert "my 1.05, golden 1.0" in cul["message"]


def test_fsdp2_overflow_check_steps_on_dtensors_and_names_the_rank_it_came_from(runs):
    """check_overflow under FSDP2 with AdamW: the optimizer's zeros_like(DTensor) is not read
    (a wrapper has no bytes: reading one crashed the process); rank 1's forward overflow is
    its birth, rank 0 sees the inf arrive in the gradients' reduce-scatter, labelled, and the
    next step's NaN parameters are no new birth."""
    from accuracy.aten import FROM_COLLECTIVE
    from accuracy.overflow import scan

    assert (runs / "fsdp-overflow" / "result_0.json").exists()
    r0 = scan(runs / "fsdp-overflow" / "o_0.h5")
    r1 = scan(runs / "fsdp-overflow" / "o_1.h5")
    first = r1.births[0]
    assert (first.op, first.phase, first.label) == ("aten.mul.Tensor", "forward", "")
    # the next step reads the NaN AdamW left in the shards (FSDP2 writes them below autograd,
    # and gathers them into fresh memory): inherited, not born again
    assert {b.step for b in r0.births + r1.births} == {1}
    assert r0.births and all(b.op.startswith("c10d.") and b.label == FROM_COLLECTIVE
                             for b in r0.births)  # rank 0 made none of its own
    offline = scan(runs / "fsdp-overflow" / "s_0.h5")  # a statistics dump, scanned after
    assert offline.births and all(b.op.startswith("c10d.") and b.label == FROM_COLLECTIVE
                                  for b in offline.births)


@pytest.mark.parametrize("scenario", ["fsdp-monitor", "tp-monitor"])
def test_sharded_monitor_reads_each_ranks_shards(runs, scenario):
    """The monitor's snapshots and figures under FSDP2 and tensor parallel (parameters,
    gradients, AdamW states and TP's module outputs are DTensors: read with dispatch off, one
    crashed the process): each rank's figures are its shards', finite, every step."""
    import math

    from accuracy.monitor.series import read_series

    outputs = []
    for rank in range(WORLD):
        s = read_series(runs / scenario / f"m_{rank}.monitor.h5")
        assert len(s.loss) == 3 and all(math.isfinite(v) and v > 0 for v in s.grad_norm)
        assert all(math.isfinite(v) for v in s.loss)  # tensor parallel's is a DTensor
        assert "0.weight" in s.param_names
        names, act = s.figure("module", "act_norm")
        outputs.append(act[:, names.index("0")])
    if scenario == "tp-monitor":
        # the column-parallel layer's output is a DTensor sharded across ranks: each rank's
        # figure is its own shard's (finite, and not the other rank's), never a global norm
        # reduced through DTensor inside a forward hook
        assert all(math.isfinite(v) for o in outputs for v in o)
        assert all(a != b for a, b in zip(outputs[0], outputs[1], strict=True))


def test_a_trigger_on_one_rank_is_captured_by_every_rank_and_changes_no_training(runs):
    """Only rank 1's loss spikes. A capture re-runs steps, and their collectives pair with
    whatever the other ranks run: rank 1 capturing alone fed its re-runs' all-reduces into
    rank 0's live steps (rank 0's losses changed), then died when rank 0 exited. Every rank
    captures the step, and the training is the bare run's."""
    for rank in range(WORLD):
        r = _result(runs, "ddp-monitor-one-rank", rank)
        assert r["captures"] == [6], rank
        spiked = [6] if rank == 1 else []
        assert [m for i, m in enumerate(r["monitored"]) if i not in spiked] == \
            [b for i, b in enumerate(r["bare"]) if i not in spiked], rank


def test_fsdp2_parameters_are_recorded_as_each_step_gathers_them(runs):
    """FSDP2 frees an unsharded parameter with `storage.resize_(0)` and gathers the next
    step's values into fresh memory, a write no version counter of the parameter sees: the
    dump recorded step 0's weight again at steps 1 and 2 (and the overflow check judged a NaN
    weight finite). Each step's addmm reads the weight the optimizer left."""
    import math

    for rank in range(WORLD):
        norms = _result(runs, "fsdp-steps", rank)["norms"]
        with load_dump(runs / "fsdp-steps" / f"s_{rank}.h5") as d:
            seen = [r.inputs[2].stats["l2"] for r in d.records
                    if r.op == "aten.addmm.default" and r.phase == "forward"
                    and r.module.endswith(".0")]
        assert len(seen) == 3 and len(set(norms)) == 3, (seen, norms)
        assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(seen, norms, strict=True)), \
            (seen, norms)


def test_ddp_and_fsdp2_ranks_against_a_single_process_run_are_the_same_model(runs, tmp_path):
    """DDP names every op `DistributedDataParallel.module.<layer>` and fully_shard makes the
    model's class `FSDPSequential`: a rank of either against the bare model's step is the same
    model, compared both ways, never refused as another model's dump."""
    from accuracy.compare import compare
    from tests._support.multirank_worker import _batch, _ln_model, _model

    x, y = _batch(0)
    with dumper(tmp_path / "bare.h5"):
        torch.nn.functional.cross_entropy(_model()(x), y).backward()
    m = _ln_model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
    with dumper(tmp_path / "bare_ln.h5"):
        m(x).sum().backward()
        opt.step()
    for wrapped, bare in ((runs / "ddp-golden" / "run_0.h5", tmp_path / "bare.h5"),
                          (runs / "fsdp-gold-a" / "x_0.h5", tmp_path / "bare_ln.h5")):
        for my, golden in ((wrapped, bare), (bare, wrapped)):
            s = compare(my, golden).summary
            assert s["coverage"]["compared"] > 0.3 * s["coverage"]["my_tensors"], s["coverage"]
