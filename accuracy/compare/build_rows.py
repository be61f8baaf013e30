"""One report row per tensor pair: which tensors (identity), their statistics and metrics,
the threshold verdict against golden, and for a replayed op output its local error; then the
passes over all rows that need the specs (arguments that differ)."""

from __future__ import annotations

import math
from typing import Any

from accuracy.aten import MOVEMENT, VIEW_PREFIXES, WORKSPACE_REASON
from accuracy.compare import arguments
from accuracy.compare import verdict as V
from accuracy.compare.compiled_align import is_kernel
from accuracy.compare.metrics import ALL_ALGORITHMS, statistics_metrics
from accuracy.compare.numerics import (
    cancellation,
    emulated_bound,
    expected_ratio,
    input_rms,
    reduction_length,
)
from accuracy.compare.optimizer_align import OTHER_IMPLEMENTATION
from accuracy.compare.pairs import PairSpec
from accuracy.compare.precision import ComputePrecision
from accuracy.compare.row import Row, Verdict
from accuracy.dumpfile import OpRecord, TensorRecord

_STAT_KEYS = (("max", "max"), ("min", "min"), ("mean", "mean"), ("l2norm", "l2"))


def apply_compiled(row: Row, s: PairSpec) -> None:
    """A kernel row names its buffer's own module and source, and groups with its kernel."""
    tp = s.compiled
    if tp is None or tp.my_op is None:
        return
    if tp.module:
        row.module = tp.module
    if tp.source:
        row.source = tp.source
    if tp.group is not None and (tp.io == "input" or is_kernel(tp.my_op)):
        row.seq_golden = tp.group
    if tp.note:
        row.message = "; ".join([m for m in [tp.note, row.message] if m])


def _identity(i: int, s: PairSpec) -> Row:
    """The row's which-tensors part: addresses, op, place in the run, dtypes and shapes."""
    m, g = s.my, s.golden
    ref_op = s.my_op or s.golden_op
    return Row(
        index=i, kind="op" if s.kind == "op" else "module",
        my_address=m.address if m else None, golden_address=g.address if g else None,
        op=ref_op.op if ref_op else None, op_golden=s.golden_op.op if s.golden_op else None,
        seq_my=s.my_op.seq if s.my_op else None,
        seq_golden=s.golden_op.seq if s.golden_op else None,
        io=s.io, tensor_index=s.idx, phase=ref_op.phase if ref_op else None,
        module=s.kind.removeprefix("module:") if s.kind != "op" else _tensor_module(s, ref_op),
        source=ref_op.source if ref_op else None,
        dtype_my=m.dtype if m else None, dtype_golden=g.dtype if g else None,
        shape_my=list(m.shape) if m else None, shape_golden=list(g.shape) if g else None)


def _tensor_module(s: PairSpec, op: OpRecord | None) -> str | None:
    """The op's module, or for one tensor of a fused/foreach optimizer call, the parameter
    it belongs to (the dumper's `tensor_names`): one row per parameter, named by it."""
    if op is None:
        return None
    names = op.extra.get("tensor_names")
    if isinstance(names, dict):
        per_io = names.get(s.io)
        if isinstance(per_io, list) and 0 <= s.idx < len(per_io) and per_io[s.idx]:
            return str(per_io[s.idx])
    return op.module


def _add_statistics(row: Row, m: TensorRecord | None, g: TensorRecord | None) -> None:
    """Each side's recorded statistics, and their differences when both sides exist."""
    for side, t in (("my", m), ("golden", g)):
        if t is None:
            continue
        st = t.stats
        for name, k in _STAT_KEYS:
            setattr(row, f"{side}_{name}", st.get(k))
        setattr(row, f"{side}_nan_count", st.get("nan_count"))
        setattr(row, f"{side}_inf_count", st.get("inf_count"))
    if m is not None and g is not None:
        sm = statistics_metrics(m.stats, g.stats)
        for name, k in _STAT_KEYS:
            setattr(row, f"{name}_diff", sm.get(f"{k}_diff"))
            setattr(row, f"{name}_rel_diff", sm.get(f"{k}_rel_diff"))


