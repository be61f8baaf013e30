"""One verdict per tensor, decided where the tensor is produced (see docs/metrics.md).

- An op output is judged by its **local error** when a replay gives one: the error ratio
  divided by what an honest kernel gives at its dtype, compute precision and reduction length
  (`local_excess`, numerics.py), and how far that stands out from the same op type in this
  run (`local_z`, a robust median/MAD score on the log excess).
- Without a replay, by **amplification**: how much the output's deviation from golden exceeds
  its inputs' deviation plus the op's own rounding (`amplification`), again with the outlier
  score among the same op type. Accumulated error alone never makes an error: a deviation the
  inputs explain is inherited, not this op's fault.
- A point-to-point receive's output was made on the rank that sent it: judged there, not by
  amplification over the buffer it wrote into (at most a warning here; a replay checks the
  transfer).
- An input row inherits the verdict of the op output that produced it; an input no recorded
  op produced (model input, parameter) is judged on its own, at most a warning.
- A module row summarises its ops: the worst verdict of the op outputs inside it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from accuracy.aten import COLLECTIVE_KINDS, is_collective
from accuracy.compare import arguments
from accuracy.compare.draws import cap_consumers, judge_random_ops, unmatched_draws
from accuracy.compare.numerics import own_error
from accuracy.compare.row import JUDGED, Row
from accuracy.compare.row import Verdict as V

_JUDGED = JUDGED
# Ops whose output jumps when an input crosses a threshold (relu's mask, max, comparisons,
# rounding): a tiny input deviation flips whole elements, so without a replay their
# amplification says nothing about their kernel. At most a warning there.
_DISCONTINUOUS = ("aten.threshold_backward", "aten.hardtanh_backward", "aten.max",
                  "aten.min", "aten.amax", "aten.amin", "aten.argmax", "aten.argmin",
                  "aten.sort", "aten.topk", "aten.gt", "aten.lt", "aten.ge", "aten.le",
                  "aten.eq", "aten.ne", "aten.where", "aten.sign", "aten.floor", "aten.ceil",
                  "aten.round", "aten.trunc", "aten.max_pool2d_with_indices",
                  "aten.max_pool2d_with_indices_backward", "aten.masked_fill",
                  "aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.heaviside",
                  "aten.leaky_relu_backward", "aten.nll_loss_forward")
# Ops that divide by (or take the log of) a value that deviates: how much they amplify their
# inputs' deviation depends on those values, without bound near zero. Adam's update divides
# each gradient's momentum by its own root mean square: a parameter whose true gradient is 0
# (a GPT-2 attention key bias) gets noise over noise, and its update differs by O(1) on an
# honest bf16 run: 130x "amplification" from an exact kernel. At most a warning without a
# replay, which judges the kernel on its own inputs.
_VALUE_CONDITIONED = ("aten.div", "aten.div_", "aten.addcdiv", "aten.addcdiv_",
                      "aten.reciprocal", "aten.reciprocal_", "aten.rsqrt", "aten.rsqrt_",
                      "aten.log", "aten.log_", "aten.log2", "aten.log10", "aten.log1p",
                      "aten._foreach_div", "aten._foreach_div_", "aten._foreach_addcdiv",
                      "aten._foreach_addcdiv_", "aten._foreach_reciprocal_",
                      "aten._foreach_rsqrt_", "aten._fused_adam", "aten._fused_adam_",
                      "aten._fused_adamw", "aten._fused_adamw_")
# Ops whose output is part of input 0's elements (a slice, a shard, a gathered subset): the
# deviation of that part is not bounded by the whole input's. FSDP2 cuts each parameter's
# gradient out of the reduce-scattered buffer with as_strided; a fault in one layer's gradient
# made its shard 3x "amplified" over the buffer, and the view was named the culprit. They copy
# values exactly or not at all: without a replay at most a warning; compare -r checks them.
_PART_OF_INPUT = tuple(f"aten.{n}" for m in (
    "select", "slice", "narrow", "as_strided", "diagonal", "unfold", "split",
    "split_with_sizes", "unbind", "chunk", "index_select", "gather", "index", "take",
    "masked_select") for n in (m, f"{m}_copy"))
KERNEL_PREFIX = "inductor."  # compiled kernel rows (accuracy/dumper/compiled/source.py)
MIN_GROUP = 4  # fewer calls of an op type than this: no outlier score
EMULATION_GROUP = 3  # ops of a compute precision whose median says how the device rounds


def _base(op: str | None) -> str:
    return (op or "").rsplit(".", 1)[0]


def amplification_is_evidence(op: str | None) -> bool:
    """False for ops whose amplification honest kernels reach (thresholds, divisions, views of
    part of their input): without
    a replay their score says nothing about their kernel, so it ranks them below the rest."""
    base = _base(op)
    return base not in _DISCONTINUOUS and base not in _VALUE_CONDITIONED \
        and base not in _PART_OF_INPUT


def is_receive(op: str | None) -> bool:
    """A point-to-point receive (`c10d.recv_`): its output was made on the rank that sent it."""
    parts = (op or "").split(".")
    return len(parts) > 1 and is_collective(parts[0]) and COLLECTIVE_KINDS.get(parts[1]) == "recv"


def own_evidence(row: Row) -> bool:
    """Whether a row judged warning or error is evidence against this rank's own work: a
    replay's local error, an amplification honest kernels do not reach, non-finite values
    born, arguments that differ. Not so an op output whose case is only an amplification
    honest kernels reach (Adam dividing the noise of a gradient that is 0 in exact arithmetic
    by its own root mean square), nor a receive (its deviation was made where it was sent),
    nor a row that takes another row's verdict (an input judged where produced, a module's
    summary): a rank with nothing else deviates within its precision."""
    if row.verdict not in (V.WARNING, V.ERROR):
        return False
    if row.kind != "op" or row.produced_by:
        return False
    if row.io != "output" or row.local_excess is not None or row.verdict == V.ERROR \
            or arguments.PREFIX in row.message:
        return True
    return amplification_is_evidence(row.op) and not is_receive(row.op)


def deviation(row: Row) -> float | None:
    """How far my tensor is from golden: rel_euc_dist, or from statistics when that is all
    there is (the largest relative difference of max/min/mean/L2)."""
    red = row.rel_euc_dist
    if red is not None:
        return float(red)
    vals = [abs(v) for v in (row.max_rel_diff, row.min_rel_diff, row.mean_rel_diff,
                             row.l2norm_rel_diff) if v is not None]
    if not vals:
        return None
    return float(max(vals))


def _robust_z(values: dict[int, float], floor: float) -> dict[int, float]:
    """Median/MAD score of each value among its group (log scale), spread floored."""
    if not values:
        return {}
    xs = sorted(values.values())
    med = xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])
    dev = sorted(abs(v - med) for v in xs)
    mad = dev[len(dev) // 2]
    spread = max(1.4826 * mad, floor)
    return {k: (v - med) / spread for k, v in values.items()}


def _log(x: float) -> float:
    if x is None or isinstance(x, float) and math.isnan(x):
        return 0.0
    return math.log(max(x, 1e-300)) if math.isfinite(x) else 700.0


def _groups(rows: list[Row]) -> list[tuple[list[Row], list[Row]]]:
    groups: dict[tuple, tuple[list[Row], list[Row]]] = {}
    for r in rows:
        if r.kind != "op" or r.seq_my is None or r.seq_golden is None:
            continue
        g = groups.setdefault((r.seq_my, r.seq_golden), ([], []))
        g[0 if r.io == "input" else 1].append(r)
    return list(groups.values())


def _kind(r: Row) -> tuple[str, int]:
    """The population a row's outlier score is taken in: its op type and output index (a
    convolution's grad_input and grad_weight are different kernels with different honest
    errors; pooled, their spread hides a faulty one)."""
    if (r.op or "").startswith(KERNEL_PREFIX):  # a fused kernel: its own launch site's calls
        return r.op or "", r.tensor_index or 0
    return _base(r.op), r.tensor_index or 0


def _with_outlier_scores(rows: list[Row], key: str, floor: float, pool: bool = True
                         ) -> dict[int, float]:
    """Robust score of each row's log `key` among the same op type in this run; an op type
    with fewer than MIN_GROUP calls is scored against every row of its compute precision
    (the key is already normalised by the op's own bound, so they are comparable)."""
    by_type: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    by_precision: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        v = getattr(r, key)
        if v is not None:
            by_type[_kind(r)][r.index] = _log(v)
            if not (r.op or "").startswith(KERNEL_PREFIX):  # a fused kernel's ops are its
                by_precision[r.compute_precision or ""][r.index] = _log(v)  # own: no pool
    z: dict[int, float] = {}
    for vals in by_type.values():
        if len(vals) >= MIN_GROUP:
            z.update(_robust_z(vals, floor))
    for vals in by_precision.values() if pool else ():
        if len(vals) >= MIN_GROUP:
            for k, v in _robust_z(vals, floor).items():
                z.setdefault(k, v)
    return z


def _centres(rows: list[Row], key: str) -> dict[int, float]:
    """Median log `key` of the group each row is scored in (as _with_outlier_scores)."""
    by_type: dict[tuple[str, int], list[Row]] = defaultdict(list)
    by_precision: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_type[_kind(r)].append(r)
        by_precision[r.compute_precision or ""].append(_log(getattr(r, key)))
    out: dict[int, float] = {}
    for grp in by_type.values():
        for r in grp:
            vals = ([_log(getattr(x, key)) for x in grp] if len(grp) >= MIN_GROUP
                    else by_precision[r.compute_precision or ""])
            out[r.index] = sorted(vals)[len(vals) // 2]
    return out


def level(x: float, z: float, rel: float, sec: dict[str, Any], prefix: str) -> V:
    """error / warning / pass from the excess x, the outlier score z and x relative to the
    median of its op type."""
    if x > sec[f"{prefix}_error"] or (z >= sec["outlier_error"]
                                       and rel >= sec["outlier_min_excess"]
                                       and x >= sec["outlier_min_excess"]):
        return V.ERROR
    if x > sec[f"{prefix}_warning"] or (z >= sec["outlier_warning"]
                                         and rel >= sec["outlier_min_excess"]
                                         and x >= sec["outlier_min_excess"]):
        return V.WARNING
    return V.PASS


def _judge_local(outs: list[Row], sec: dict[str, Any]) -> None:
    """Replay-given local error: excess over the honest bound, and outlier score."""
    with_local = []
    for o in outs:
        ratio, bound = o.local_error_ratio, o.local_bound or 1.0
        if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
            continue
        o.local_excess = ratio / bound if math.isfinite(ratio) else math.inf
        with_local.append(o)
    emulated = _use_emulated(with_local, sec)
    z = _with_outlier_scores(with_local, "local_excess", sec["spread_floor"])
    centre = _centres(with_local, "local_excess")
    for o in with_local:
        x = o.local_excess
        o.local_z = z.get(o.index)
        rel = math.exp(min(_log(x) - centre[o.index], 700.0))
        lv = level(x, o.local_z or 0.0, rel, sec, "excess")
        o.local_verdict = lv
        o.verdict = lv
        bits = [f"local error {x:.3g}x an honest kernel's (ratio {o.local_error_ratio:.3g},"
                f" expected {o.local_bound or 1:.3g} for K={o.reduction_length})"]
        if o.local_z is not None and abs(o.local_z) >= 1:
            bits.append(f"outlier score {o.local_z:.1f} among {_base(o.op)}")
        if o.index in emulated:
            bits.append(emulated[o.index])
        o.message = "; ".join([m for m in [o.message] if m] + bits)


def _use_emulated(rows: list[Row], sec: dict[str, Any]) -> dict[int, str]:
    """Fold the emulated residual into the local excess where the device is seen to round
    like the emulation: among this run's op outputs of the same compute precision and dtype
    (at least EMULATION_GROUP: one faulty op cannot move their median), the median emulated
    excess is at most `emulation_match`. A device that rounds otherwise (truncation, a
    narrower accumulator) leaves the honest ops' residuals above their bound: the emulated
    figure is then only reported. The same holds per kernel: where an op type has
    EMULATION_GROUP outputs of its own whose median is over `emulation_match`, that kernel
    rounds otherwise while the rest of the run does not (CPU fp16 convolution backward under
    fp16 autocast on a bf16 sim: 4-18x the bound on a clean run, every other op at 0), and
    its figure is only reported too. Returns row index -> note."""
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if r.emulated_excess is not None and math.isfinite(r.emulated_excess) \
                and r.compute_precision:
            groups[(r.compute_precision, r.dtype_my or "")].append(r)
    notes: dict[int, str] = {}
    match = sec.get("emulation_match", 1.0)
    for (compute, _), grp in groups.items():
        med = _median_excess(grp)
        if len(grp) < EMULATION_GROUP or med > match:
            why = (f"only {len(grp)} such ops" if len(grp) < EMULATION_GROUP else
                   f"median {med:.3g}x over {match:g}: the device does not round like the "
                   "emulation")
            for r in grp:
                notes[r.index] = (f"emulated ({compute} inputs) residual "
                                  f"{r.emulated_excess:.3g}x its bound, not used ({why})")
            continue
        kernels: dict[str, list[Row]] = defaultdict(list)
        for r in grp:
            kernels[_base(r.op)].append(r)
        unlike = set()
        for op, same in kernels.items():
            med = _median_excess(same)
            if len(same) >= EMULATION_GROUP and med > match:
                unlike.add(op)
                for r in same:
                    notes[r.index] = (f"emulated ({compute} inputs) residual "
                                      f"{r.emulated_excess:.3g}x its bound, not used (median "
                                      f"{med:.3g}x over {match:g} among {len(same)} {op} "
                                      "outputs: this kernel does not round like the emulation)")
        for r in grp:
            if _base(r.op) in unlike:
                continue
            x = r.emulated_excess
            assert x is not None
            if r.local_excess is None or x > r.local_excess:
                r.local_excess = x
            notes[r.index] = (f"emulated ({compute} inputs) residual {r.emulated_error:.3g}, "
                              f"{x:.3g}x an honest kernel's bound")
    return notes


def _median_excess(rows: list[Row]) -> float:
    xs = sorted(r.emulated_excess for r in rows)  # type: ignore[type-var]
    return xs[len(xs) // 2]


def _kernel_inputs(rows: list[Row]) -> dict[int, list[Row]]:
    """A compiled kernel's input rows by its seq: its outputs pair with eager ops one by one
    (by origin), so the inputs that count are all of the kernel's, whatever they pair with."""
    out: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        if r.kind == "op" and r.io == "input" and r.seq_my is not None \
                and (r.op or "").startswith(KERNEL_PREFIX):
            out[r.seq_my].append(r)
    return out


def _unknown_given(o: Row, ins: list[Row]) -> None:
    """A kernel output some of whose inputs have no golden value: how much deviation it was
    given is unknown, so amplification cannot clear or blame it (counting those inputs as
    exact made a backward kernel the culprit of a forward fault). At most a warning."""
    blind = [r for r in ins if r.verdict == V.UNMATCHED]
    o.amplification = None
    if o.accumulated_verdict in (V.WARNING, V.ERROR):
        o.verdict = V.WARNING
    else:
        o.verdict = V.PASS
    note = (f"{len(blind)} of its {len(ins)} inputs have no golden value: how much of its "
            "deviation it was given is unknown (a replay, `compare -r`, judges the kernel)")
    o.message = "; ".join([m for m in [o.message] if m] + [note])


def _received(o: Row) -> None:
    """A receive's output, without a replay: its inputs are the buffer it wrote into (not
    data), so its deviation is what the sending rank sent, judged there; on this rank at most
    a warning, when what arrived is an accumulated error (`compare -r` checks the transfer
    bit for bit against the send)."""
    o.amplification = None
    acc = o.accumulated_verdict
    o.verdict = V.WARNING if acc == V.ERROR else V.PASS
    if acc in (V.WARNING, V.ERROR):
        note = ("received: its deviation was made on the rank that sent it and is judged there"
                " (compare -r checks the transfer)")
        o.message = "; ".join([m for m in [o.message] if m] + [note])


def _judge_amplification(groups: list[tuple[list[Row], list[Row]]], sec: dict[str, Any],
                         pending: set[int], kernel_ins: dict[int, list[Row]]) -> None:
    """No local error: amplification of the deviation the op was given."""
    todo = []
    for ins, outs in groups:
        for o in outs:
            if is_receive(o.op):
                if o.index in pending:
                    _received(o)
                continue
            mine = kernel_ins.get(o.seq_my, ins) if o.seq_my is not None else ins
            if (o.op or "").startswith(KERNEL_PREFIX) and any(
                    r.verdict == V.UNMATCHED for r in mine):
                if o.index in pending:
                    _unknown_given(o, mine)
                continue
            dev_in = [d for d in (deviation(r) for r in mine) if d is not None]
            red_in = max(dev_in, default=0.0)
            d = deviation(o)
            if d is None:
                continue
            own = own_error(o.compute_precision, o.dtype_my)
            explained = (red_in + own) * (o.cancellation or 1.0)  # a sum cancelling: more
            o.amplification = d / explained if math.isfinite(d) else math.inf
            todo.append(o)
    z = _with_outlier_scores(todo, "amplification", sec["spread_floor"], pool=False)
    for o in todo:
        o.amplification_z = z.get(o.index)
    for o in todo:
        if o.index not in pending:
            continue
        a = o.amplification
        acc = o.accumulated_verdict
        if acc not in (V.WARNING, V.ERROR):
            o.verdict = V.PASS
            continue
        lv = level(a, o.amplification_z or 0.0, math.inf, sec, "amplification")
        capped = lv == V.ERROR and not amplification_is_evidence(o.op)
        # A tensor's statistics do not bound the deviation of its other elements: on them an
        # outlier below amplification_error is what honest kernels reach on mixed signs.
        outlier_of_stats = (lv == V.ERROR and o.rel_euc_dist is None
                            and a <= sec["amplification_error"])
        if lv == V.ERROR and (acc != V.ERROR or capped or outlier_of_stats):
            lv = V.WARNING
        o.verdict = lv
        note = (f"output deviation {a:.3g}x what its inputs' deviation and its own rounding "
                "explain")
        if lv == V.PASS:
            note += ": inherited, not judged an error here"
        elif capped and _base(o.op) in _VALUE_CONDITIONED:
            note += (" (it divides by values that deviate, which amplifies honestly: at most "
                     "a warning; compare -r judges its own error)")
        elif capped and _base(o.op) in _PART_OF_INPUT:
            note += (" (it takes part of its input, whose deviation the whole input's does not "
                     "bound: at most a warning; compare -r checks the copy)")
        elif outlier_of_stats and not capped:
            note += (" (on statistics only, which do not bound each element's deviation: at "
                     "most a warning below amplification_error; tensor dumps or compare -r "
                     "judge its own error)")
        o.message = "; ".join([m for m in [o.message] if m] + [note])


def _nonfinite_born(ins: list[Row], o: Row) -> bool:
    return bool(o.nan_mismatch or o.inf_mismatch) and not any(
        r.nan_mismatch or r.inf_mismatch for r in ins)


def _structural(r: Row) -> bool:
    """Element counts differ: nothing numeric to judge, the row stays an error."""
    a, b = r.shape_my, r.shape_golden
    return a is not None and b is not None and math.prod(a) != math.prod(b)


def judge(rows: list[Row], producers: dict[int, int | None],
          cfg: dict[str, Any], random_seqs: set[int] | frozenset[int] = frozenset()
          ) -> list[Row]:
    """Set `verdict` on every row in place; returns the outputs of random ops whose draws
    differ from golden's (not judged: draws.py).

    producers: input row index -> the row index holding the same tensor where it was first
    seen (an earlier op's output, or an input row), None when no recorded op produced it.
    random_seqs: my run's ops that draw random numbers (the dump's `rng` mark).
    Rows arrive with `accumulated_verdict` (threshold verdict against golden), and for op
    outputs with a replay `local_error_ratio`, `local_bound`, `reduction_length`.
    """
    sec = {**cfg["replay"], **cfg.get("amplification", {})}
    groups = _groups(rows)
    outs = [o for _, os_ in groups for o in os_ if o.verdict in _JUDGED
            and not _structural(o)]
    # a replayed output no golden value holds (api._judge_alone): its local error alone
    alone = [o for o in rows if o.verdict == V.UNMATCHED and o.kind == "op"
             and o.io == "output" and o.local_error_ratio is not None]
    _judge_local(outs + alone, sec)
    pending = {o.index for o in outs if o.local_verdict is None}
    _judge_amplification(groups, sec, pending, _kernel_inputs(rows))
    for ins, os_ in groups:
        for o in os_:
            if o.verdict not in _JUDGED or o.local_verdict is not None \
                    or _structural(o):
                continue
            acc = o.accumulated_verdict
            if _nonfinite_born(ins, o):
                o.verdict = V.ERROR
            elif o.rel_euc_dist is None and acc == V.ERROR and o.max_abs_err:
                # integers: wrong only if every input matched golden
                clean = all((r.max_abs_err or 0) == 0 and (r.rel_euc_dist or 0)
                            == 0 for r in ins)
                o.verdict = V.ERROR if clean else V.PASS
                if not clean:
                    o.message += "; inputs already differed: inherited"
    drawn = judge_random_ops(groups, random_seqs) + unmatched_draws(rows, random_seqs)
    cap_consumers(groups, drawn, producers)
    by_index = {r.index: r for r in rows}
    for r in rows:
        if r.kind != "op" or r.io != "input" or r.verdict not in _JUDGED \
                or _structural(r):
            continue
        src = producers.get(r.index)
        p = by_index.get(src) if src is not None else None
        if p is not None and p is not r:
            r.verdict = p.verdict if p.verdict in _JUDGED else V.PASS
            r.produced_by = p.my_address
            r.message = "; ".join([m for m in [r.message] if m]
                                     + [f"judged where produced: {p.my_address}"])
            continue
        acc = r.accumulated_verdict or V.PASS
        if r.phase != "forward":  # a gradient or optimizer state made outside the dump
            r.verdict = V.PASS
            if acc != V.PASS:
                r.message = "; ".join([m for m in [r.message] if m] + [
                    "made by no recorded op (autograd or optimizer internals): not judged"])
            continue
        r.verdict = V.WARNING if acc == V.ERROR else acc
        if acc != V.PASS:
            r.message = "; ".join([m for m in [r.message] if m] + [
                "not produced by a recorded op (model input, parameter or buffer): it already "
                "differs from golden"])
    _summarise_modules(rows)
    return drawn


def _summarise_modules(rows: list[Row]) -> None:
    ops = [r for r in rows if r.kind == "op" and r.io == "output"
           and r.seq_my is not None]
    ops.sort(key=lambda r: r.seq_my)
    pos: dict[int, int] = {}
    for i, r in enumerate(ops):
        pos.setdefault(r.seq_my, i)
    for m in rows:
        if m.kind != "module" or m.verdict not in _JUDGED or m.seq_my is None \
                or _structural(m):
            continue
        mod, phase = m.module or "", m.phase
        i = pos.get(m.seq_my)
        if i is None:  # its ops were not compared: the boundary alone, at most a warning
            m.verdict = V.WARNING if m.verdict == V.ERROR else m.verdict
            continue
        while i + 1 < len(ops) and ops[i + 1].seq_my == m.seq_my:
            i += 1
        worst, which, n, judged = V.PASS, None, 0, 0
        while i >= 0:
            r = ops[i]
            rmod = r.module or ""
            if r.phase != phase or not (rmod == mod or rmod.startswith(mod + ".")):
                break
            n += 1
            judged += r.verdict in _JUDGED
            if r.verdict in _JUDGED and r.verdict.rank > worst.rank:
                worst, which = r.verdict, r
            i -= 1
        if n and not judged:  # none of its ops compared (another optimizer's fused op): which
            m.verdict = V.SKIPPED  # values its boundary pairs is unknown, so no verdict
            m.message = "; ".join([x for x in [m.message] if x] + [
                f"not judged: none of the {n} op outputs inside was compared"])
            continue
        m.verdict = worst
        note = f"summary of {n} op outputs inside"
        if which is not None:
            note += f": worst {worst} at {which.my_address}"
        m.message = "; ".join([x for x in [m.message] if x] + [note])
