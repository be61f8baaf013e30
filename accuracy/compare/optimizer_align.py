"""Pairing two optimizer phases by the states they write, whatever their implementation.

Every accelerator runs `torch.optim.AdamW` as `_foreach_*` (or `_fused_adamw_`) calls, one per
step of the math over every parameter at once; CPU runs it parameter by parameter (`lerp_`,
`addcmul_`, `addcdiv_`). Aligned as op streams, the two have no op in common and the whole
optimizer phase goes unjudged. What both compute is the same set of states: each parameter,
its `exp_avg`, its `exp_avg_sq`, its step count. The dumper names each write of one
(`extra["optimizer_states"]`: dumper/optimizer_names.py); here the k-th write of a state
counted from the step's end pairs with the other run's k-th from the end, so the final value
of every state always pairs. The intermediates of either implementation (`_foreach_sqrt`'s
list, the per-tensor `denom`) have no counterpart by construction: they lead to the states,
which are judged, and are skipped, not counted against the phase. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accuracy.dumpfile import OpRecord

OPTIMIZER = "optimizer"
OTHER_IMPLEMENTATION = (
    "an intermediate or an input of another optimizer implementation (foreach/fused against "
    "per tensor): no counterpart by construction; the states it leads to (each parameter and "
    "its optimizer states) are paired and judged")


@dataclass
class StateWrites:
    """One run's optimizer writes: (seq, output index) -> (optimizer span, parameter, role,
    write counted from the span's end); and each optimizer op's span (one per step() run)."""

    key: dict[tuple[int, int], tuple[int, str, str, int]] = field(default_factory=dict)
    span: dict[int, int] = field(default_factory=dict)
    # (seq, input index) -> (parameter, role, how many writes of it came before in the span)
    read: dict[tuple[int, int], tuple[str, str, int]] = field(default_factory=dict)

    def label(self, seq: int, idx: int) -> str:
        _, name, role, back = self.key[(seq, idx)]
        which = "its last write" if back == 0 else f"write {back} before its last"
        return f"paired by optimizer state: {role} of {name}, {which}"


def _entry(states: object, idx: int) -> tuple[str, str] | None:
    if not isinstance(states, list) or not 0 <= idx < len(states):
        return None
    e = states[idx]
    if isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) and x for x in e):
        return e[0], e[1]
    return None


def _lists(r: OpRecord) -> tuple[object, object]:
    states = r.extra.get("optimizer_states")
    if not isinstance(states, dict):
        return None, None
    return states.get("input"), states.get("output")


def state_writes(recs: list[OpRecord]) -> StateWrites:
    """Every optimizer-phase write of a named state, keyed for pairing across runs."""
    out = StateWrites()
    writes: dict[tuple[int, str, str], list[tuple[int, int]]] = {}
    span, prev = -1, None
    for r in recs:
        if r.phase == OPTIMIZER and prev != OPTIMIZER:
            span += 1
        prev = r.phase
        if r.phase != OPTIMIZER:
            continue
        out.span[r.seq] = span
        ins, outs = _lists(r)
        if outs is None:
            continue
        for t in r.inputs:
            e = _entry(ins, t.idx)
            if e is not None:
                out.read[(r.seq, t.idx)] = (*e, len(writes.get((span, *e), ())))
        for t in r.outputs:
            e = _entry(outs, t.idx)
            if e is not None:
                writes.setdefault((span, *e), []).append((r.seq, t.idx))
    for (sp, name, role), ws in writes.items():
        for k, w in enumerate(ws):
            out.key[w] = (sp, name, role, len(ws) - 1 - k)
    return out