def _not_comparable(row: Row, s: PairSpec, msgs: list[str]) -> bool:
    """Settle a row with nothing numeric to compare (one side missing, uninitialised memory,
    element counts differ, empty); False when the pair is to be judged on its values."""
    m, g = s.my, s.golden
    if (m is None or g is None) and s.other_impl:
        row.verdict = V.SKIPPED
        row.message = OTHER_IMPLEMENTATION
        return True
    if m is None or g is None:
        row.verdict = V.UNMATCHED
        row.message = s.reason or (f"{s.io} {s.idx} only in "
                                   + ("golden" if m is None else "my") + " run")
        return True
    if m.dtype != g.dtype:
        msgs.append(f"dtype differs ({m.dtype} vs {g.dtype})")
    if s.uninit:
        row.verdict = V.SKIPPED
        row.message = ("uninitialised memory (empty* or a view of it, before an op or a "
                       "collective fills it): not compared")
        return True
    if s.overwritten:
        row.verdict = V.SKIPPED
        row.message = ("overwritten by this op without being read (the destination of "
                       "zero_/fill_/copy_...): what it held is not used, not compared")
        return True
    if s.workspace:
        row.verdict = V.SKIPPED
        row.message = WORKSPACE_REASON
        return True
    if m.numel != g.numel:
        # Not the same computation (another batch, or ops paired across a fused/inserted
        # block): nothing to judge a kernel by, so the pair counts as unmatched.
        row.verdict = row.accumulated_verdict = V.UNMATCHED
        row.message = "; ".join(msgs + [f"shape differs ({list(m.shape)} vs {list(g.shape)}): "
                                        "element counts differ, not compared"])
        return True
    if m.shape != g.shape:
        msgs.append(f"shape differs ({list(m.shape)} vs {list(g.shape)}), compared flattened")
    if m.numel == 0:
        row.message = "; ".join(msgs + ["empty tensor: nothing to compare"])
        row.accumulated_verdict = V.PASS
        return True
    return False


def _add_metrics(row: Row, res: dict[str, Any]) -> None:
    """The computed metrics of the pair (a user metric has no column: it is not kept)."""
    for k, v in res.items():
        if k in _METRIC_FIELDS:
            setattr(row, k, v)


_METRIC_FIELDS = frozenset(ALL_ALGORITHMS) | {"nan_mismatch", "inf_mismatch", "bit_exact"}


CANCELLATION_NOTED = 10.0  # terms this many times their sum: the row says so


def _add_cancellation(row: Row, s: PairSpec, msgs: list[str]) -> None:
    """How much a sum-like output's terms cancel, from the golden run's statistics (the
    reference's values say how conditioned the sum is), else mine."""
    for op in (s.golden_op, s.my_op):
        if op is not None:
            c = cancellation(op, s.idx)
            if c is not None:
                row.cancellation = c
                if c >= CANCELLATION_NOTED:
                    msgs.append(f"its terms are up to {c:.3g}x their sum (they cancel): every "
                                "honest error of it is that much larger against the sum")
                return


def _add_replay(row: Row, s: PairSpec, rp: dict[str, Any], compute: str | None,
                msgs: list[str]) -> None:
    """The replay's local error of an op output: its ratio and an honest kernel's bound."""
    assert s.my is not None and s.my_op is not None
    row.replay_status = rp.get("status")
    if rp.get("status") == "ok":
        out = next((o for o in rp.get("outputs", []) if o.get("idx") == s.idx), None)
        blind = _blind_reference(s.my_op, out) if out is not None else None
        if blind is not None:
            assert out is not None
            ratio = out.get("error_ratio")
            msgs.append(f"not judged by replay: {blind}"
                        + (f" (its ratio {ratio:.3g} only reported)"
                           if isinstance(ratio, int | float) else ""))
        elif out is not None:
            row.local_error_ratio = out.get("error_ratio")
            row.local_error = out.get("err_device")
            k = reduction_length(s.my_op, s.idx)
            row.reduction_length = k
            if rp.get("emulated") == "quant":  # references ran on the fp8/MX operands
                compute = None
                msgs.append("replayed on its honestly re-quantised fp8/MX operands")
            row.local_bound = expected_ratio(compute, s.my.dtype, k, input_rms(s.my_op),
                                             out.get("err_reference"))
            emu = out.get("err_emulated")
            if compute and isinstance(emu, int | float) and math.isfinite(emu):
                row.emulated_error = float(emu)
                row.emulated_excess = float(emu) / (emulated_bound(s.my.dtype, k)
                                                    * (row.cancellation or 1.0))
    elif rp.get("reason"):
        msgs.append(f"replay {rp.get('status')}: {rp.get('reason')}")


def _blind_reference(op: OpRecord, out: dict[str, Any]) -> str | None:
    """Why a compiled kernel's replayed output cannot be judged by its local error, or None.

    Replay re-runs a kernel as the graph Inductor was *given* (before its post-grad passes);
    an output whose node a pass created, or whose ops fell back to the graph after the
    passes, was re-run with what the pass did: a pass that changed values looks honest there.
    Such an output keeps the judgment it has without a replay."""
    if not is_kernel(op):
        return None
    ref = out.get("reference")
    if ref == "given":
        return None
    if not isinstance(ref, str):
        return ("the replay does not say which graph it re-ran the kernel as (replayed by an "
                "older version): run `accuracy replay` again")
    why = ref.removeprefix("passed (").removesuffix(")") if ref.startswith("passed (") else ref
    return (f"replay re-ran it as the graph after Inductor's passes ({why}), which holds "
            "what a pass changed")


