"""Offline overflow scan: which ops in a dump gave birth to inf/nan and which only carried it.

Works on any dump: a full one (statistics or tensor mode), where every op's nan/inf counts are
walked in execution order, and a `check_overflow=True` one, which holds only the births and
GradScaler's ops. GradScaler's own checks are labelled, never culprits; births in a step that
GradScaler skipped are labelled "handled by loss scaling". A birth whose inf/nan later ops
read and dropped (T5's log(0), cast to integers and discarded by `where`) is *contained*: listed
apart, not a culprit (`accuracy.dumper.overflow_lineage` says when).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from accuracy.aten import (
    AMP_OPS,
    AMP_UPDATE_OP,
    FILL_VALUE_ARGS,
    FROM_COLLECTIVE,
    HANDLED,
    INTENDED,
    READS_NO_VALUES_PREFIXES,
    amp_label,
    intended_fill,
    is_collective,
    loss_scaled,
    shapes_mask,
)
from accuracy.dumpfile import Dump, load_dump, schema
from accuracy.dumpfile.reader import OpRecord, TensorRecord
from accuracy.errors import UsageError
from accuracy.records import CallSite, OverflowFinding

FILL_PREFIXES = tuple(FILL_VALUE_ARGS)


# One op of the scan's lists: the record the online check writes too.
Finding = OverflowFinding


@dataclass
class OverflowReport:
    """Births (inf/nan from finite inputs) separated from ops that inherited them."""

    path: str
    mode: str
    online: bool  # the dump came from check_overflow=True: only births were recorded
    ops_scanned: int  # ops judged: the records walked, or (online) the ops the check judged
    births: list[Finding] = field(default_factory=list)
    inherited: list[Finding] = field(default_factory=list)
    amp: list[Finding] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    intended: list[Finding] = field(default_factory=list)  # masks: -inf fills and their uses
    contained: list[Finding] = field(default_factory=list)  # births later ops dropped
    complete: bool = True  # the dumper closed it: every op of the run is in

    @property
    def culprits(self) -> list[Finding]:
        """Births that loss scaling did not absorb: the ones to look at first."""
        return [b for b in self.births if b.label != HANDLED]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (`accuracy overflow --json`): each finding flat."""
        d = asdict(self)
        for name in ("births", "inherited", "amp", "intended", "contained"):
            d[name] = [f.as_dict(kind=False) for f in getattr(self, name)]
        return d

    def format(self, limit: int = 20) -> str:
        """The text `accuracy overflow` prints."""
        verb = "checked" if self.online else "scanned"  # online: the dump holds only births
        lines = [f"{self.path}: {self.ops_scanned} ops {verb} ({self.mode} mode"
                 + (", recorded by check_overflow" if self.online else "") + ")"]
        if not self.complete:
            lines.append("INCOMPLETE: the run stopped before the dumper closed (an exception, "
                         "Ctrl-C, a kill or a full disk): only the ops it kept were scanned; "
                         "an inf/nan born after them is not seen (`accuracy info` says what "
                         "it kept)")
        if not self.births:
            lines.append("no op produced inf/nan from finite inputs")
        else:
            lines.append(f"born here ({len(self.births)}; {len(self.culprits)} not handled by "
                         "loss scaling):")
            for b in self.births[:limit]:
                lines.append("  " + b.line())
                c = b.confirmation
                if c:
                    lines.append(f"          confirmation on {c.get('device')}: {c['verdict']}")
        if self.inherited:
            lines.append(f"inherited ({len(self.inherited)} ops carried non-finite inputs "
                         "onward), first ones:")
            lines += ["  " + f.line() for f in self.inherited[: min(limit, 10)]]
        if self.contained:
            lines.append(f"dropped by later ops ({len(self.contained)} births whose inf/nan "
                         "every later reader turned into finite or integer values), not "
                         "overflows:")
            lines += ["  " + f.line() for f in self.contained[: min(limit, 5)]]
        if self.intended:
            lines.append(f"intended non-finite values ({len(self.intended)} ops: attention "
                         "masks' -inf / finfo.min fills and their propagation), not overflows")
        if self.amp:
            lines.append(f"GradScaler checks ({len(self.amp)}, deliberate, not culprits)")
        if self.skipped_steps:
            lines.append(f"steps skipped by GradScaler: {self.skipped_steps}")
        return "\n".join(lines)


