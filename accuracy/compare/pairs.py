"""Which tensors compare() pairs, and why: one `PairSpec` per tensor pair of two aligned
runs (op inputs and outputs, module outputs, a compiled run's kernel buffers), marked where
its memory is not data to judge (uninitialised, overwritten unread, a kernel workspace)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from accuracy.aten import (
    ALIAS_PREFIXES,
    OVERWRITE_PREFIXES,
    UNINITIALISED_PREFIXES,
    workspace_outputs,
)
from accuracy.compare.align import Mapping, Pair, align, module_ends
from accuracy.compare.compiled_align import Sides, compiled_pairs, has_kernels
from accuracy.compare.optimizer_align import OPTIMIZER, StateWrites, state_writes
from accuracy.dumpfile import Dump, OpRecord, TensorRecord
from accuracy.dumpfile.dtypes import decodable


@dataclass
class PairSpec(Sides):
    """A row before metrics: which two tensors, and why; `kind` "op" or "module:<path>"."""

    kind: str = "op"
    uninit: bool = False
    overwritten: bool = False  # the destination of zero_/fill_/copy_...: what it held is unused
    workspace: bool = False
    compiled: Any = None  # compiled_align.TensorPair: a kernel buffer's module, source, group
    by_state: str = ""  # paired by the optimizer state both runs wrote (optimizer_align.py)
    other_impl: bool = False  # one side only: an intermediate of another optimizer's kernels


def _tensor_specs(p: Pair, kind: str = "op", reason: str = "") -> Iterable[PairSpec]:
    for io in ("input", "output"):
        mine = {t.idx: t for t in (getattr(p.my, io + "s") if p.my else [])}
        theirs = {t.idx: t for t in (getattr(p.golden, io + "s") if p.golden else [])}
        for idx in sorted(set(mine) | set(theirs)):
            yield PairSpec(p.my, p.golden, io, idx, mine.get(idx), theirs.get(idx),
                           reason or p.reason, kind=kind)
    if p.my is None or p.golden is None:
        if not (p.my or p.golden).tensors:  # type: ignore[union-attr]
            yield PairSpec(p.my, p.golden, "output", 0, None, None, p.reason, kind=kind)


def _compiled_specs(my: Dump, golden: Dump, mapping: Mapping) -> list[PairSpec]:
    """A compiled run's kernel rows against an eager run (compare/compiled_align.py)."""
    return [PairSpec(tp.my_op, tp.golden_op, tp.io, tp.idx, tp.my, tp.golden, tp.reason,
                     compiled=tp)
            for tp in compiled_pairs(my.records, golden.records, mapping)]


def pair_specs(my: Dump, golden: Dump, mapping: Mapping) -> list[PairSpec]:
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
    out: list[PairSpec] = []
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
    out = pair_optimizer_states(out, my.records, golden.records)
    um, ug = uninitialised(my.records), uninitialised(golden.records)
    om, og = overwritten_inputs(my.records), overwritten_inputs(golden.records)
    for s in out:
        s.uninit = bool((s.my and s.my.row in um) or (s.golden and s.golden.row in ug))
        s.overwritten = bool((s.my and s.my.row in om) or (s.golden and s.golden.row in og))
    wm, wg = workspace_rows(my.records), workspace_rows(golden.records)
    for s in out:
        s.workspace = bool((s.my and _first(s.my) in wm) or (s.golden and _first(s.golden) in wg))
    return out


