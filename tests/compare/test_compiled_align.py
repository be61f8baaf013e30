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


def _out_buffer(seq: int, idx: int) -> TensorRecord:
    """An extern kernel's `out=` buffer before it is written (its last input)."""
    return _t(seq, idx, 1000 + seq, {}, first=-1, io=0, shape=(8,))


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


def test_a_strided_view_of_a_compiled_write_pairs_with_the_eager_view_of_its_value():
    """The pooler's matmul reads `hidden[:, 0]` of the LayerNorm kernel's output, a strided
    `reinterpret_tensor` of it (recorded in `extra.view_of`): it pairs with the eager run's
    select of the value that kernel output was paired with, not with a look-alike."""
    v = {"l2": 3.0, "mean": 0.2, "max": 1.0, "min": -1.0}
    v_select = {"l2": 3.05, "mean": 0.21, "max": 1.0, "min": -1.0}
    golden = [_op(0, "aten.mm.default", [], [_t(0, 0, 0, A, shape=(4, 8))]),
              _op(1, "aten.select.int", [_t(1, 0, 1, A, first=0, io=0, shape=(4, 8))],
                  [_t(1, 0, 2, v_select, shape=(8,))]),
              _op(2, "aten.exp.default", [], [_t(2, 0, 3, v, shape=(8,))])]  # a look-alike
    mm = _op(0, "aten.mm.out", [], [_t(0, 0, 10, A, shape=(4, 8))])
    user = _op(1, "aten.mul.out", [_t(1, 0, 11, v, io=0, shape=(8,)), _out_buffer(1, 1)],
               [_t(1, 0, 12, {"l2": 50.0, "mean": 9.0, "max": 20.0, "min": 1.0}, shape=(8,))],
               extra={"view_of": {"i0": 10}})
    [p] = [p for p in compiled_pairs([mm, user], golden) if p.my_op is user and p.io == "input"]
    assert p.golden is not None and p.golden.row == 2, (p.golden, p.reason)


def test_a_view_of_a_write_without_golden_value_stays_unpaired():
    v = {"l2": 3.0, "mean": 0.2, "max": 1.0, "min": -1.0}
    far = {"l2": 90.0, "mean": 5.0, "max": 9.0, "min": 1.0}
    golden = [_op(0, "aten.exp.default", [], [_t(0, 0, 0, v, shape=(8,))])]
    mm = _op(0, "aten.mm.out", [], [_t(0, 0, 10, far, shape=(4, 8))])
    user = _op(1, "aten.mul.out", [_t(1, 0, 11, v, io=0, shape=(8,)), _out_buffer(1, 1)], [],
               extra={"view_of": {"i0": 10}})
    [p] = [p for p in compiled_pairs([mm, user], golden) if p.my_op is user and p.io == "input"]
    assert p.golden is None and "a view of what aten.mm.out seq 0 wrote" in p.reason, p.reason


def test_a_view_is_found_only_inside_a_dense_current_write():
    """`TensorStates.get_view`: a fresh strided view over part of what a launch wrote finds
    that write (not as the same state: `get_alias` does not); memory the write does not hold
    (a strided write's gaps), or a write since overwritten, is no view of it."""
    import torch

    from accuracy.dumper.identity import TensorStates

    seen = TensorStates(track_storage=True)
    buf = torch.randn(4, 8)
    seen.put(buf, (7, "stats"), memory=True)
    cls = buf.as_strided((4,), (8,), 0)  # buf[:, 0], a fresh object as Inductor hands it over
    assert seen.get_alias(cls) is None and seen.get_view(cls) == (7, "stats")
    assert seen.get_view(torch.randn(4)) is None
    big = torch.randn(4, 16)
    seen.put(big[:, ::2], (8, "stats"), memory=True)  # writes every other column only
    gap = big.as_strided((4,), (2,), 1)  # odd columns of row 0: none of its elements
    assert seen.get_view(gap) is None
    buf.add_(1)  # written since: no longer that launch's value
    assert seen.get_view(cls) is None