def _bad(t: TensorRecord) -> bool:
    s = t.stats
    return (s.get("nan_count") or 0) > 0 or (s.get("inf_count") or 0) > 0


def _outputs(r: OpRecord) -> list[dict[str, Any]]:
    return [{"idx": t.idx, "dtype": t.dtype, "shape": list(t.shape),
             "nan": int(t.stats.get("nan_count", 0)), "inf": int(t.stats.get("inf_count", 0))}
            for t in r.outputs if _bad(t)]


def _finding(r: OpRecord, label: str = "") -> Finding:
    return OverflowFinding(CallSite(r.seq, r.op, r.phase, r.module, r.source, r.step),
                           _outputs(r), label=label)


def _found_inf(r: OpRecord) -> bool:
    """Whether GradScaler's update saw found_inf > 0 (input 2 of _amp_update_scale_).

    found_inf is written by the unscale op without a `_version` bump, so a full dump may show
    its stale value; `scan_dump` also reads the unscale op's own (pre-op) gradient inputs.
    """
    if schema.EXTRA_STEP_SKIPPED in r.extra:
        return bool(r.extra[schema.EXTRA_STEP_SKIPPED])
    fi = [t for t in r.inputs if t.idx == 2]
    return bool(fi) and (fi[0].stats.get("max") or 0) > 0


def _mask_values(r: OpRecord) -> bool:
    """No NaN and no +inf among the non-finite outputs: what a -inf mask combined with finite
    values gives (an overflow of the values themselves shows +inf or NaN)."""
    for t in r.outputs:
        if (t.stats.get("nan_count") or 0) > 0:
            return False
        top = t.stats.get("max")
        if top is not None and top == float("inf"):
            return False
    return True


class _Masks:
    """Tensors holding intended values (masks), followed through the dump in order.

    Matched by `values_key`, as `_Lineage` does: a tensor dump links a later use to the row
    that holds the bytes, but a statistics dump gives every use its own row (`first` is -1),
    so only the dtype and statistics tell that a later input is the mask."""

    def __init__(self) -> None:
        self.keys: set[tuple] = set()

    def intended(self, r: OpRecord) -> bool:
        """Whether `r`'s outputs are intended mask values (marks them if so)."""
        fed = any(t.values_key in self.keys for t in r.inputs)
        if self._fill(r) or (fed and shapes_mask(r.op)) or (
                fed and any(_bad(t) for t in r.outputs) and _mask_values(r)):
            self.keys.update(t.values_key for t in r.outputs)
            return True
        return False

    @staticmethod
    def _fill(r: OpRecord) -> bool:
        if not r.op.startswith(FILL_PREFIXES):  # decode arguments only for fill ops
            return False
        try:
            args, kwargs = r.call([None] * len(r.inputs))
        except (ValueError, TypeError, KeyError, IndexError):
            return False
        return intended_fill(r.op, args, kwargs, r.outputs[0].dtype if r.outputs else None)


def _ops_judged(d: Dump, online: bool) -> int:
    """How many ops the verdict covers: a check_overflow dump records only the births (often
    none), so its root summary's `ops_checked` counts, else the records walked."""
    checked = (d.attrs.get(schema.ROOT_OVERFLOW) or {}).get("ops_checked") if online else None
    return checked if isinstance(checked, int) and checked >= 0 else len(d.records)


