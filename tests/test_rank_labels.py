"""Multi-rank labels (issue 25): a rank that only receives another rank's error through a
collective is "inherited", even when its own precision made it deviate a little before; a
clean low-precision run names no rank as diverged first."""

from __future__ import annotations

from accuracy.compare.multirank import merge
from accuracy.compare.report import Report
from accuracy.compare.row import Row
from accuracy.compare.terminal import format_ranks


def _row(seq: int, op: str, acc: str, verdict: str = "pass", **kw) -> Row:
    return Row(index=seq, kind="op", op=op, seq_my=seq, seq_golden=seq, io="output",
               accumulated_verdict=acc, verdict=verdict, **kw)


def _report(rows: list[Row], culprit: Row | None = None, first_div: Row | None = None
            ) -> Report:
    counts = {"pass": 0, "warning": 0, "error": 1 if culprit else 0, "unmatched": 0,
              "skipped": 0}
    summary = {"counts": counts, "my": "m", "golden": "g", "rows": len(rows),
               "verdict": "error" if culprit else "pass",
               "culprit": culprit.as_dict() if culprit else None,
               "first_divergence": first_div.as_dict() if first_div else None}
    return Report(rows, summary)


def test_tp_rank_that_deviates_by_its_precision_then_receives_the_fault_is_inherited():
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
    s = merge({0: _report(r0), 1: _report(r1, cul)}, epochs, {"replay": "r"}).summary
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