def test_a_value_far_from_every_free_eager_value_stays_unpaired():
    """An op of the compiled run that aligns with nothing and has no producer is paired by
    value only with an eager value of its phase, dtype and shape whose statistics are near:
    a far one is another value, not an error (Inductor's own intermediates read as errors)."""
    far = {"l2": 90.0, "mean": 5.0, "max": 9.0, "min": 1.0}
    golden = [_op(0, "aten.mul.Tensor", [], [_t(0, 0, 0, A)])]
    add = _op(0, "aten.add.Tensor", [], [_t(0, 0, 10, far)])
    p = _output(compiled_pairs([add], golden), add)
    assert p.golden is None and "near it" in p.reason, (p.golden_op, p.reason)
    near = _op(0, "aten.add.Tensor", [], [_t(0, 0, 10, B)])
    p = _output(compiled_pairs([near], golden), near)
    assert p.golden_op is golden[0] and "by value" in p.note


def test_an_op_holding_bytes_another_op_wrote_pairs_with_that_ops_value():
    """A view the dump stored as a link to an extern matmul's write (same bytes) holds the
    matmul's value: it pairs with the golden value the matmul paired with, never with a
    look-alike by statistics (an unrelated eager add of similar statistics)."""
    golden = [_op(0, "aten.mm.default", [], [_t(0, 0, 0, A)]),
              _op(1, "aten.add.Tensor", [], [_t(1, 0, 1, B)])]
    mm = _op(0, "aten.mm.out", [], [_t(0, 0, 10, A)])
    view = _op(1, "aten.view.default", [_t(1, 0, 11, A, first=10, io=0)],
               [_t(1, 0, 12, A, first=10)])
    p = _output(compiled_pairs([mm, view], golden), view)
    assert p.golden_op is golden[0] and "by its producer" in p.note, (p.golden_op, p.note)


def _placed(seq: int, op: str, module: str, outs: list, extra: dict | None = None
            ) -> OpRecord:
    """A row with a source line (origin pairing looks only at those)."""
    return OpRecord(seq, op, "backward", module, "cnn.py:15", "", "", 0, extra or {}, [], outs)


def _kernel(meta: dict, stats: dict) -> OpRecord:
    out = {"node": "n", "op": "aten.where.self", "source": "cnn.py:15", "multi": False,
           "fused": [], **meta}
    return _placed(0, "inductor.cpp_fused_k_0", "CNN.n1", [_t(0, 0, 10, stats)],
                   {"compiled": "inductor", "outputs": [out]})


def test_a_buffer_pairs_with_its_own_op_on_the_line_before_a_look_alike_of_another_op():
    """Inductor placed ReLU's `threshold_backward` under the max pool whose gradient it reads
    (`CNN.pool`); eager ran it in `CNN`. Same line, no op of that module: the line's nearest
    output was max pool's backward (a look-alike); the op itself, in the containing module,
    is the value."""
    golden = [_placed(0, "aten.max_pool2d_with_indices_backward.default", "CNN.pool",
                      [_t(0, 0, 0, A)]),
              _placed(1, "aten.threshold_backward.default", "CNN", [_t(1, 0, 1, B)])]
    k = _kernel({"module": "CNN.pool", "orig": "aten.threshold_backward.default"}, A)
    p = _output(compiled_pairs([k], golden), k)
    assert p.golden_op is golden[1] and "by op and source line" in p.note, (p.golden_op,
                                                                            p.note)
    # an unrelated module's op of that name is not it: the line's look-alike stands
    golden[1] = _placed(1, "aten.threshold_backward.default", "Other", [_t(1, 0, 1, B)])
    p = _output(compiled_pairs([k], golden), k)
    assert p.golden_op is golden[0] and "among its module and source line" in p.note


def test_a_value_inside_a_decomposition_pairs_with_no_eager_output():
    """BatchNorm backward's sum of grad * (x - mean), recorded as inside the op's
    decomposition: eager's grad_bias of the same call, same shape and near statistics, is
    not its value."""
    golden = [_placed(0, "aten.native_batch_norm_backward.default", "CNN.n1",
                      [_t(0, 2, 0, B)])]
    meta = {"module": "CNN.n1", "orig": "aten.native_batch_norm_backward.default",
            "op": "aten.sum.dim_IntList"}
    k = _kernel({**meta, "inner": True}, A)
    p = _output(compiled_pairs([k], golden), k)
    assert p.golden is None and "inside the decomposition" in p.reason, (p.golden_op, p.reason)
    k = _kernel(meta, A)  # the op's own output: paired by origin
    p = _output(compiled_pairs([k], golden), k)
    assert p.golden_op is golden[0] and "by origin" in p.note, (p.golden_op, p.note)