def pair_optimizer_states(specs: list[PairSpec], my: list[OpRecord], golden: list[OpRecord]
                          ) -> list[PairSpec]:
    """Optimizer-phase tensors the op alignment left one-sided, paired by the state they
    write (compare/optimizer_align.py); in a step where any pair was made this way, the
    rest of its one-sided tensors are marked `other_impl`."""
    wm, wg = state_writes(my), state_writes(golden)
    if not wm.key or not wg.key:
        return specs
    free: dict[tuple, int] = {}  # a golden write's key -> its golden-only spec
    for i, s in enumerate(specs):
        if s.kind == "op" and s.io == "output" and s.my is None and s.golden is not None:
            k = wg.key.get((s.golden_op.seq, s.idx))  # type: ignore[union-attr]
            if k is not None:
                free.setdefault(k, i)
    merged: set[int] = set()
    spans: set[tuple[int, int]] = set()  # (my span, golden span) with pairs made
    ops: list[tuple[OpRecord, OpRecord, str]] = []  # (my op, golden op, parameter) paired
    for s in specs:
        if s.kind != "op" or s.io != "output" or s.golden is not None or s.my is None:
            continue
        k = wm.key.get((s.my_op.seq, s.idx))  # type: ignore[union-attr]
        j = free.pop(k, None) if k is not None else None
        if j is None:
            continue
        g = specs[j]
        s.golden_op, s.golden, s.reason = g.golden_op, g.golden, ""
        s.by_state = wm.label(s.my_op.seq, s.idx)  # type: ignore[union-attr]
        merged.add(j)
        spans.add((k[0], wg.span[g.golden_op.seq]))  # type: ignore[index, union-attr]
        ops.append((s.my_op, s.golden_op, k[1]))  # type: ignore[arg-type]
    merged |= _pair_state_inputs(specs, ops, wm, wg)
    if not merged:
        return specs
    mine, theirs = {a for a, _ in spans}, {b for _, b in spans}
    out = [s for i, s in enumerate(specs) if i not in merged]
    for s in out:
        if (s.my is None) == (s.golden is None):
            continue
        if s.my_op is not None and s.golden_op is None:
            s.other_impl = s.my_op.phase == OPTIMIZER and wm.span.get(s.my_op.seq) in mine
        elif s.golden_op is not None and s.my_op is None:
            s.other_impl = (s.golden_op.phase == OPTIMIZER
                            and wg.span.get(s.golden_op.seq) in theirs)
    return out


def _pair_state_inputs(specs: list[PairSpec], ops: list[tuple[OpRecord, OpRecord, str]],
                       wm: StateWrites, wg: StateWrites) -> set[int]:
    """The inputs of two optimizer ops paired by a state they write: those of the same
    parameter and role read after as many writes of it (the gradient, the state before this
    update), in order, so that the pair's output is judged against what its inputs already
    carried. Returns the golden specs merged."""
    mine: dict[int, list[int]] = {}  # my seq -> its one-sided input specs
    theirs: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        if s.kind != "op" or s.io != "input":
            continue
        if s.golden is None and s.my is not None:
            mine.setdefault(s.my_op.seq, []).append(i)  # type: ignore[union-attr]
        elif s.my is None and s.golden is not None:
            theirs.setdefault(s.golden_op.seq, []).append(i)  # type: ignore[union-attr]
    merged: set[int] = set()
    for my_op, golden_op, name in ops:
        free: dict[tuple[str, str, int], list[int]] = {}
        for j in theirs.get(golden_op.seq, []):
            read = wg.read.get((golden_op.seq, specs[j].idx))
            if j not in merged and read is not None and read[0] == name:
                free.setdefault(read, []).append(j)
        for i in mine.get(my_op.seq, []):
            s = specs[i]
            read = wm.read.get((my_op.seq, s.idx))
            if s.golden is not None or read is None or not free.get(read):
                continue
            j = free[read].pop(0)
            s.golden_op, s.golden, s.reason = golden_op, specs[j].golden, ""
            s.by_state = f"paired by optimizer state: {read[1]} of {name} as read"
            merged.add(j)
    return merged


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


def tensor_key(t: TensorRecord) -> tuple:
    return t.bytes_key  # a view read through its strides (schema 6) differs from its bytes


def needs_data(s: PairSpec) -> bool:
    if s.my is None or s.golden is None or not (s.my.has_data and s.golden.has_data):
        return False
    if s.uninit or s.overwritten or s.workspace:
        return False
    if not (decodable(s.my.dtype) and decodable(s.golden.dtype)):
        return False
    return s.my.numel == s.golden.numel and s.my.numel > 0


def producers(specs: list[PairSpec]) -> dict[int, int | None]:
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

