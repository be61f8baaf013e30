"""`compare()`: align two dumps, score every tensor pair, judge, and build the Report."""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from accuracy.aten import (
    ALIAS_PREFIXES,
    MOVEMENT,
    OVERWRITE_PREFIXES,
    UNINITIALISED_PREFIXES,
    VIEW_PREFIXES,
    WORKSPACE_REASON,
    workspace_outputs,
)
from accuracy.compare import arguments
from accuracy.compare import verdict as V
from accuracy.compare.align import Mapping, Pair, align, load_mapping, module_ends
from accuracy.compare.checks import check_replay, incomplete, own_random, swapped
from accuracy.compare.compiled_align import Sides, compiled_pairs, has_kernels, is_kernel
from accuracy.compare.emulation import unemulated_note
from accuracy.compare.engine import BlobReader, compare_refs, worker_run
from accuracy.compare.judge import judge
from accuracy.compare.metrics import ALL_ALGORITHMS, resolve_algorithms, statistics_metrics
from accuracy.compare.numerics import (
    cancellation,
    emulated_bound,
    expected_ratio,
    input_rms,
    reduction_length,
)
from accuracy.compare.precision import ComputePrecision
from accuracy.compare.quant import judge_quant
from accuracy.compare.report import Report, analyse
from accuracy.compare.row import Row, Verdict
from accuracy.compare.writers import warm
from accuracy.dumpfile import Dump, OpRecord, TensorRecord, TensorRef, load_dump
from accuracy.dumpfile.compiled import blind_lines, recompile_lines
from accuracy.dumpfile.dtypes import decodable

log = logging.getLogger(__name__)

DumpLike = str | os.PathLike[str] | Dump
_STAT_KEYS = (("max", "max"), ("min", "min"), ("mean", "mean"), ("l2norm", "l2"))
BATCH_BYTES = 32 << 20  # work unit sent to a worker process


@dataclass
class _Spec(Sides):
    """A row before metrics: which two tensors, and why; `kind` "op" or "module:<path>"."""

    kind: str = "op"
    uninit: bool = False
    overwritten: bool = False  # the destination of zero_/fill_/copy_...: what it held is unused
    workspace: bool = False
    compiled: Any = None  # compiled_align.TensorPair: a kernel buffer's module, source, group


def _open(d: DumpLike | None, owned: list[Dump]) -> Dump | None:
    if d is None or isinstance(d, Dump):
        return d
    dump = load_dump(d)
    owned.append(dump)
    return dump


def _tensor_specs(p: Pair, kind: str = "op", reason: str = "") -> Iterable[_Spec]:
    for io in ("input", "output"):
        mine = {t.idx: t for t in (getattr(p.my, io + "s") if p.my else [])}
        theirs = {t.idx: t for t in (getattr(p.golden, io + "s") if p.golden else [])}
        for idx in sorted(set(mine) | set(theirs)):
            yield _Spec(p.my, p.golden, io, idx, mine.get(idx), theirs.get(idx),
                        reason or p.reason, kind=kind)
    if p.my is None or p.golden is None:
        if not (p.my or p.golden).tensors:  # type: ignore[union-attr]
            yield _Spec(p.my, p.golden, "output", 0, None, None, p.reason, kind=kind)


def _compiled_specs(my: Dump, golden: Dump, mapping: Mapping) -> list[_Spec]:
    """A compiled run's kernel rows against an eager run (compare/compiled_align.py)."""
    return [_Spec(tp.my_op, tp.golden_op, tp.io, tp.idx, tp.my, tp.golden, tp.reason,
                  compiled=tp)
            for tp in compiled_pairs(my.records, golden.records, mapping)]


def _apply_compiled(row: Row, s: _Spec) -> None:
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


