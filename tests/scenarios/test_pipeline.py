"""Pipeline parallel and point-to-point traffic on 2 gloo ranks: no hang, what was sent and
what arrived recorded, a clean run judged clean, a stage's fault named on its rank and the
other stage inherited through the very receive that carried it (issue 48).

One pair of rank processes (tests/_support/pipeline_worker.py) runs every scenario, started
once for the module; each rank's process group times out after 30 s and the launcher kills
both ranks' process groups when they outlive its wait, so a hang fails this module only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from accuracy.compare.multirank import compare_ranks
from accuracy.dumpfile import schema
from accuracy.dumpfile.compiled import blind_lines
from accuracy.dumpfile.reader import load_dump
from accuracy.replay.collectives import replay_ranks
from tests._support.ranks import run_ranks

WORLD = 2
SCENARIOS = ("gpipe-gold,gpipe-dev,gpipe-fault1,gpipe-fault0,1f1b-gold,1f1b-dev,1f1b-fault1,"
             "1f1b-fault0,fe-gold,fe-fault0,gpt2-gold,gpt2-dev,gpt2-fault1,p2p-apis,pending,"
             "ddp-gold,ddp-compiled")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pipeline")
    worker = [sys.executable, "-m", "tests._support.pipeline_worker", SCENARIOS, str(out)]
    # 30 s on a quiet 2-core machine; over 150 s at load 15-20 beside a mutation run: the bound
    # only has to stop a hang (each rank's process group times out after 30 s of no traffic)
    run_ranks([worker] * WORLD, timeout=360)
    return out


def _p2p(d, kind: str) -> list:
    return [r for r in d.records
            if (r.extra.get(schema.EXTRA_COLLECTIVE) or {}).get("kind") == kind]


def _replayed(runs: Path, scenario: str, tmp: Path):
    return replay_ranks(runs / scenario / "run_{rank}.h5", tmp / f"{scenario}_{{rank}}.h5")


def test_every_p2p_api_records_what_was_sent_and_what_arrived(runs, tmp_path):
    """send/recv, isend/irecv and batch_isend_irecv: the user's waits return (no hang), each
    receive's output is the peer's data (not the uninitialised buffer), each send's input is
    what it sent, and the offline check pairs every receive with its send."""
    for rank in range(WORLD):
        peer = 1 - rank
        mine = json.loads((runs / "p2p-apis" / f"result_{rank}.json").read_text())["sent"]
        theirs = json.loads((runs / "p2p-apis" / f"result_{peer}.json").read_text())["sent"]
        with load_dump(runs / "p2p-apis" / f"run_{rank}.h5") as d:
            sends, recvs = _p2p(d, "send"), _p2p(d, "recv")
            assert [r.extra["collective"]["tag"] for r in sends] == [1, 2, 3] + [4] * (1 - rank)
            assert [r.extra["collective"]["tag"] for r in recvs] == [1, 2, 3] + [4] * rank
            if rank == 1:  # recv_any_source_: the sender known once the data arrived
                last = recvs.pop()
                assert last.op == "c10d.recv_any_source_.default"
                assert last.outputs[0].load().tolist() == theirs["any"]
            else:
                sends.pop()
            for r in sends + recvs:
                note = r.extra["collective"]
                assert note["peer"] == peer and note["p2p_index"] == 0
                assert (note["src"], note["dst"]) == ((rank, peer) if r in sends
                                                      else (peer, rank))
            for rec, key in zip(sends, ("send", "isend", "batch"), strict=True):
                assert rec.inputs[0].load().tolist() == mine[key]
            for rec, key in zip(recvs, ("send", "isend", "batch"), strict=True):
                (out,) = rec.outputs
                assert out.has_data
                assert out.load().tolist() == theirs[key]
    rr = _replayed(runs, "p2p-apis", tmp_path)
    assert rr.counts["p2p_checked"] == 7 and rr.counts["p2p_mismatched"] == 0
    assert rr.counts["p2p_unchecked"] == 0 and rr.counts["p2p_unpaired_sends"] == 0
    assert "point-to-point receives checked against their sends: 7 (0 mismatched)" \
        in rr.format()


def test_a_receive_pending_at_close_is_blind_with_its_peer_and_tag(runs):
    with load_dump(runs / "pending" / "run_1.h5") as d:
        assert d.attrs[schema.ROOT_RECEIVES_PENDING] == [{"seq": 0, "peer": 0, "tag": 7}]
        (rec,) = _p2p(d, "recv")
        assert rec.extra[schema.EXTRA_RECEIVE_PENDING] is True
        assert not rec.outputs[0].has_data  # not data: never compared
        lines = blind_lines(d.attrs)
    assert any("point-to-point receive" in line and "from rank 0 tag 7" in line
               for line in lines), lines
    got = json.loads((runs / "pending" / "result_1.json").read_text())["got"]
    assert got == [1.0] * 4  # the user's own wait, after the dumper closed, still worked


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_clean_pipeline_step_has_no_error_with_or_without_a_replay(runs, tmp_path,
                                                                     schedule):
    """sim bf16 against fp32 golden, two stages: 0 errors, no rank diverged, every receive
    checked against its send."""
    dev, gold = runs / f"{schedule}-dev", runs / f"{schedule}-gold"
    rr = _replayed(runs, f"{schedule}-dev", tmp_path)
    c = rr.counts
    assert c["p2p_mismatched"] == 0 and c["p2p_unpaired_sends"] == 0
    assert c["p2p_unchecked"] == 0  # the shape messages (send_object_list's pickles) too
    assert c["p2p_checked"] >= 8  # 2 activations + 2 gradients each way, and the votes
    for replay in (None, tmp_path / f"{schedule}-dev_{{rank}}.h5"):
        s = compare_ranks(dev / "run_{rank}.h5", gold, replay).summary
        assert s["counts"]["error"] == 0, s["ranks"]
        assert s["first_rank"] is None and s["culprit"] is None
        assert [r["label"] for r in s["ranks"]] == ["clean", "clean"]
    with load_dump(dev / "run_1.h5") as d:
        # the stage's shape-inference forward on an empty_strided input: not data, not judged
        first = next(r for r in d.records if r.op == "aten.addmm.default")
        assert first.extra[schema.EXTRA_UNINITIALIZED_IO]["output"] == [0]
        # the receives hold the activations forward and the gradients backward... as sent
        phases = [r.phase for r in _p2p(d, "recv") if r.outputs[0].shape == (4, 32)]
        sends = [r.phase for r in _p2p(d, "send") if r.inputs[0].shape == (4, 32)]
    assert phases == ["forward", "forward"] and sends == ["backward", "backward"]


def test_replay_takes_a_received_activation_as_its_input(runs, tmp_path):
    _replayed(runs, "gpipe-dev", tmp_path)
    with load_dump(runs / "gpipe-dev" / "run_1.h5") as d:
        recv = next(r for r in _p2p(d, "recv") if r.outputs[0].shape == (4, 32))
        reader = next(r for r in d.records if r.seq > recv.seq and r.op == "aten.addmm.default")
        (x,) = [t for t in reader.inputs if t.shape == (4, 32)]
        assert x.has_data and torch.equal(x.load(), recv.outputs[0].load())
        assert x.load().abs().sum() > 0
    with load_dump(tmp_path / "gpipe-dev_1.h5") as rp:
        row = next(r for r in rp.records if r.seq == reader.seq)
        assert row.extra["replay"]["status"] == "ok"


def _recv_at(path: Path, seq: int):
    with load_dump(path) as d:
        return next(r for r in d.records if r.seq == seq), _p2p(d, "recv")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("replay", [False, True])
def test_a_fault_on_stage_1_names_rank_1_and_rank_0_inherits_through_the_gradient(
        runs, tmp_path, replay, schedule):
    """A 5% bias on stage 1's first addmm of micro-batch 0 (a module-scoped sim fault, under
    the stage's torch.autograd.grad): rank 1 diverged first; rank 0 inherited through the
    backward receive of micro-batch 0's gradient, the first gradient it received (in 1F1B
    too, where stage 0 runs micro-batch 1's forward before that backward)."""
    dev = runs / f"{schedule}-fault1"
    rp = None
    if replay:
        _replayed(runs, f"{schedule}-fault1", tmp_path)
        rp = tmp_path / f"{schedule}-fault1_{{rank}}.h5"
    s = compare_ranks(dev / "run_{rank}.h5", runs / f"{schedule}-gold", rp).summary
    assert s["first_rank"] == 1
    r0, r1 = s["ranks"]
    assert r0["label"] == "inherited" and r0["culprit"] is None
    assert r0["inherited"]["via"] == "c10d.recv_.default" and r0["inherited"]["from_rank"] == 1
    via, recvs = _recv_at(dev / "run_0.h5", r0["inherited"]["seq"])
    grads = [r for r in recvs if r.phase == "backward"]
    assert via.phase == "backward" and via.seq == grads[0].seq
    if replay:
        assert r1["label"] == "culprit"
        assert r1["culprit"]["op"] == "aten.addmm.default"
        assert r1["culprit"]["phase"] == "forward"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("replay", [False, True])
