"""How the eager rows of a compiled run pair with an eager run (accuracy/compare/
compiled_align.py), on crafted records (no compile): rows that hold a value the compiled
program wrote pair with what holds that value in the eager run, never by their position among
the eager run's ops of the same name, nor with a look-alike by statistics."""

from __future__ import annotations

from accuracy.compare.compiled_align import compiled_pairs
from accuracy.dumpfile.reader import OpRecord, TensorRecord

A = {"l2": 8.0, "mean": 0.1, "max": 2.0, "min": -2.0}
B = {"l2": 8.2, "mean": 0.12, "max": 2.1, "min": -2.0}  # a look-alike of A
ONES = {"l2": 8.0, "mean": 1.0, "max": 1.0, "min": 1.0}
NEAR_ONES = {"l2": 7.9, "mean": 0.99, "max": 1.0, "min": 0.9}


def _t(seq: int, idx: int, row: int, stats: dict, first: int | None = None, io: int = 1,
       shape: tuple = (8, 8)) -> TensorRecord:
    return TensorRecord(None, row, "op", seq, io, idx, "float32", shape, (), "cpu",
                        -1, 0, row if first is None else first, dict(stats))


def _op(seq: int, op: str, ins: list, outs: list, module: str = "M.lin",
        phase: str = "backward", extra: dict | None = None) -> OpRecord:
    return OpRecord(seq, op, phase, module, "", "", "", 0, extra or {}, ins, outs)


def _output(pairs, op: OpRecord):
    [p] = [p for p in pairs if p.my_op is op and p.io == "output"]
    return p


def test_a_detach_of_a_compiled_write_pairs_with_its_producer_not_by_position():
    """AccumulateGrad's detach of a gradient an extern matmul wrote: the eager run has a
    detach at the same place, of another tensor (a bias gradient). Positional alignment
    paired the two; the detach holds the matmul's value."""
    golden = [_op(0, "aten.mm.default", [], [_t(0, 0, 0, A)]),
              _op(1, "aten.detach.default", [_t(1, 0, 1, B, first=90, io=0)],
                  [_t(1, 0, 2, B, first=90)])]
    mm = _op(0, "aten.mm.out", [], [_t(0, 0, 10, A)])
    det = _op(1, "aten.detach.default", [_t(1, 0, 11, A, first=10, io=0)],
              [_t(1, 0, 12, A, first=10)])
    p = _output(compiled_pairs([mm, det], golden), det)
    assert p.golden_op is golden[0] and "by its producer" in p.note, (p.golden_op, p.note)


def test_a_detach_whose_producer_has_no_golden_value_stays_unpaired():
    far = {"l2": 90.0, "mean": 5.0, "max": 9.0, "min": 1.0}
    golden = [_op(0, "aten.mm.default", [], [_t(0, 0, 0, A)]),
              _op(1, "aten.detach.default", [_t(1, 0, 1, B, first=90, io=0)],
                  [_t(1, 0, 2, B, first=90)])]
    mm = _op(0, "aten.mm.out", [], [_t(0, 0, 10, far)])  # no eager value near it
    det = _op(1, "aten.detach.default", [_t(1, 0, 11, far, first=10, io=0)],
              [_t(1, 0, 12, far)])  # stored afresh (a non-contiguous detach)
    p = _output(compiled_pairs([mm, det], golden), det)
    assert p.golden is None and "its producer (aten.mm.out seq 0)" in p.reason, p.reason


def test_a_copy_pairs_with_its_sources_golden_value_not_a_look_alike():
    """AOTAutograd makes a contiguous tangent of an expanded gradient of ones (`copy_` into
    `empty_strided`): it held the value of the eager run's `expand`, not the nearest golden
    value in statistics (a `tanh_backward` output near ones: a false warning on BERT)."""
    golden = [_op(0, "aten.expand.default", [], [_t(0, 0, 0, ONES)]),
              _op(1, "aten.tanh_backward.default", [], [_t(1, 0, 1, NEAR_ONES)],
                  module="M.act")]
    expand = _op(0, "aten.expand.default", [], [_t(0, 0, 10, ONES)])
    empty = _op(1, "aten.empty_strided.default", [], [_t(1, 0, 11, {}, first=-1)])
    copy = _op(2, "aten.copy_.default", [_t(2, 0, 12, {}, first=-1, io=0),
                                         _t(2, 1, 13, ONES, first=10, io=0)],
               [_t(2, 0, 14, ONES)])
    p = _output(compiled_pairs([expand, empty, copy], golden), copy)
    assert p.golden_op is golden[0] and "by its source" in p.note, (p.golden_op, p.note)
