"""Multi-rank labels (issue 25): a rank that only receives another rank's error through a
collective is "inherited", even when its own precision made it deviate a little before; a
clean low-precision run names no rank as diverged first."""

from __future__ import annotations

import pytest

from accuracy.compare.multirank import merge
from accuracy.compare.report import Report
from accuracy.compare.row import Row
from accuracy.compare.terminal import format_ranks


def _row(seq: int, op: str, acc: str, verdict: str = "pass", **kw) -> Row:
    return Row(index=seq, kind="op", op=op, seq_my=seq, seq_golden=seq, io="output",
               accumulated_verdict=acc, verdict=verdict, **kw)


def _report(rows: list[Row], culprit: Row | None = None, first_div: Row | None = None,
            verdict: str | None = None) -> Report:
    counts = {"pass": 0, "warning": 0, "error": 1 if culprit else 0, "unmatched": 0,
              "skipped": 0}
    summary = {"counts": counts, "my": "m", "golden": "g", "rows": len(rows),
               "verdict": verdict or ("error" if culprit else "pass"),
               "culprit": culprit.as_dict() if culprit else None,
               "first_divergence": first_div.as_dict() if first_div else None}
    return Report(rows, summary)


@pytest.mark.parametrize("rank0_verdict", ["pass", "warning"])
def test_tp_rank_that_deviates_by_its_precision_then_receives_the_fault_is_inherited(
        rank0_verdict):
    """Tensor parallel, bf16 on both ranks, a fault in rank 1's backward layer norm (epoch
    1). Rank 0 deviates at warning level from its first op (its own bf16 rounding, epoch 0),
    then the all-reduce of epoch 1 brings rank 1's error in: inherited via that all-reduce,
    not "diverged"."""
    r0 = [_row(3, "aten.view.default", "warning"),
          _row(20, "_c10d_functional.all_reduce.default", "pass"),
          _row(45, "_c10d_functional.all_reduce.default", "warning"),
          _row(50, "aten.mm.default", "warning")]
    cul = _row(40, "aten.native_layer_norm_backward.default", "warning", "error",
               local_verdict="error")
    r1 = [_row(3, "aten.view.default", "warning"), cul,
          _row(45, "_c10d_functional.all_reduce.default", "warning")]
    epochs = {0: {3: 0, 20: 0, 45: 1, 50: 2}, 1: {3: 0, 40: 1, 45: 1}}
    s = merge({0: _report(r0, verdict=rank0_verdict), 1: _report(r1, cul)}, epochs,
              {"replay": "r"}).summary
    rank0, rank1 = s["ranks"]
    assert s["first_rank"] == 1 and rank1["label"] == "culprit"
    assert rank0["label"] == "inherited", rank0["label"]
    assert rank0["inherited"]["via"] == "_c10d_functional.all_reduce.default"
    assert rank0["inherited"]["epoch"] == 1 and rank0["inherited"]["from_rank"] == 1


def test_a_clean_low_precision_run_names_no_rank_diverged_first():
    """FSDP2 under bf16 against fp32 gold, no fault: both ranks deviate within their
    precision (warnings, no error, no culprit). No rank "diverged first"."""
    rows = [_row(46, "aten.native_layer_norm.default", "warning")]
    meta = {"my": "m", "golden": "g", "world_size": 2, "bytes_compared": 0, "seconds": 0.0}
    s = merge({0: _report(list(rows)), 1: _report(list(rows))}, {0: {46: 2}, 1: {46: 2}},
              meta).summary
    assert s["first_rank"] is None
    assert [e["label"] for e in s["ranks"]] == ["clean", "clean"]
    text = format_ranks(s)
    assert "diverged first: none (deviations within precision only" in text