def test_a_fault_on_stage_0_names_rank_0_and_rank_1_inherits_through_the_activation(
        runs, tmp_path, replay, schedule):
    dev = runs / f"{schedule}-fault0"
    rp = None
    if replay:
        _replayed(runs, f"{schedule}-fault0", tmp_path)
        rp = tmp_path / f"{schedule}-fault0_{{rank}}.h5"
    s = compare_ranks(dev / "run_{rank}.h5", runs / f"{schedule}-gold", rp).summary
    assert s["first_rank"] == 0
    r0, r1 = s["ranks"]
    assert r1["label"] == "inherited" and r1["culprit"] is None
    assert r1["inherited"]["via"] == "c10d.recv_.default" and r1["inherited"]["from_rank"] == 0
    via, recvs = _recv_at(dev / "run_1.h5", r1["inherited"]["seq"])
    acts = [r for r in recvs if r.phase == "forward" and r.outputs[0].shape == (4, 32)]
    assert via.seq == acts[0].seq  # micro-batch 0's activation, not a shape message
    if replay:
        assert r0["label"] == "culprit" and r0["culprit"]["op"] == "aten.addmm.default"


def test_compiled_ddp_replays_the_reduced_gradients_with_no_false_error(runs, tmp_path):
    """DDP around a compiled module, one step with AdamW: the optimizer's recorded gradient
    inputs are the all-reduced ones (what the step read), so its replay finds no error."""
    dev = runs / "ddp-compiled"
    rr = replay_ranks(dev / "run_{rank}.h5", tmp_path / "r_{rank}.h5")
    assert rr.counts["checked"] >= 1 and rr.counts["mismatched"] == 0
    s = compare_ranks(dev / "run_{rank}.h5", runs / "ddp-gold", tmp_path / "r_{rank}.h5").summary
    assert s["counts"]["error"] == 0 and s["first_rank"] is None, s["ranks"]
    for rank in range(WORLD):
        with load_dump(dev / f"run_{rank}.h5") as d:
            assert d.attrs["compiled_kernels_recorded"] > 0
            (ar,) = [r for r in d.records if r.op == "c10d.allreduce_.default"]
            lerp = next(r for r in d.records if r.op == "aten.lerp_.Scalar")
            bucket = ar.outputs[0].load()
            grad = lerp.inputs[1].load().flatten()
            # the first parameter's gradient sits somewhere in the reduced bucket
            assert any(torch.equal(bucket[i:i + grad.numel()], grad)
                       for i in range(bucket.numel() - grad.numel() + 1))