def _specs(my: Dump, golden: Dump, mapping: Mapping) -> list[_Spec]:
    if has_kernels(my.records) and not has_kernels(golden.records):
        return _compiled_specs(my, golden, mapping)
    pairs = align(my.records, golden.records, mapping)
    ends_my, ends_g = module_ends(my.records, mapping), module_ends(golden.records)
    mod_at_my: dict[int, list] = {}
    mod_at_g: dict[int, list] = {}
    for k, e in ends_my.items():
        mod_at_my.setdefault(e.record.seq, []).append(k)
    for k, e in ends_g.items():
        if k not in ends_my:
            mod_at_g.setdefault(e.record.seq, []).append(k)
    out: list[_Spec] = []
    for p in pairs:
        out.extend(_tensor_specs(p))
        keys = (mod_at_my.get(p.my.seq, []) if p.my else []) + \
            (mod_at_g.get(p.golden.seq, []) if p.golden else [])
        for k in keys:
            em, eg = ends_my.get(k), ends_g.get(k)
            reason = "" if em and eg else (
                f"module {k[0]} ({k[1]} #{k[2]}) only in " + ("my" if em else "golden") + " run")
            mp = Pair(em.record if em else None, eg.record if eg else None, reason)
            for s in _tensor_specs(mp, "module", reason):
                if s.io == "output" and s.idx == 0:
                    s.my_op, s.golden_op = mp.my, mp.golden
                    s.kind = "module:" + k[0]
                    out.append(s)
    um, ug = uninitialised(my.records), uninitialised(golden.records)
    om, og = overwritten_inputs(my.records), overwritten_inputs(golden.records)
    for s in out:
        s.uninit = bool((s.my and s.my.row in um) or (s.golden and s.golden.row in ug))
        s.overwritten = bool((s.my and s.my.row in om) or (s.golden and s.golden.row in og))
    wm, wg = workspace_rows(my.records), workspace_rows(golden.records)
    for s in out:
        s.workspace = bool((s.my and _first(s.my) in wm) or (s.golden and _first(s.golden) in wg))
    return out


def _first(t: TensorRecord) -> int:
    return t.first if t.has_data else t.row


def workspace_rows(recs: list[OpRecord]) -> set[int]:
    """Rows of kernel workspaces (`aten.WORKSPACE_OUTPUTS`), and of every later use of the
    same bytes (a backward op's workspace input): scratch memory, never judged."""
    rows: set[int] = set()
    for r in recs:
        idx = workspace_outputs(r.op)
        if idx:
            rows.update(_first(t) for t in r.outputs if t.idx in idx)
    return rows


def uninitialised(recs: list[OpRecord], window: int = 16) -> set[int]:
    """Rows holding uninitialised memory: empty* outputs, seen through views/detach, up to the
    in-place op that first writes them (nn.Parameter init: empty -> detach -> ... -> normal_).

    An empty output is followed for at most `window` ops, so a buffer that is never written
    in place cannot hide later tensors of the same shape.
    """
    marked: set[int] = set()
    pending: dict[tuple, int] = {}  # (shape, dtype) -> position of the empty op
    for pos, r in enumerate(recs):
        io = r.extra.get("uninitialized_io")
        if isinstance(io, dict):  # the dumper followed the memory: views of it not filled yet
            for side, ts in (("input", r.inputs), ("output", r.outputs)):
                idx = set(io.get(side) or ())
                marked.update(t.row for t in ts if t.idx in idx)
        pending = {k: p for k, p in pending.items() if pos - p <= window}
        if r.op.startswith(UNINITIALISED_PREFIXES):
            for t in r.outputs[:1]:
                pending[(t.shape, t.dtype)] = pos
            marked.update(t.row for t in r.outputs)
            continue
        if not r.inputs or not pending:
            continue
        sig = (r.inputs[0].shape, r.inputs[0].dtype)
        if sig not in pending:
            continue
        if r.op.startswith(ALIAS_PREFIXES):
            marked.update(t.row for t in r.tensors)
        elif r.op.split(".")[1].endswith("_"):
            marked.add(r.inputs[0].row)
            del pending[sig]
    return marked


def overwritten_inputs(recs: list[OpRecord]) -> set[int]:
    """Rows of input 0 of ops that overwrite it without reading it (`zero_`, `fill_`,
    `copy_`, `normal_`...): whatever it held is not used, so it is never compared."""
    return {r.inputs[0].row for r in recs
            if r.inputs and r.op.rsplit(".", 1)[0] in OVERWRITE_PREFIXES}


def _key(t: TensorRecord) -> tuple:
    return (t.offset, t.nbytes, t.dtype)


def _needs_data(s: _Spec) -> bool:
    if s.my is None or s.golden is None or not (s.my.has_data and s.golden.has_data):
        return False
    if s.uninit or s.overwritten or s.workspace:
        return False
    if not (decodable(s.my.dtype) and decodable(s.golden.dtype)):
        return False
    return s.my.numel == s.golden.numel and s.my.numel > 0