@pytest.mark.parametrize("rank0_verdict", ["pass", "warning"])
def test_a_fault_under_the_error_threshold_meets_the_other_rank_at_an_all_reduce(rank0_verdict):
    """Tensor parallel, a 5% fault in rank 1's row-parallel matmul: a warning at bf16 (under
    the error threshold); the all-reduce right after is an accumulated error on both ranks, at
    the same epoch and seq. Rank 1 brought the deviation there: it diverged first, and rank 0
    inherited through the all-reduce (once: rank 0 named first, rank 1 'inherited from 0')."""
    ar = "_c10d_functional.all_reduce.default"
    r0 = [_row(7, "aten.addmm.default", "pass"), _row(8, ar, "error")]
    r1 = [_row(7, "aten.addmm.default", "warning", "warning"), _row(8, ar, "error")]
    epochs = {0: {7: 0, 8: 0}, 1: {7: 0, 8: 0}}
    if rank0_verdict == "warning":  # its own bf16 rounding later: a rank that may diverge too
        r0.append(_row(9, "aten.gelu.default", "error", "warning"))
        epochs[0][9] = 0
    s = merge({0: _report(r0, first_div=r0[1], verdict=rank0_verdict),
               1: _report(r1, first_div=r1[1], verdict="warning")}, epochs, {}).summary
    rank0, rank1 = s["ranks"]
    assert s["first_rank"] == 1, [(e["rank"], e["label"]) for e in s["ranks"]]
    assert rank1["label"] == "diverged"
    assert rank0["label"] == "inherited" and rank0["inherited"]["from_rank"] == 1
    assert rank0["inherited"]["via"] == ar


def test_no_rank_inherits_through_a_collective_older_than_the_fault():
    """DDP, a fault in rank 1's forward convolution at epoch 2. Rank 0's own accumulated error
    in backward (seq 93) follows only a broadcast of epoch 1, which cannot carry an error
    made at epoch 2: rank 0 diverged by itself, never 'inherited via broadcast (epoch 1)'.
    When every tensor of rank 0 passed, that error is its precision: clean."""
    cul = _row(40, "aten.convolution.default", "error", "error", local_verdict="error")
    r1 = [_row(10, "c10d.broadcast_.default", "pass"), cul]
    epochs = {0: {10: 1, 35: 2, 93: 2}, 1: {10: 1, 40: 2}}

    def rank0(verdict: str) -> dict:
        r0 = [_row(10, "c10d.broadcast_.default", "pass"),
              _row(35, "aten.native_batch_norm.default", "warning"),
              _row(93, "aten.convolution_backward.default", "error", verdict)]
        s = merge({0: _report(r0, first_div=r0[2], verdict=verdict), 1: _report(r1, cul)},
                  epochs, {"replay": "r"}).summary
        assert s["first_rank"] == 1
        return s["ranks"][0]

    own = rank0("warning")
    assert own["label"] == "diverged", own.get("inherited")
    assert rank0("pass")["label"] == "clean"


def test_a_clean_run_whose_rounding_noise_is_an_accumulated_error_names_no_rank():
    """bf16 autocast against fp32 gold: a gradient that is zero in exact arithmetic holds
    rounding noise on both sides (accumulated error, cosine -0.2) and every tensor passed
    (replay: an honest kernel). PASS, so no rank 'diverged first'."""
    r = [_row(93, "aten.convolution_backward.default", "error")]
    s = merge({0: _report(list(r), first_div=r[0]), 1: _report(list(r), first_div=r[0])},
              {0: {93: 2}, 1: {93: 2}}, {"replay": "r"}).summary
    assert s["first_rank"] is None
    assert [e["label"] for e in s["ranks"]] == ["clean", "clean"]


def test_a_clean_run_whose_only_warnings_are_honest_names_no_rank():
    """A tiny GPT-2 in two pipeline stages, sim bf16 against fp32, no replay: Adam's update of
    an attention key bias (a gradient 0 in exact arithmetic) divides noise by noise, a warning
    honest kernels reach and an accumulated error; the receive brought in the other stage's
    bf16 deviation. No rank diverged first. A warning of a rank's own kernel still names it."""
    adam = _row(633, "aten.addcdiv_.default", "error", "warning")
    recv = _row(175, "c10d.recv_.default", "warning", "warning")
    epochs = {0: {175: 23, 200: 24, 633: 30}, 1: {175: 23, 200: 24, 633: 30}}

    def rank(extra: list[Row]) -> Report:
        return _report([recv, *extra, adam], first_div=adam, verdict="warning")

    s = merge({0: rank([]), 1: rank([])}, epochs, {}).summary
    assert s["first_rank"] is None
    assert [e["label"] for e in s["ranks"]] == ["clean", "clean"]
    gelu = _row(200, "aten.gelu.default", "warning", "warning")
    s = merge({0: rank([]), 1: rank([gelu])}, epochs, {}).summary
    assert s["first_rank"] == 1 and s["ranks"][1]["label"] == "diverged"