@pytest.mark.parametrize("replay", [False, True])
def test_the_pipeline_front_end_names_stage_0_and_the_receive_of_the_faulty_micro_batch(
        runs, tmp_path, replay):
    """`pipeline(...)`/`SplitPoint`: no shape-inference pass, so both stages reach their
    epoch 3 at once (rank 0's fault in micro-batch 1, rank 1's receive of it). Stage 0 is
    still first (a receive comes after its send on the ranks' shared clock; a divergence
    that starts at a receive was brought in), and stage 1 inherited through the receive of
    micro-batch 1's activation, not micro-batch 0's (which deviates within bf16 only)."""
    dev = runs / "fe-fault0"
    rp = None
    if replay:
        _replayed(runs, "fe-fault0", tmp_path)
        rp = tmp_path / "fe-fault0_{rank}.h5"
    s = compare_ranks(dev / "run_{rank}.h5", runs / "fe-gold", rp).summary
    assert s["first_rank"] == 0
    r0, r1 = s["ranks"]
    assert r1["label"] == "inherited" and r1["inherited"]["from_rank"] == 0
    via, recvs = _recv_at(dev / "run_1.h5", r1["inherited"]["seq"])
    acts = [r for r in recvs if r.phase == "forward" and r.outputs[0].shape == (4, 32)]
    assert via.seq == acts[1].seq
    assert r0["label"] == ("culprit" if replay else "diverged")