# Runs the pair batches somewhere else (a Dask cluster: accuracy.compare.cluster.DaskRunner):
# gets the batches and the algorithms, yields each batch's metric dicts in batch order. A
# runner may also have `prepare(paths)`: called as compare() starts, with the two dumps' paths.
BatchRunner = Callable[[list[list[tuple[TensorRef, TensorRef]]], tuple[str, ...]],
                       Iterable[list[dict[str, Any]]]]


class _Results:
    """The pairs' metric dicts, taken from the batches as they finish, so the rows of the
    pairs already measured are built while the rest are still being computed (by a Dask
    cluster or `-j` processes; in this process every batch is computed when a row first
    needs one). Building the rows after the last batch was serial time a cluster cannot
    share."""

    def __init__(self, batches: Iterator[list[tuple[tuple, dict[str, Any]]]],
                 runner: Iterable[Any] | None = None) -> None:
        self._batches = batches
        self._runner = runner  # closed on abort: its pending tasks are cancelled
        self._done: dict[tuple, dict[str, Any]] = {}

    def get(self, key: tuple) -> dict[str, Any]:
        """The metrics of pair `key`, waiting for its batch if it is still running."""
        while key not in self._done:
            got = next(self._batches, None)
            if got is None:
                raise KeyError(f"no batch measured the pair {key}")
            self._done.update(got)
        return self._done[key]

    def close(self) -> None:
        """Take any batch no row asked for and end the run (its pool, progress bar)."""
        for got in self._batches:
            self._done.update(got)

    def abort(self) -> None:
        """End the run early (a row failed): its pool and progress bar are closed, and a
        runner's tasks not finished are cancelled, even when no batch was asked for yet."""
        for it in (self._batches, self._runner):
            close = getattr(it, "close", None)
            if close is not None:
                close()


def _run_metrics(specs: list[_Spec], dumps: dict[str, Dump], algs: tuple[str, ...], jobs: int,
                 progress: bool, runner: BatchRunner | None = None) -> tuple[_Results, int]:
    """The pairs' metrics (filled as their batches finish) and the bytes they cover."""
    todo: dict[tuple, tuple[TensorRef, TensorRef]] = {}
    for s in specs:
        if _needs_data(s):
            assert s.my is not None and s.golden is not None
            k = (_key(s.my), _key(s.golden))
            if k not in todo:
                todo[k] = (s.my.ref(), s.golden.ref())
    keys = list(todo)
    total = sum(m.nbytes + g.nbytes for m, g in todo.values())
    batches: list[list[tuple]] = [[]]
    size = 0
    for k in keys:
        if size > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(k)
        size += todo[k][0].nbytes + todo[k][1].nbytes
    # a runner is handed every batch now: its tasks run while the caller builds rows
    ran = runner([[todo[k] for k in b] for b in batches], algs) if runner and todo else None
    return _Results(_batch_results(todo, batches, dumps, algs, jobs, progress, ran,
                                   total), ran), total


def _batch_results(todo: dict[tuple, tuple[TensorRef, TensorRef]], batches: list[list[tuple]],
                   dumps: dict[str, Dump], algs: tuple[str, ...], jobs: int, progress: bool,
                   ran: Iterable[list[dict[str, Any]]] | None, total: int
                   ) -> Iterator[list[tuple[tuple, dict[str, Any]]]]:
    """Each batch's (pair key, metrics), as the batches finish (a runner's in batch order)."""
    if not todo:
        return
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="compare", leave=False)

    def done(b: list[tuple], res: list[dict[str, Any]]) -> list[tuple[tuple, dict[str, Any]]]:
        if bar:
            bar.update(sum(todo[k][0].nbytes + todo[k][1].nbytes for k in b))
        return list(zip(b, res, strict=True))

    with ExitStack() as stack:
        if bar:
            stack.callback(bar.close)
        if ran is not None:
            for b, res in zip(batches, ran, strict=True):
                yield done(b, res)
        elif jobs > 1 and len(batches) > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed  # 5 ms: here

            ex = stack.enter_context(ProcessPoolExecutor(max_workers=min(jobs, len(batches))))
            futs = {ex.submit(worker_run, [todo[k] for k in b], algs): b for b in batches}
            warm()  # the workers are forked by now: this process has time to spare
            for f in as_completed(futs):
                yield done(futs[f], f.result())
        else:  # here, all at once: nothing would run beside the rows
            from accuracy.compare.blas import single_threaded_blas

            reader = BlobReader(dumps)
            with single_threaded_blas():
                measured = [done(b, compare_refs(reader, [todo[k] for k in b], algs))
                            for b in batches]
            yield from measured


