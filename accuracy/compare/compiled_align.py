"""Aligning a compiled run (Inductor kernel rows) with an eager run, tensor by tensor.

A fused kernel has no eager op of its name: `inductor.cpp_fused_gelu_1` materialises the value
that eager's `aten.gelu` produced, and fuses away the values in between. So the eager parts of
the compiled run (graph breaks, code outside compiled regions) are aligned as usual
(`align.align`), and each materialised buffer of a kernel, and each op of the compiled run the
usual alignment left alone (extern kernels such as `aten.addmm.out`), is paired with the eager
op output that holds the same value: same phase, dtype and shape, in the module its origin node
came from (`nn_module_stack`, recorded with the buffer), nearest in statistics. A kernel's
inputs are paired with what their producers were paired with (tensor dumps link a buffer a
kernel or extern call wrote to the row that wrote it), or with nothing when the producer
found no eager value; only inputs no op of the run wrote (weights, graph inputs) are paired by
the same nearest-value rule. Eager values that no
buffer holds (fused away) are reported as golden-only rows with that reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accuracy.aten import VIEW_PREFIXES
from accuracy.compare.align import Mapping, Pair, align
from accuracy.dumpfile import OpRecord, TensorRecord

MAX_DISTANCE = 1.0  # statistics further apart than this hold different values, not an error
SAME_VALUE = 1e-3  # statistics this near (in golden RMS units) are one value, to rounding
# Inductor's lowerings of a multi-output op, output -> the output of the op the user's code
# called (`original_aten`) that it is: max_pool's values (its int8 offsets are no eager value).
# Not `var_mean` under `native_layer_norm`: a piece of the decomposition, not its outputs.
LOWERED = {"prims._low_memory_max_pool_with_offsets.default": {0: 0}}
FUSED_AWAY = ("only in golden run: no buffer of the compiled run holds this value (fused "
              "away inside a kernel)")


def is_kernel(r: OpRecord) -> bool:
    return bool((r.extra or {}).get("compiled"))


def has_kernels(recs: list[OpRecord]) -> bool:
    return any(is_kernel(r) for r in recs)


@dataclass
class Sides:
    """Which two tensors a row compares (my tensor of `my_op`, the golden tensor it matches),
    and why one is missing; compare's pair specs (`compare/pairs.py`) extend it too."""

    my_op: OpRecord | None
    golden_op: OpRecord | None
    io: str
    idx: int
    my: TensorRecord | None
    golden: TensorRecord | None
    reason: str = ""


@dataclass
class TensorPair(Sides):
    """One row of a compiled run before metrics, with its kernel buffer's own origin."""

    group: int | None = None  # golden seq shared by all rows of one kernel (judge's grouping)
    module: str | None = None  # the buffer's own module and source (a kernel fuses several)
    source: str | None = None
    note: str = ""


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _distance(a: dict[str, float], b: dict[str, float], numel: int) -> float:
    """How far apart two tensors' statistics are, in units of the golden tensor's RMS."""
    l2a, l2b = _num(a.get("l2")), _num(b.get("l2"))
    if l2a is None or l2b is None:
        return math.inf
    rms = l2b / math.sqrt(max(numel, 1)) + 1e-30
    d = abs(l2a - l2b) / (l2b + 1e-30)
    for k in ("mean", "max", "min"):
        x, y = _num(a.get(k)), _num(b.get(k))
        if x is not None and y is not None:
            d += abs(x - y) / rms
    return d


def _norm(module: str) -> str:
    return module.replace("._orig_mod", "")


def _related(a: str, b: str) -> int:
    """2: same module, 1: one contains the other, 0: unrelated."""
    a, b = _norm(a), _norm(b)
    if a == b:
        return 2
    if a and b and (a.startswith(b + ".") or b.startswith(a + ".")):
        return 1
    return 0


def origin_key(phase: str, module: str, source: str, op: str) -> tuple[str, str, str, str]:
    """Where a value was computed: phase, module path, source line and the ATen op the user's
    code called (a kernel buffer's origin node's `original_aten`, an eager row's op)."""
    return phase, _norm(module), source, op


def _op_base(op: str) -> str:
    """An ATen op without its overload: `aten.mul.out` and `aten.mul.Tensor` are one op."""
    return op.rsplit(".", 1)[0]