def scan_dump(d: Dump) -> OverflowReport:
    """Scan an opened dump; a replay is refused (UsageError)."""
    src = d.attrs.get(schema.ROOT_REPLAYED_FROM)
    if src:  # the reference's figures of another dump's ops: its births would not show
        raise UsageError(f"{d.path} is a replay of {src} (written by `accuracy replay`), not a "
                         f"dump of a run: scan the dump itself (`accuracy overflow {src}`; "
                         "--confirm-on cpu replays its births)")
    online = bool(d.attrs.get(schema.ROOT_CHECK_OVERFLOW))
    rep = OverflowReport(str(d.path), str(d.attrs.get(schema.ROOT_MODE, "?")), online,
                         _ops_judged(d, online),
                         complete=bool(d.attrs.get(schema.ROOT_COMPLETE)) and d.closed_cleanly)
    window: list[tuple[Finding, set[tuple]]] = []  # births, with their inputs' identities
    masks = _Masks()
    lineages: list[_Lineage] = []  # offline: where each birth's values went
    grads_bad = False  # an unscale check in this window saw non-finite gradients
    for r in d.records:
        if r.op in AMP_OPS:
            rep.amp.append(_finding(r, amp_label(r.op)))
            grads_bad = grads_bad or (r.op != AMP_UPDATE_OP and any(_bad(t) for t in r.inputs))
            if r.op == AMP_UPDATE_OP:
                if _found_inf(r) or grads_bad:
                    rep.skipped_steps.append(r.step)
                    scale = r.inputs[0].values_key if r.inputs else None
                    for f, ids in window:
                        if loss_scaled(f.phase, scale in ids):
                            f.label = HANDLED
                window, grads_bad = [], False
            continue
        if r.extra.get(schema.EXTRA_UNINITIALIZED):
            continue
        if masks.intended(r):
            if any(_bad(t) for t in r.outputs):
                rep.intended.append(_finding(r, INTENDED))
            continue
        carried_by = [lin for lin in lineages if lin.follow(r)]
        if not any(_bad(t) for t in r.outputs):
            continue
        f = _finding(r)
        ovf = r.extra.get(schema.EXTRA_OVERFLOW)
        ovf = ovf if isinstance(ovf, dict) else {}  # a crafted file's extra can be anything
        born = ovf.get("born") if online else not any(_bad(t) for t in r.inputs)
        if online and ovf.get("contained"):
            f.label = str(ovf["contained"])
            rep.contained.append(f)
        elif born:
            f.label = FROM_COLLECTIVE if is_collective(r.op) else ""
            rep.births.append(f)
            window.append((f, {t.values_key for t in r.inputs}))
            if not online:
                lineages.append(_Lineage(f, {t.values_key for t in r.outputs if _bad(t)}))
        else:
            rep.inherited.append(f)
            for lin in carried_by:
                lin.inherited.append(f)
    for lin in lineages:
        if lin.contained():
            lin.birth.label = f"contained: {lin.absorbed_by} dropped it"
            rep.births.remove(lin.birth)
            rep.contained.append(lin.birth)
            rep.inherited = [f for f in rep.inherited if all(f is not g for g in lin.inherited)]
    if online:  # labels given online (after the op was written) live in the root summary
        labels = {e["seq"]: e.get("label", "") for e in
                  (d.attrs.get(schema.ROOT_OVERFLOW) or {}).get("events", [])}
        for b in rep.births:
            b.label = labels[b.seq] if b.seq in labels else b.label
    return rep


@dataclass
class _Lineage:
    """Offline, the tensors (by `values_key`) that carry one birth's non-finite values, as
    `overflow_lineage` follows them online. Without liveness, a carrier no later op read
    counts as one that lasted; a statistics dump tells tensors apart by their statistics."""

    birth: Finding
    keys: set[tuple]
    read: set[tuple] = field(default_factory=set)
    absorbed_by: str = ""
    escaped: bool = False
    inherited: list[Finding] = field(default_factory=list)

    def follow(self, r: OpRecord) -> bool:
        """Pass the lineage through `r`; whether `r` carried it on."""
        if r.op.startswith(READS_NO_VALUES_PREFIXES):
            return False
        read = {t.values_key for t in r.inputs} & self.keys
        if not read:
            return False
        self.read |= read
        carried = {t.values_key for t in r.outputs if _bad(t)}
        self.keys |= carried
        if not r.outputs:
            self.escaped = True
        elif not carried:
            self.absorbed_by = self.absorbed_by or f"op {r.seq} {r.op}"
        return bool(carried)

    def contained(self) -> bool:
        return bool(self.absorbed_by) and not self.escaped and self.read >= self.keys


def scan(dump: str | os.PathLike[str] | Dump, confirm_on: str | None = None) -> OverflowReport:
    """Births and inherited non-finite ops of a dump; with `confirm_on`, replay each birth there."""
    if confirm_on:  # an unknown device is refused before the scan, not after (UsageError)
        from accuracy.device_backend import get_backend

        get_backend(confirm_on)
    if isinstance(dump, Dump):
        rep = scan_dump(dump)
        if confirm_on:
            from accuracy.overflow.confirm import confirm_births
            confirm_births(dump, rep, confirm_on)
        return rep
    with load_dump(dump) as d:
        return scan(d, confirm_on)