def test_a_transformers_gpt2_in_two_stages_is_clean_and_names_no_rank(runs, tmp_path):
    """A tiny random-init GPT-2 split by hand in two stages, sim bf16 against fp32, clean:
    0 errors and no rank diverged, with and without a replay. Without one it gave 34
    warnings and named a rank "diverged": every receive judged as "amplifying" the buffer it
    wrote into, and Adam's honest update of an attention key bias (a gradient 0 in exact
    arithmetic) taken as the rank's own divergence."""
    rr = _replayed(runs, "gpt2-dev", tmp_path)
    c = rr.counts
    assert c["p2p_checked"] >= 8 and c["p2p_unchecked"] == 0 and c["p2p_mismatched"] == 0
    for replay in (None, tmp_path / "gpt2-dev_{rank}.h5"):
        rep = compare_ranks(runs / "gpt2-dev" / "run_{rank}.h5", runs / "gpt2-gold", replay)
        s = rep.summary
        assert s["counts"]["error"] == 0, s["ranks"]
        assert s["first_rank"] is None and s["culprit"] is None
        assert [r["label"] for r in s["ranks"]] == ["clean", "clean"]
        assert not s["blind"]
        recvs = [r for r in rep.rows if r.op == "c10d.recv_.default" and r.io == "output"]
        assert len(recvs) >= 4 and all(r.verdict == "pass" for r in recvs)
    assert s["counts"]["warning"] == 0  # with the replay: every kernel judged on its own


def test_a_fault_in_gpt2_stage_1_names_rank_1_and_rank_0_inherits_the_gradient(runs):
    """The same GPT-2, a 5% bias on stage 1's attention projection in micro-batch 0, no
    replay: rank 1 first, rank 0 inherited through the first gradient it received."""
    dev = runs / "gpt2-fault1"
    s = compare_ranks(dev / "run_{rank}.h5", runs / "gpt2-gold").summary
    assert s["first_rank"] == 1
    r0, r1 = s["ranks"]
    assert r1["label"] == "diverged"
    assert r0["label"] == "inherited" and r0["inherited"]["via"] == "c10d.recv_.default"
    via, recvs = _recv_at(dev / "run_0.h5", r0["inherited"]["seq"])
    assert via.phase == "backward" and via.seq == [r for r in recvs
                                                   if r.phase == "backward"][0].seq