class _Pool:
    """Golden op outputs left unpaired, by (phase, dtype, shape) and by origin key."""

    def __init__(self, recs: list[OpRecord]) -> None:
        self.by_key: dict[tuple, list[tuple[OpRecord, TensorRecord]]] = {}
        self.by_origin: dict[tuple, list[tuple[OpRecord, TensorRecord]]] = {}
        self.by_line: dict[tuple, list[tuple[OpRecord, TensorRecord]]] = {}
        self.by_op: dict[tuple, list[tuple[OpRecord, TensorRecord]]] = {}
        for r in recs:
            key = origin_key(r.phase, r.module, r.source, r.op)
            for t in r.outputs:
                self.by_key.setdefault((r.phase, t.dtype, tuple(t.shape)), []).append((r, t))
                if r.source:
                    self.by_origin.setdefault(key, []).append((r, t))
                    self.by_line.setdefault(key[:3], []).append((r, t))
                    self.by_op.setdefault((r.phase, r.source, r.op), []).append((r, t))
        self.used: set[int] = set()

    def take_origin(self, phase: str, t: TensorRecord, meta: dict
                    ) -> tuple[tuple[OpRecord, TensorRecord] | None, str]:
        """The golden value a kernel buffer holds, found by where it was computed: the eager
        outputs of the same phase, module, source line and original ATen op, of its dtype and
        shape, in order (the first call not yet paired), nearest in statistics within one call;
        an output of a multi-output node only by its own op and output index. Else the same op
        on that line in a module containing (or inside) the buffer's (a backward node Inductor
        placed in a neighbour's module: ReLU's `threshold_backward` under the max pool whose
        gradient it reads), before any other op of the line: the op is the surer sign. Else
        the outputs of that module and line, nearest in statistics. (None, why) when none
        holds it."""
        module, source = meta.get("module") or "", meta.get("source") or ""
        op = meta.get("orig") or meta.get("op") or ""
        n = math.prod(t.shape)
        shape = tuple(t.shape)

        def near(cands: list[tuple[OpRecord, TensorRecord]]) -> list[tuple[tuple, float]]:
            out = [(c, _distance(t.stats, c[1].stats, n)) for c in cands
                   if c[1].dtype == t.dtype and tuple(c[1].shape) == shape]
            return [(c, d) for c, d in out if d <= MAX_DISTANCE]

        if meta.get("multi"):
            node_op, index = meta.get("op") or "", meta.get("index", -1)
            found = []
            keys = [(node_op, index)]
            lowered = LOWERED.get(node_op, {}).get(index)
            if lowered is not None and meta.get("orig"):
                keys.append((meta["orig"], lowered))
            for key_op, i in keys:
                found = near([c for c in self.by_origin.get(
                    origin_key(phase, module, source, key_op), []) if i < 0 or c[1].idx == i])
                if found:
                    break
            if not found:
                return None, (f"only in my run: output {index if index >= 0 else '?'} of "
                              f"{node_op}, which Inductor keeps and eager does not materialise")
            how = "origin"
        else:
            found = near(self.by_origin.get(origin_key(phase, module, source, op), []))
            how = "origin"
            if found and min(d for _, d in found) > SAME_VALUE:
                # the op's outputs of this module and line are only alike in statistics, while
                # another op's output of the line has the buffer's statistics to rounding: that
                # one holds its value (SDPA's scaled k^T, fused into a `clone`, took eager's
                # clone of the scaled q when head dim = sequence length)
                same = [cd for cd in near([c for c in self.by_line.get(
                    (phase, _norm(module), source), []) if c[1].row not in self.used])
                    if cd[1] <= SAME_VALUE]
                if same:
                    found, how = same, "same"
            if not found:
                found, how = near([c for c in self.by_op.get((phase, source, op), [])
                                   if _related(module, c[0].module)]), "op"
            if not found:
                found, how = near(self.by_line.get((phase, _norm(module), source), [])), "line"
            if not found:
                return None, ("only in my run: no eager value computed by this module and "
                              f"source line ({op}) holds it")
        used = self.used
        if how in ("origin", "op"):
            (r, g), _ = min(found, key=lambda cd: (cd[0][1].row in used, cd[0][0].seq, cd[1]))
        else:
            (r, g), _ = min(found, key=lambda cd: (cd[0][1].row in used, cd[1]))
        used.add(g.row)
        return (r, g), how

    def take(self, phase: str, t: TensorRecord, module: str, op: str = ""
             ) -> tuple[OpRecord, TensorRecord] | None:
        """The golden value `t` holds: closest module first, then the same ATen op (DDP's
        reducer scales each gradient with `mul.out`, in another order than eager's: a
        transposed weight of the module is as near by statistics), then not yet paired, then
        nearest statistics; None when none is near enough to be the same value."""
        n = math.prod(t.shape)
        cands = [(c, _distance(t.stats, c[1].stats, n))
                 for c in self.by_key.get((phase, t.dtype, tuple(t.shape)), [])]
        cands = [(c, d) for c, d in cands if d <= MAX_DISTANCE]
        if not cands:
            return None
        mine = _op_base(op)
        (r, g), _ = min(cands, key=lambda cd: (-_related(module, cd[0][0].module),
                                               bool(mine) and _op_base(cd[0][0].op) != mine,
                                               cd[0][1].row in self.used, cd[1]))
        self.used.add(g.row)
        return r, g

    def left(self) -> list[tuple[OpRecord, TensorRecord]]:
        return [c for cs in self.by_key.values() for c in cs if c[1].row not in self.used]


