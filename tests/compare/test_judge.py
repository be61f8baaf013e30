"""A compiled kernel whose inputs have no golden value is not judged by amplification.

Seen on a stranger's compiled CNN (conv2's output scaled 1.05 by a miscompile): a BatchNorm
backward kernel read the max-pool gradient from a buffer with no eager counterpart, so every
deviation it was given counted as zero; its amplification (1.6e7) made it the culprit of a
forward fault. Its own share is unknown without a replay: at most a warning, never the culprit.
"""

from __future__ import annotations

from accuracy.compare.judge import judge, own_evidence
from accuracy.compare.report import analyse
from accuracy.compare.row import Row
from accuracy.compare.row import Verdict as V
from accuracy.compare.verdict import load_config

KERNEL = "inductor.cpp_fused_native_batch_norm_backward_0"


def _op(first: int, op: str, seq: int, golden: int, ins: list[tuple[float | None, V]],
        out_dev: float) -> list[Row]:
    rows = []
    for i, (dev, verdict) in enumerate(ins):
        rows.append(Row(index=first + i, kind="op", op=op, io="input", tensor_index=i,
                        seq_my=seq, seq_golden=golden, rel_euc_dist=dev, verdict=verdict,
                        accumulated_verdict=verdict, dtype_my="float32"))
    rows.append(Row(index=first + len(ins), kind="op", op=op, io="output", tensor_index=0,
                    seq_my=seq, seq_golden=golden, rel_euc_dist=out_dev, verdict=V.ERROR,
                    accumulated_verdict=V.ERROR, dtype_my="float32",
                    compute_precision="float32"))
    return rows


def _judged(rows: list[Row]) -> tuple[list[Row], dict]:
    cfg = load_config()
    judge(rows, {}, cfg)
    return rows, analyse(rows, cfg, {})


def test_a_kernel_given_unpaired_inputs_is_a_warning_not_the_culprit():
    # input 0 paired and exact, input 1 (the gradient it was given) with no golden value
    rows, summary = _judged(_op(0, KERNEL, 23, 48, [(0.0, V.PASS), (None, V.UNMATCHED)], 0.05))
    out = rows[-1]
    assert out.verdict == V.WARNING and out.amplification is None
    assert "1 of its 2 inputs have no golden value" in out.message
    assert summary["culprit"] is None


def test_a_kernel_whose_inputs_all_pair_is_still_blamed_by_amplification():
    rows, summary = _judged(_op(0, KERNEL, 23, 48, [(0.0, V.PASS), (0.0, V.PASS)], 0.05))
    assert rows[-1].amplification > 1e5
    assert summary["culprit"]["index"] == rows[-1].index


def test_an_eager_op_is_judged_on_its_paired_inputs_as_before():
    rows, _ = _judged(_op(0, "aten.mul.Tensor", 5, 5, [(0.0, V.PASS), (None, V.UNMATCHED)],
                          0.05))
    assert rows[-1].amplification is not None and rows[-1].amplification > 1e5


def test_a_kernel_input_paired_with_another_eager_op_still_explains_its_deviation():
    # the gradient it was given pairs with convolution_backward's output (golden seq 42), its
    # output with native_batch_norm_backward's (seq 48): the 5% is inherited, not the kernel's
    rows = _op(0, KERNEL, 23, 48, [(0.05, V.ERROR), (0.0, V.PASS)], 0.05)
    rows[0].seq_golden = 42
    rows, summary = _judged(rows)
    assert rows[-1].amplification < 2 and rows[-1].verdict == V.PASS
    assert summary["culprit"] is None


RECV = "c10d.recv_.default"


def test_a_receive_is_not_judged_by_the_buffer_it_wrote_into():
    """A pipeline stage's receive of a bf16 activation (a GPT-2 split in two stages): its
    input is the buffer it received into, not data, so its deviation is not "4.65e4x what
    its inputs explain"; it was made on the rank that sent it and is judged there. Within
    precision it passes; an error arriving is at most a warning here (compare -r checks the
    transfer), never this rank's culprit."""
    rows = _op(0, RECV, 7, 7, [(None, V.SKIPPED)], 0.0028)
    rows[-1].accumulated_verdict = V.WARNING
    rows, _ = _judged(rows)
    assert rows[-1].verdict == V.PASS and rows[-1].amplification is None
    assert "made on the rank that sent it" in rows[-1].message
    rows, summary = _judged(_op(0, RECV, 7, 7, [(None, V.SKIPPED)], 0.2))
    assert rows[-1].verdict == V.WARNING and summary["culprit"] is None


def test_only_a_rank_own_kernels_warnings_are_evidence_against_it():
    def out(op: str, **kw) -> Row:
        return Row(index=0, kind="op", op=op, io="output", verdict=V.WARNING,
                   accumulated_verdict=V.ERROR, **kw)

    assert own_evidence(out("aten.gelu.default"))
    assert not own_evidence(out("aten.addcdiv_.default"))  # Adam: noise over noise
    assert not own_evidence(out(RECV))  # made on the sending rank
    assert own_evidence(out("aten.addcdiv_.default", local_excess=30.0))  # replay's verdict
    assert own_evidence(out("aten.addcdiv_.default",
                            message="arguments differ: args[3] 0.001 vs 0.002"))
    assert not own_evidence(out("aten.gelu.default", produced_by="/aten.mm.default/3/output/0"))


def _muls(out_devs: list[float], statistics: bool) -> list[Row]:
    """One aten.mul per output deviation, each given inputs that deviate by 1e-3; from
    statistics (the largest relative difference of max/min/mean/L2) or from tensors."""
    rows: list[Row] = []
    for seq, out_dev in enumerate(out_devs):
        group = _op(len(rows), "aten.mul.Tensor", seq, seq, [(1e-3, V.WARNING)] * 2, out_dev)
        if statistics:
            for r in group:
                r.max_rel_diff, r.rel_euc_dist = r.rel_euc_dist, None
        rows += group
    return rows


def test_statistics_alone_make_no_error_of_an_amplification_honest_kernels_reach():
    """A tiny Llama's clean bf16 autocast step against fp32, dumped in statistics mode: a
    backward mul of RMSNorm turned a gradient whose extremes deviated by 0.34% into an output
    whose max deviated by 1.6%, 4.9x, an outlier among the run's muls, and was named the
    culprit of a clean run (tensor dumps of the same step: 1.07x, pass). A tensor's statistics
    do not bound the deviation of its other elements; on them an outlier is at most a warning
    below amplification_error, while a kernel far beyond it is still the culprit."""
    devs = [1e-3] * 20 + [5e-3]
    rows, summary = _judged(_muls(devs, statistics=True))
    out = rows[-1]
    assert out.amplification > 4 and out.amplification_z >= 5
    assert out.verdict == V.WARNING and summary["culprit"] is None
    assert "statistics" in out.message and "compare -r" in out.message
    rows, summary = _judged(_muls(devs, statistics=False))  # the same figures from tensors
    assert rows[-1].verdict == V.ERROR and summary["culprit"]["index"] == rows[-1].index
    rows, summary = _judged(_muls([1e-3] * 20 + [5e-2], statistics=True))  # 25x: a kernel
    assert rows[-1].verdict == V.ERROR and summary["culprit"]["index"] == rows[-1].index