def test_ranks_mostly_not_compared_fail_a_pipeline():
    """Each rank's compare paired 2 of its 10 tensors (another model's dumps): the merged
    report says it first and `--fail-on` fails, as a single pair's does."""
    rows = [_row(1, "aten.mm.default", "pass")]
    reps = {}
    for r in (0, 1):
        rep = _report(list(rows))
        rep.summary.update(coverage={"my_tensors": 10, "compared": 2},
                           blind=["not compared: 8 of 10 tensors of my run have no golden "
                                  "counterpart (are these dumps of the same model and step?)"])
        reps[r] = rep
    meta = {"my": "m", "golden": "g", "world_size": 2, "bytes_compared": 0, "seconds": 0.0}
    merged = merge(reps, {0: {1: 0}, 1: {1: 0}}, meta)
    assert merged.exit_code("error") == 1
    text = format_ranks(merged.summary)
    assert "16 of 20 tensors of my run not compared" in text, text


def _rank_report(culprit: dict | None, first_div: dict | None):
    summary = {"counts": {"error": 1 if culprit else 0}, "my": "m", "golden": "g",
               "verdict": "error", "rows": 0, "culprit": culprit, "first_divergence": first_div}
    return Report([], summary)


def test_diverged_first_is_where_a_rank_kernel_fault_starts_not_where_error_grows():
    """Rank 1's kernel is wrong at epoch 0 (its output not yet an accumulated error); the
    error grows into one on both ranks at epoch 1, rank 0's a little earlier in seq: rank 1
    diverged first."""
    def row(seq: int, op: str = "aten.add.Tensor") -> dict:
        return {"index": seq, "seq_my": seq, "op": op, "kind": "op", "io": "output",
                "local_verdict": "error"}

    reports = {0: _rank_report(None, row(50)), 1: _rank_report(row(10), row(60))}
    epochs = {0: {50: 1}, 1: {10: 0, 60: 1}}
    s = merge(reports, epochs, {}).summary
    assert s["first_rank"] == 1
    assert s["ranks"][1]["label"] == "culprit" and s["culprit"]["rank"] == 1



def test_a_rank_whose_divergence_starts_at_a_collective_inflow_is_not_named_first():
    """Tensor parallel, no replay: rank 0's own matmul is off by a fault under the error
    threshold (a warning, seq 40); the all-reduce right after (epoch 1) carries it to rank 1
    as an error. Rank 1 runs fewer ops before that all-reduce (seq 12), so by (epoch, seq) its
    divergence sorts first; but it starts with what the all-reduce brought in, which its own
    check found nothing wrong with. Rank 0 diverged first; rank 1 inherited via the
    all-reduce."""
    ar = "_c10d_functional.all_reduce.default"
    r0 = [_row(40, "aten.mm.default", "warning", "warning"), _row(45, ar, "error", "error")]
    r1 = [_row(12, ar, "error", "error"), _row(20, "aten.gelu.default", "error", "error")]
    epochs = {0: {40: 1, 45: 1}, 1: {12: 1, 20: 2}}
    s = merge({0: _report(r0, first_div=r0[1], verdict="error"),
               1: _report(r1, first_div=r1[0], verdict="error")}, epochs, {}).summary
    rank0, rank1 = s["ranks"]
    assert s["first_rank"] == 0, [(e["rank"], e["label"]) for e in s["ranks"]]
    assert rank0["label"] == "diverged"
    assert rank1["label"] == "inherited" and rank1["inherited"]["from_rank"] == 0
    assert rank1["inherited"]["via"] == ar


def test_two_ranks_deviating_on_their_own_before_one_all_reduce_name_the_earlier_first():
    """Both ranks' own matmuls deviate under the error threshold before the all-reduce where
    the error shows on both, at the same epoch and seq: neither only brought it in, so the
    one whose own deviation came first (rank 1, seq 4) is named, not the lower rank number."""
    ar = "_c10d_functional.all_reduce.default"
    r0 = [_row(6, "aten.mm.default", "warning", "warning"), _row(8, ar, "error", "error")]
    r1 = [_row(4, "aten.mm.default", "warning", "warning"), _row(8, ar, "error", "error")]
    epochs = {0: {6: 0, 8: 0}, 1: {4: 0, 8: 0}}
    s = merge({0: _report(r0, first_div=r0[1], verdict="error"),
               1: _report(r1, first_div=r1[1], verdict="error")}, epochs, {}).summary
    assert s["first_rank"] == 1, [(e["rank"], e["label"]) for e in s["ranks"]]