# Ops whose output holds input 0's value unchanged (dynamo's detach of a compiled output,
# AccumulateGrad's detach of a gradient a kernel wrote)
HOLDERS = ("aten.detach.default", "aten.alias.default")


def _first(t: TensorRecord) -> int:
    return t.first if t.first >= 0 else t.row


def view_of(r: OpRecord, io: str, idx: int) -> int | None:
    """The row of the write (a kernel's, an extern call's) whose memory tensor `idx` of `r`
    is a strided view of (`hidden[:, 0]` of a kernel output), as the recorder found it."""
    got = ((r.extra or {}).get("view_of") or {}).get(f"{io[0]}{idx}")
    return got if isinstance(got, int) and not isinstance(got, bool) else None


def _holds_compiled(r: OpRecord, compiled: set[int]) -> bool:
    """A detach (alias) of my run whose input is a value the compiled program wrote, or a
    strided view of one: it holds that value, so it pairs by its producer, never by its
    position among the eager run's detaches."""
    if r.op not in HOLDERS or not r.inputs or is_kernel(r):
        return False
    return _first(r.inputs[0]) in compiled or view_of(r, "input", 0) in compiled


# Ops whose output is a copy of one input's value: op -> that input's position
COPIES = {"aten.copy_.default": 1, "aten.clone.default": 0, "aten.lift_fresh_copy.default": 0}


def _copied(r: OpRecord, t: TensorRecord) -> TensorRecord | None:
    """The input whose value output `t` of a copy holds (the source of a `copy_`: the
    contiguous tangent AOTAutograd makes of an expanded gradient), same dtype and shape."""
    i = COPIES.get(r.op)
    if i is None or t.idx != 0 or i >= len(r.inputs):
        return None
    src = r.inputs[i]
    return src if src.dtype == t.dtype and tuple(src.shape) == tuple(t.shape) else None


def _golden_views(golden: list[OpRecord]) -> dict[int, list[tuple[OpRecord, TensorRecord]]]:
    """Golden tensor (its first row) -> the outputs of the view ops taken of it."""
    out: dict[int, list[tuple[OpRecord, TensorRecord]]] = {}
    for r in golden:
        if r.inputs and r.op.startswith(VIEW_PREFIXES):
            src = _first(r.inputs[0])
            out.setdefault(src, []).extend((r, t) for t in r.outputs)
    return out


def _tensor_pairs(p: Pair) -> list[TensorPair]:
    out = []
    for io in ("input", "output"):
        mine = {t.idx: t for t in getattr(p.my, io + "s")}
        theirs = {t.idx: t for t in getattr(p.golden, io + "s")}
        for idx in sorted(set(mine) | set(theirs)):
            out.append(TensorPair(p.my, p.golden, io, idx, mine.get(idx), theirs.get(idx),
                                  p.reason))
    return out