def _replay_index(replay: Dump | None) -> dict[int, dict[str, Any]]:
    if replay is None:
        return {}
    return {r.seq: r.extra["replay"] for r in replay.records
            if isinstance(r.extra.get("replay"), dict)}


def _first_reason(text: str) -> str:
    """A replay reason's first clause, without the prefixes every kernel's reason shares."""
    text = text.removeprefix("compiled kernel with no output to replay: ").split("; ")[0]
    text = re.sub(r"^output \d+ not replayed: ", "", text)
    return text[:100]


def _kernel_replay(my: Dump, replay: Dump | None,
                   rp: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """With a replay: how many compiled kernel launches of my run it judged (status ok: at
    least one output re-run and measured) and why the others were not, by reason. A kernel
    replay left unjudged gets no local verdict: the count is said, never a silent PASS."""
    if replay is None:
        return None
    kernels = [r for r in my.records if is_kernel(r)]
    if not kernels:
        return None
    why: dict[str, int] = {}
    judged = 0
    for r in kernels:
        got = rp.get(r.seq)
        if got is not None and got.get("status") == "ok":
            judged += 1
            continue
        reason = "not in the replay" if got is None else (
            f"{got.get('status')}: {_first_reason(str(got.get('reason') or ''))}")
        why[reason] = why.get(reason, 0) + 1
    return {"kernels": len(kernels), "judged": judged,
            "reasons": dict(sorted(why.items(), key=lambda kv: -kv[1])[:5])}


def _identity(i: int, s: _Spec) -> Row:
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


def _tensor_module(s: _Spec, op: OpRecord | None) -> str | None:
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


def _not_comparable(row: Row, s: _Spec, msgs: list[str]) -> bool:
    """Settle a row with nothing numeric to compare (one side missing, uninitialised memory,
    element counts differ, empty); False when the pair is to be judged on its values."""
    m, g = s.my, s.golden
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


def _add_cancellation(row: Row, s: _Spec, msgs: list[str]) -> None:
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


def _add_replay(row: Row, s: _Spec, rp: dict[str, Any], compute: str | None,
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


def _judge_alone(row: Row, s: _Spec, rp: dict[str, Any], precision: ComputePrecision) -> None:
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


def _row(i: int, s: _Spec, res: dict[str, Any] | None, cfg: dict[str, Any],
         replay: dict[int, dict[str, Any]], precision: ComputePrecision,
         inherit: str | None = None) -> Row:
    """One row before judging: identity, statistics, metrics, the threshold verdict against
    golden (`accumulated_verdict`) and, for a replayed op output, its local error."""
    row = _identity(i, s)
    _add_statistics(row, s.my, s.golden)
    msgs: list[str] = []
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


def _moved_from(s: _Spec, computed: dict[tuple, str]) -> str | None:
    """For the output of an op that only moves values (a view, `_unsafe_view`, `clone`...),
    the compute precision of the op that made its input: the same values are judged at the
    same precision (a bf16 GEMM's output was a warning, its view an fp32 error)."""
    op = s.my_op
    if s.kind != "op" or s.io != "output" or op is None or not op.inputs:
        return None
    if op.op not in MOVEMENT and not op.op.startswith(VIEW_PREFIXES):
        return None
    return computed.get(op.inputs[0].values_key)


def _producers(specs: list[_Spec]) -> dict[int, int | None]:
    """Input row index -> the row index where the same tensor was first seen (None: never
    before, so no recorded op produced it). Tensor dumps link a reused tensor to the row
    that first wrote its bytes; statistics dumps have no bytes, so an input is matched to
    the latest earlier op output with the same dtype, shape and statistics."""
    row_of: dict[int, int] = {}
    by_stats: dict[tuple, int] = {}
    out: dict[int, int | None] = {}
    for i, s in enumerate(specs):
        if s.kind != "op" or s.my is None:
            continue
        t = s.my
        sig = (t.dtype, tuple(t.shape), tuple(sorted(t.stats.items())))
        if s.io == "input":
            if t.first >= 0 and t.first != t.row:
                out[i] = row_of.get(t.first)
            else:  # statistics dump, or a copy of an earlier output (AccumulateGrad...)
                out[i] = by_stats.get(sig)
        row_of.setdefault(t.row, i)
        if s.io == "output":
            by_stats[sig] = i
    return out


def _arguments_differ(rows: list[Row], specs: list[_Spec]) -> None:
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


def compare(my: DumpLike, golden: DumpLike, replay: DumpLike | None = None, *,
            config: str | os.PathLike[str] | dict | None = None,
            algorithms: list[str] | tuple[str, ...] | str | None = None,
            mapping: str | os.PathLike[str] | dict | Mapping | None = None, jobs: int = 1,
            progress: bool = False, runner: BatchRunner | None = None) -> Report:
    """Align `my` with `golden`, compute metrics for every tensor pair, judge, find the culprit.

    my/golden/replay: dump paths or opened Dumps. Returns a Report (rows, summary).
    runner: where the pair batches run (default: here, or `jobs` processes); see BatchRunner.
    """
    t0 = time.perf_counter()
    cfg = V.load_config(config)
    algs = resolve_algorithms(algorithms)
    mp = load_mapping(mapping)
    owned: list[Dump] = []
    prepare = getattr(runner, "prepare", None)
    if prepare is not None:  # a cluster's workers open the dumps while this process aligns
        prepare([str(d.path if isinstance(d, Dump) else d) for d in (my, golden)])
    try:
        dm, dg = _open(my, owned), _open(golden, owned)
        dr = _open(replay, owned)
        assert dm is not None and dg is not None
        if dr is not None:
            check_replay(dm, dr)
        refusals = [m for m in (incomplete(dm, "my"), incomplete(dg, "golden"),
                                own_random(dm, "my"), own_random(dg, "golden"),
                                swapped(dm, dg)) if m]
        for m in refusals:  # the report carries them (summary refusals, the terminal's
            log.info("%s", m)  # WARNING lines): at warning level the CLI printed them twice
        blind = blind_lines(dm.attrs, "my") + blind_lines(dg.attrs, "golden")
        for m in blind:  # the report carries them first (summary, terminal, html)
            log.info("%s", m)
        specs = _specs(dm, dg, mp)
        dumps = {str(dm.path): dm, str(dg.path): dg}
        rp = _replay_index(dr)
        precision = ComputePrecision.from_sources(cfg, dm.attrs)
        results, nbytes = _run_metrics(specs, dumps, algs, max(1, int(jobs)), progress,
                                       runner)
        # what needs no metrics is done while a runner's first tasks run
        producers = _producers(specs)
        quant = {r.seq: r for r in dm.records if r.extra.get("quant")}
        recompiles = recompile_lines(dm.attrs, "my") + recompile_lines(dg.attrs, "golden")
        kernel_replay = _kernel_replay(dm, dr, rp)
        notes = [n for n in (unemulated_note(dm.attrs, (r.op for r in dm.records)),) if n]
        rows = []
        computed: dict[tuple, str] = {}  # tensor -> the compute precision that made it
        try:
            for i, s in enumerate(specs):
                res = results.get((_key(s.my), _key(s.golden))) if _needs_data(s) else None
                rows.append(_row(i, s, res, cfg, rp, precision, _moved_from(s, computed)))
                _apply_compiled(rows[-1], s)
                if rows[-1].compute_precision and s.io == "output" and s.my is not None:
                    computed[s.my.values_key] = rows[-1].compute_precision
            results.close()
        finally:
            results.abort()
        drawn = judge(rows, producers, cfg, {r.seq for r in dm.records if r.extra.get("rng")})
        judge_quant(rows, quant, cfg)
        _arguments_differ(rows, specs)
        seconds = time.perf_counter() - t0
        meta = {
            "my": str(dm.path), "golden": str(dg.path),
            "rank": dm.attrs.get("rank"), "world_size": dm.attrs.get("world_size"),
            "replay": str(dr.path) if dr is not None else None,
            "my_attrs": {k: dm.attrs.get(k) for k in ("backend", "profile", "mode",
                                                      "faults_applied", "complete")},
            "golden_attrs": {k: dg.attrs.get(k) for k in ("backend", "profile", "mode",
                                                          "complete")},
            "ops_my": len(dm.records), "ops_golden": len(dg.records),
            "algorithms": list(algs), "bytes_compared": nbytes, "seconds": seconds,
            "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None, "jobs": jobs,
            "refusals": refusals,
            "blind": blind,
            "recompiles": recompiles,
            "kernel_replay": kernel_replay,
            "notes": notes,
            "random_draws": drawn,
        }
        log.info("compared %d rows, %.1f MB in %.2f s", len(rows), nbytes / 1e6, seconds)
        return Report(rows, analyse(rows, cfg, meta))
    finally:
        for d in owned:
            d.close()