def test_a_detach_of_a_parameter_pairs_with_the_eager_tensor_it_detaches():
    """Dynamo detaches `conv1.bias` for the compiled graph; eager has no such detach. The
    detach holds the parameter's value: eager's convolution reads it (bit-identical), while
    BatchNorm's saved mean, of the same shape and near statistics, is another value (it read
    as a false warning, cosine 0.989, and so did every later reader of the bias)."""
    golden = [_op(0, "aten.convolution.default", [_t(0, 2, 0, A, io=0, shape=(8,))],
                  [_t(0, 0, 1, ONES, shape=(4, 8))], module="CNN.conv1", phase="forward"),
              _op(1, "aten.native_batch_norm.default", [],
                  [_t(1, 1, 2, B, shape=(8,))], module="CNN.n1", phase="forward")]
    detach = _op(0, "aten.detach.default", [_t(0, 0, 10, A, io=0, shape=(8,))],
                 [_t(0, 0, 11, A, first=10, shape=(8,))], module="CNN.conv1", phase="forward")
    p = _output(compiled_pairs([detach], golden), detach)
    assert p.golden is golden[0].inputs[0] and "as the value it detaches" in p.note \
        and "input 2" in p.note, (p.golden_op, p.note)


def test_out_calls_in_another_order_pair_by_value_not_by_position():
    """DDP's reducer scales each gradient with `mul.out` when its bucket is ready: in another
    order under the compiled backward than under eager's, with other ops between. Positional
    alignment paired blocks.1.fc1's with blocks.0.fc1's (a false error, the culprit, on a
    2-rank compiled DDP job); each pairs with its own module's value."""
    def stats(i: int) -> dict:
        return {"l2": 8.0 + 10 * i, "mean": 0.1 * (i + 1) * (-1) ** i, "max": 2.0 + 3 * i,
                "min": -2.0 - i}

    def run(order: list[int], detach_after: set[int], rows: int) -> list[OpRecord]:
        out: list[OpRecord] = []
        for b in order:
            out.append(_op(len(out), "aten.mul.out", [], [_t(len(out), 0, rows + len(out),
                                                               stats(b))], module=f"M.b{b}.fc1"))
            if b in detach_after:
                out.append(_op(len(out), "aten.detach.default", [],
                               [_t(len(out), 0, rows + len(out), stats(9))], module=f"M.b{b}.ln"))
        return out

    golden = run([0, 1, 2, 3], {0, 1, 2}, 100)
    mine = run([3, 1, 2, 0], {2}, 200)
    pairs = compiled_pairs(mine, golden)
    for r in mine:
        if r.op == "aten.mul.out":
            got = _output(pairs, r).golden_op
            assert got is not None and got.module == r.module, (r.module, got)


A_ROUNDED = {"l2": 8.0000001, "mean": 0.1, "max": 2.0000002, "min": -2.0}  # A, to rounding


def test_a_buffer_pairs_with_the_lines_value_equal_to_rounding_before_its_ops_look_alike():
    """Tiny GPT-2's SDPA (head dim = sequence length): Inductor fuses the scaling of k^T into
    a `clone`; eager's only `clone` of that line is of the scaled q, alike in statistics. The
    line's `mul.Scalar` output with the buffer's statistics to rounding holds its value."""
    golden = [_placed(0, "aten.mul.Scalar", "CNN.n1", [_t(0, 0, 0, A_ROUNDED)]),
              _placed(1, "aten.clone.default", "CNN.n1", [_t(1, 0, 1, B)])]
    k = _kernel({"module": "CNN.n1", "op": "aten.clone.default",
                 "orig": "aten.clone.default"}, A)
    p = _output(compiled_pairs([k], golden), k)
    assert p.golden_op is golden[0] and "statistics equal to rounding" in p.note, p.note
    # no value of the line equal to rounding: its op's look-alike, by origin, as before
    golden[0] = _placed(0, "aten.mul.Scalar", "CNN.n1", [_t(0, 0, 0, ONES)])
    p = _output(compiled_pairs([k], golden), k)
    assert p.golden_op is golden[1] and "by origin" in p.note, p.note