def compiled_pairs(my: list[OpRecord], golden: list[OpRecord], mapping: Mapping | None = None
                   ) -> list[TensorPair]:
    """Tensor pairs of a compiled run (my) against an eager run (golden), in my order."""
    compiled: set[int] = set()  # rows of values the compiled program wrote, or detached
    holders: set[int] = set()
    for r in my:
        if _holds_compiled(r, compiled):
            holders.add(r.seq)
        elif not (is_kernel(r) or r.op.endswith(".out")):
            continue
        compiled.update(t.row for t in r.outputs)
    # `out=` calls (the compiled program's extern kernels, DDP's reducer scaling each gradient)
    # run in another order than eager's ops: paired by value, same op first, never by position
    # (the reducer's `mul.out` of blocks.1.fc1 took blocks.0.fc1's place: a false error)
    plain = [r for r in my if not is_kernel(r) and r.seq not in holders
             and not r.op.endswith(".out")]
    pairs = align(plain, golden, mapping)
    matched = {p.my.seq: p for p in pairs if p.my is not None and p.golden is not None}
    golden_free = [p.golden for p in pairs if p.my is None and p.golden is not None]
    pool = _Pool(golden_free)
    every = _Pool(golden)  # inputs may match any golden value, taken or not
    for r in golden:
        for t in r.inputs:
            every.by_key.setdefault((r.phase, t.dtype, tuple(t.shape)), []).append((r, t))
    golden_of: dict[int, TensorRecord] = {}  # my tensor's first row -> golden tensor
    made: dict[int, OpRecord] = {}  # my tensor's first row -> the op that wrote it
    by_row = {t.row: r for r in golden for t in r.outputs + r.inputs}  # golden tensor -> op
    gviews = _golden_views(golden)
    out: list[TensorPair] = []

    def through_view(t: TensorRecord, w: int) -> tuple[tuple[OpRecord, TensorRecord] | None,
                                                        str]:
        """The golden value of `t`, a strided view of write `w`: the eager run's view of the
        same shape of what `w` was paired with, nearest in statistics; (None, why) when
        there is none, never a look-alike elsewhere in the run."""
        producer = made.get(w)
        what = f"{producer.op} seq {producer.seq}" if producer is not None else f"row {w}"
        g = golden_of.get(w)
        if g is None:
            return None, (f"a view of what {what} wrote, which holds no value of the golden "
                          "run")
        n = math.prod(t.shape)
        cands = [((vop, gt), _distance(t.stats, gt.stats, n)) for vop, gt in gviews.get(
            _first(g), []) if gt.dtype == t.dtype and tuple(gt.shape) == tuple(t.shape)]
        cands = [c for c in cands if c[1] <= MAX_DISTANCE]
        if not cands:
            return None, (f"a view of what {what} wrote; no view the eager run took of its "
                          f"golden value ({by_row[g.row].op} seq {by_row[g.row].seq}) has "
                          "this shape and values")
        return min(cands, key=lambda c: c[1])[0], "as a view of its producer's golden value"

    def link(t: TensorRecord | None, g: TensorRecord | None) -> None:
        if t is not None and g is not None:
            golden_of.setdefault(t.first if t.first >= 0 else t.row, g)

    for r in my:
        for t in r.outputs:
            made.setdefault(t.row, r)
        p = matched.get(r.seq)
        if p is not None:
            for tp in _tensor_pairs(p):
                link(tp.my, tp.golden)
                out.append(tp)
            continue
        kernel = is_kernel(r)
        outs_meta = (r.extra or {}).get("outputs") or []
        rows: list[TensorPair] = []
        group = None
        for t in r.outputs:
            meta = outs_meta[t.idx] if kernel and t.idx < len(outs_meta) else {}
            module = meta.get("module") or r.module
            if kernel and meta.get("inner"):
                # a value inside the decomposition of the op the user's code called (BatchNorm
                # backward's sum of grad * (x - mean)): eager never materialises it, so no
                # eager output of that op is its counterpart (replay still judges it)
                rows.append(TensorPair(r, None, "output", t.idx, t, None,
                                       f"only in my run: {meta.get('node') or 'a value'} is "
                                       f"inside the decomposition of {meta.get('orig')}, "
                                       "not one of its outputs", module=module,
                                       source=meta.get("source")))
                continue
            if kernel and meta.get("source"):  # a buffer with a known origin node
                hit, how = pool.take_origin(r.phase, t, meta)
                if hit is None:
                    rows.append(TensorPair(r, None, "output", t.idx, t, None, how,
                                           module=module, source=meta.get("source")))
                    continue
                how = {"same": "by value (statistics equal to rounding) among its module and "
                               "source line's outputs",
                       "origin": "by origin (same module, source line and op)",
                       "op": "by op and source line (in a module containing or inside its "
                             "own)"}.get(how, "by value among its module and source line's "
                                              "outputs")
            elif kernel and meta.get("multi"):
                rows.append(TensorPair(r, None, "output", t.idx, t, None,
                                       f"only in my run: one output of {meta.get('op')} "
                                       "that Inductor keeps, not a value eager materialises",
                                       module=module, source=meta.get("source")))
                continue
            elif t.first != t.row and t.first in golden_of and t.first in made \
                    and made[t.first] is not r:
                # the bytes another op wrote (a `detach` of a weight gradient an extern
                # matmul wrote): that op's golden value, not a look-alike by statistics
                g0 = golden_of[t.first]
                hit, how = (by_row[g0.row], g0), "by its producer"
            elif r.seq in holders:
                # a detach of a compiled value: what it holds, or nothing (never the eager
                # run's detach at the same position, nor a look-alike)
                src = r.inputs[0]
                g0 = golden_of.get(_first(src))
                w = view_of(r, "input", 0)
                if g0 is not None and tuple(g0.shape) == tuple(t.shape):
                    hit, how = (by_row[g0.row], g0), "by its producer"
                elif w is not None and tuple(t.shape) == tuple(src.shape):
                    hit, how = through_view(t, w)
                else:
                    producer = made.get(_first(src))
                    hit, how = None, (f"its producer ({producer.op} seq {producer.seq}) holds "
                                      "no value of the golden run" if producer is not None
                                      else "no golden value holds what it detaches")
                if hit is None:
                    rows.append(TensorPair(r, None, "output", t.idx, t, None,
                                           f"only in my run: {how}", module=module))
                    continue
            elif not kernel and r.op in HOLDERS and r.inputs and t.idx == 0 \
                    and _first(r.inputs[0]) not in made \
                    and (hit := every.take(r.phase, r.inputs[0], r.module)) is not None:
                # a detach of a value no op of the run wrote (a parameter dynamo detaches for
                # the compiled graph): it holds that value, the eager tensor its input is
                # (conv1.bias as eager's convolution read it), never a look-alike output
                how = "as the value it detaches"
            elif not kernel and (src := _copied(r, t)) is not None \
                    and _first(src) in golden_of:
                # a copy holds its source's value: the golden value the source was paired
                # with, never a look-alike by statistics (a tangent of ones is near a
                # tanh_backward's output)
                g0 = golden_of[_first(src)]
                hit, how = (by_row[g0.row], g0), "by its source (a copy)"
            else:
                hit, how = pool.take(r.phase, t, module, r.op), "by value"
            if hit is None:
                rows.append(TensorPair(r, None, "output", t.idx, t, None,
                                       "only in my run: no eager value of this phase, dtype "
                                       "and shape is near it", module=module,
                                       source=meta.get("source")))
                continue
            gop, g = hit
            group = gop.seq if group is None else group
            link(t, g)
            note = (f"kernel {meta.get('node') or ''} fuses {', '.join(meta.get('fused') or [])}"
                    f"; matched {how} with golden {gop.op} seq {gop.seq} output {g.idx}") \
                if kernel else (f"matched {how} with golden {gop.op} "
                                f"{'output' if g in gop.outputs else 'input'} {g.idx}")
            rows.append(TensorPair(r, gop, "output", t.idx, t, g, module=module,
                                   source=meta.get("source") or r.source, note=note))
        ins: list[TensorPair] = []
        written = r.inputs[-1:] if r.op.endswith(".out") and not kernel else []
        for t in r.inputs:
            if t in written:  # an extern kernel's out= buffer before it is written
                continue
            first = t.first if t.first >= 0 else t.row
            g = golden_of.get(first)
            why = "no golden value matches this input"
            producer = made.get(first) if t.first != t.row else None
            w = view_of(r, "input", t.idx) if g is None and producer is None else None
            if w is not None and w in made:
                # a strided view of another launch's write (`hidden[:, 0]` of a kernel
                # output): the eager run's view of that write's golden value
                hit, why = through_view(t, w)
                g = hit[1] if hit is not None else None
            elif g is None and producer is not None and producer.seq != r.seq:
                # the value another op (a kernel, an extern call) wrote: it is what that
                # op's output was paired with, or nothing (never a look-alike by value)
                why = (f"its producer ({producer.op} seq {producer.seq}) holds no value of "
                       "the golden run")
            elif g is None:
                hit = every.take(r.phase, t, r.module)
                g = hit[1] if hit is not None else None
            ins.append(TensorPair(r, None, "input", t.idx, t, g, "" if g is not None else why))
        for tp in ins + rows:
            tp.group = group
        out.extend(ins + rows)
    for gop, g in pool.left():
        out.append(TensorPair(None, gop, "output", g.idx, None, g, FUSED_AWAY))
    return out