def _judge_alone(row: Row, s: PairSpec, rp: dict[str, Any], precision: ComputePrecision
                 ) -> None:
    """A kernel output no eager value holds, replayed: its local error needs no golden value,
    so it is judged by that (judge.py), not left unmatched."""
    assert s.my is not None and s.my_op is not None
    compute = precision.coarser(s.my_op.op, s.my.dtype)
    msgs: list[str] = []
    _add_replay(row, s, rp, compute, msgs)
    if row.local_error_ratio is not None:
        row.compute_precision = compute
        msgs.append("judged by its local error alone (replay)")
    row.message = "; ".join([m for m in [row.message] if m] + msgs)


def build_row(i: int, s: PairSpec, res: dict[str, Any] | None, cfg: dict[str, Any],
              replay: dict[int, dict[str, Any]], precision: ComputePrecision,
              inherit: str | None = None) -> Row:
    """One row before judging: identity, statistics, metrics, the threshold verdict against
    golden (`accumulated_verdict`) and, for a replayed op output, its local error."""
    row = _identity(i, s)
    _add_statistics(row, s.my, s.golden)
    msgs: list[str] = [s.by_state] if s.by_state else []
    if _not_comparable(row, s, msgs):
        if row.verdict == V.UNMATCHED and s.my is not None and s.io == "output" \
                and s.my_op is not None and is_kernel(s.my_op) and s.my_op.seq in replay:
            _judge_alone(row, s, replay[s.my_op.seq], precision)
        return row
    assert s.my is not None
    compute = None
    if s.kind == "op" and s.io == "output" and s.my_op is not None:
        compute = precision.coarser(s.my_op.op, s.my.dtype) or inherit
        row.compute_precision = compute
    if res is None:
        verdict, msg = V.stats_verdict(row, cfg)
    else:
        _add_metrics(row, res)
        verdict, msg = V.metric_verdict(
            row, cfg, ComputePrecision.section(compute) if compute else None)
    if compute:
        msgs.append(f"judged at its compute precision {compute}")
    if res is not None and res.get("mask_values"):
        msgs.append(f"{res['mask_values']} mask values (at half the format's limit or beyond "
                    "on both sides) left out of the figures")
    row.accumulated_verdict = verdict
    if msg:
        msgs.append(msg)
    if s.kind == "op" and s.io == "output":
        _add_cancellation(row, s, msgs)
    rp = replay.get(s.my_op.seq) if (s.io == "output" and s.kind == "op" and s.my_op) else None
    if rp is not None:
        _add_replay(row, s, rp, compute, msgs)
    row.verdict = verdict
    row.message = "; ".join(msgs)
    return row


def moved_from(s: PairSpec, computed: dict[tuple, str]) -> str | None:
    """For the output of an op that only moves values (a view, `_unsafe_view`, `clone`...),
    the compute precision of the op that made its input: the same values are judged at the
    same precision (a bf16 GEMM's output was a warning, its view an fp32 error)."""
    op = s.my_op
    if s.kind != "op" or s.io != "output" or op is None or not op.inputs:
        return None
    if op.op not in MOVEMENT and not op.op.startswith(VIEW_PREFIXES):
        return None
    return computed.get(op.inputs[0].values_key)


def arguments_differ(rows: list[Row], specs: list[PairSpec]) -> None:
    """An op output that diverges while its call's scalar arguments differ from golden's is
    judged at its accumulated verdict, never PASS (its replay, run with the device's own
    arguments, cannot see it), and says which arguments and both values."""
    checked: dict[tuple[int, int], list[str]] = {}
    for row, s in zip(rows, specs, strict=True):
        if s.kind != "op" or s.io != "output" or s.my_op is None or s.golden_op is None:
            continue
        key = (s.my_op.seq, s.golden_op.seq)
        diffs = checked.get(key)
        if diffs is None:
            diffs = checked[key] = arguments.differences(s.my_op, s.golden_op)
        acc = row.accumulated_verdict
        if not diffs or acc not in (V.WARNING, V.ERROR):
            continue
        if Verdict.rank_of(acc) > Verdict.rank_of(row.verdict):
            row.verdict = Verdict(acc)
        row.message = "; ".join([m for m in [row.message] if m] + [arguments.message(diffs)])

