"""Online overflow checking inside `dumper(check_overflow=True)`: find where inf/nan is born.

An observer of the loop (accuracy/dumper/loop.py) that writes through the recorder. A compiled
kernel's launch (a `KernelCall`) is judged as an op is: its inputs' states from the cache
(Inductor hands buffers over as fresh views, which the cache does not hold, so they are
probed), its outputs probed.

Each tensor's state (finite, saturated, non-finite) comes from one reduction (`probe`) and is
cached by tensor identity and `_version`, so an op's inputs are usually already known when it
runs. An op is a birth when all its inputs were finite and an output is not; only births (and
GradScaler's own ops, labelled) are written to the dump. A birth of inf/nan is held until later
ops show whether its values lasted or were dropped (`overflow_lineage`: T5's log(0)); with
`overflow_raise` it is judged at once. On CPU, or when raising was asked for,
each op is judged at once; on other devices the probes wait on the device and are read in one
batch every `interval` ops, so training never syncs per op.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from accuracy.aten import (
    AMP_UPDATE_OP,
    FROM_COLLECTIVE,
    HANDLED,
    READS_NO_VALUES_PREFIXES,
    amp_label,
    intended_fill,
    is_collective,
    loss_scaled,
    shapes_mask,
    written_ids,
)
from accuracy.dumper.finite_probe import (
    FINITE,
    NONFINITE,
    Saturation,
    checkable,
    counts,
    exact_state,
    plain,
    probe,
    state,
)
from accuracy.dumper.identity import TensorStates, same_elements
from accuracy.dumper.overflow_lineage import CONFIRM, Lineage, version_of
from accuracy.dumper.source import user_source
from accuracy.dumpfile import schema
from accuracy.errors import RaisedForTheUser
from accuracy.records import OverflowFinding

if TYPE_CHECKING:
    from accuracy.dumper.calls import Call
    from accuracy.dumper.recorder import Recorder

log = logging.getLogger(__name__)

# A held birth whose values are still alive this many ops after one was last made or read
# lasted: an overflow (a real one's inf is read op after op until it reaches the loss).
LINEAGE_WINDOW = 64


class OverflowDetected(RaisedForTheUser, RuntimeError):  # noqa: N818 - reads as what happened
    """Raised at the first overflow when `overflow_raise=True`; the traceback is the user's."""

    def __init__(self, message: str, event: OverflowFinding) -> None:
        super().__init__(message)
        self.event = event


class OverflowWarning(RuntimeWarning):
    """Shown once per overflow birth, so it is seen even without logging configured."""


# One op where non-finite (or saturated) values were born: the record the offline scan makes
# too (accuracy.records.OverflowFinding); written into the dump's root summary flat, without
# the scan's `confirmation`.
OverflowEvent = OverflowFinding


def _event_dict(e: OverflowFinding) -> dict[str, Any]:
    return e.as_dict(confirmation=False)


@dataclass(slots=True)
class _Pending:
    """An op whose probes may still live on the device."""

    call: Call
    ins: list[torch.Tensor]  # inputs, pre-op copies of those the op writes
    outs: list[torch.Tensor]
    in_vals: list[Any]
    out_vals: list[Any]
    masked: bool = False  # an input holds intended mask values (-inf / finfo.min fills)
    in_keys: list[tuple[int, int]] = field(default_factory=list)  # inputs' (id, version) before
    n: int = 0  # ops checked when it ran


@dataclass(eq=False)
class _Held:
    """A birth not judged yet: copies of its tensors, and where its values went."""

    pending: _Pending
    out_states: list[int]
    in_ids: frozenset[int]  # its inputs' identities, for GradScaler's window
    lineage: Lineage


def _warn_at_user_line(msg: str, source: str) -> None:
    """A warning that points at the user's line, not at this module: the op's recorded
    source, else the user's innermost frame now (a collective run by DDP's or FSDP's hooks
    inside `loss.backward()` has no source of its own: that call is the user's line)."""
    filename, _, line = (source or user_source()[0]).rpartition(":")
    if filename and line.isdigit():
        warnings.warn_explicit(msg, OverflowWarning, filename, int(line))
    else:
        warnings.warn(msg, OverflowWarning, stacklevel=2)




class OverflowChecker:
    """The observer behind `dumper(check_overflow=True, ...)`: judges each op, writes births."""

    def __init__(self, nums: int = 1, raise_first: bool = False, saturation: object = None,
                 interval: int = 64, defer: bool | None = None) -> None:
        if nums == 0 or nums < -1:
            raise ValueError(f"overflow_nums must be -1 (all) or a positive count, not {nums}")
        self.nums = nums
        self.raise_first = raise_first
        self.saturation = Saturation.build(saturation)
        self.interval = interval
        self._defer = defer  # None: defer only for tensors off the CPU (tests force True)
        self.events: list[OverflowFinding] = []
        self.amp_ops = 0
        self.skipped_steps: list[int] = []
        self.ops_checked = 0
        self.done = False
        self._recorder: Recorder | None = None
        self._path = ""
        self._states = TensorStates(track_storage=True)  # memory that moved is re-probed
        self._masks = TensorStates()  # tensors holding intended values: attention masks
        self._pending: list[_Pending] = []
        self._held: list[_Held] = []  # births whose values may yet be dropped
        self.contained: list[OverflowFinding] = []
        # births since GradScaler's last update, with the ids of their inputs
        self._window: list[tuple[OverflowFinding, frozenset[int]]] = []
        self._n_overflow = 0
        self._n_saturation = 0
        self._current: _Pending | None = None  # between before() and after()

    def attach(self, recorder: Recorder, path: str) -> None:
        """Write births through `recorder` (the dump at `path`)."""
        self._recorder = recorder
        self._path = path

    def describe(self) -> dict[str, Any]:
        return {"overflow_nums": self.nums, "raise": self.raise_first,
                "saturation": self.saturation.describe() if self.saturation else None}

    # -- observer ----------------------------------------------------------------------------

    def before(self, call: Call) -> None:
        self._current = None
        if call.plan.amp:  # GradScaler's own ops: watched even after stopping
            self.amp_ops += 1
            ins = call.inputs
            if call.plan.name == AMP_UPDATE_OP:  # scale, growth tracker, found_inf: a few bytes
                with torch._C._DisableTorchDispatch():
                    ins = [t.clone() for t in ins]
            self._current = _Pending(call, ins, [], [], [])
            return
        if self.done:
            return
        self.ops_checked += 1
        ins = call.inputs
        if not call.plan.aten:
            # a custom op (FSDP2's all_gather_copy_in, a collective) reads memory that
            # writers outside aten, or through another alias, may have changed without a
            # version bump: after AdamW wrote NaN into FSDP2's shards, the cache still said
            # finite and every op of the next step was a "birth"
            for t in ins:
                self._states.forget(t)
        keys = [(id(t), version_of(t)) for t in ins]
        with torch._C._DisableTorchDispatch():
            in_vals = [self._value_of(t) for t in ins]
            masked = any(self._masks.get(t) for t in ins)
            if call.plan.mutable:  # in-place ops overwrite inputs: keep the written ones' values
                written = written_ids(call.func, call.args, call.kwargs)
                ins = [t.clone() if id(t) in written and checkable(t) else t for t in ins]
        self._current = _Pending(call, ins, [], in_vals, [], masked, keys, self.ops_checked)

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        p, self._current = self._current, None
        if p is None or p.call is not call:
            return
        if call.plan.amp:
            self._amp_op(p)
            return
        p.outs = outputs
        if call.plan.mutable and not call.plan.aten:
            # A custom op's writes (FSDP2's copy-out of the all-gathered parameters, under
            # `_unsafe_preserve_version_counter`) leave every version counter as it was, and
            # other tensor objects over that memory (the module's parameters) keep what the
            # cache holds for them: stale, and found by the same address whenever the
            # allocator hands the freed block back (a false birth at the next addmm, in about
            # one run in five under load). Forget everything over the memory it received.
            with torch._C._DisableTorchDispatch():
                for t in (*call.inputs, *outputs):
                    self._states.forget_aliases(t)
        if self._mask_made(p):
            return  # intended values: never a birth, and overflow_nums does not count them
        with torch._C._DisableTorchDispatch():
            if same_elements(call.plan, p.ins, outputs) and checkable(outputs[0]):
                # a view holding its input's very elements has its input's state: no probe
                # (about 60% of a transformer step's output elements)
                p.out_vals = [p.in_vals[0]]
                self._states.put(outputs[0], p.in_vals[0])
            else:
                p.out_vals = [self._probe_and_cache(t) for t in outputs]
        if all(not isinstance(v, torch.Tensor) for v in p.in_vals + p.out_vals):
            self._judge(p)
            self._settle()
        else:
            self._pending.append(p)
            if len(self._pending) >= self.interval:
                self.resolve()

    def finish(self) -> dict[str, Any]:
        """Judge what is still pending; the summary attributes for the dump's root."""
        if not self.done:
            self.resolve()
        self._settle(final=True)
        n_handled = sum(1 for e in self.events if e.label == HANDLED)
        dropped = (f"; {len(self.contained)} more were dropped by later ops (contained)"
                   if self.contained else "")
        if self.events:
            log.warning("overflow check: %d birth(s) (%d handled by loss scaling) in %d ops%s; "
                        "see %s", len(self.events), n_handled, self.ops_checked, dropped,
                        self._path)
        else:
            log.info("overflow check: no inf/nan born in %d ops that lasted%s",
                     self.ops_checked, dropped)
        return {schema.ROOT_OVERFLOW: {
            **self.describe(), "ops_checked": self.ops_checked, "stopped_early": self.done,
            "events": [_event_dict(e) for e in self.events], "amp_ops": self.amp_ops,
            "skipped_steps": self.skipped_steps,
            "contained": [_event_dict(e) for e in self.contained],
        }}

    # -- states ------------------------------------------------------------------------------

    def _sync_now(self, t: torch.Tensor) -> bool:
        if self._defer is not None:
            return not self._defer
        return t.device.type == "cpu" or self.raise_first

    def _probe_and_cache(self, t: torch.Tensor) -> Any:
        if not checkable(t):
            return None
        v = probe(t, self.saturation)
        if self._sync_now(t):
            v = v.item()
            if not math.isfinite(v) and exact_state(t, self.saturation) != NONFINITE:
                v = 0.0  # the sum overflowed; the values are finite
        self._states.put(t, v)
        return v

    def _value_of(self, t: torch.Tensor) -> Any:
        if not checkable(t):
            return None
        v = self._states.get(t)
        return self._probe_and_cache(t) if v is None else v

    def _state(self, v: Any, t: torch.Tensor) -> int:
        if v is None:
            return FINITE
        return state(float(v), t.dtype, self.saturation)

    # -- judging -----------------------------------------------------------------------------

    def resolve(self) -> None:
        """Read every pending probe with one host transfer and judge those ops in order."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        dev = [v for p in pending for v in p.in_vals + p.out_vals if isinstance(v, torch.Tensor)]
        host = torch.stack([v.float().cpu() for v in dev]).tolist() if dev else []
        value = dict(zip(map(id, dev), host, strict=True))
        for p in pending:
            p.in_vals = [value.get(id(v), v) if isinstance(v, torch.Tensor) else v
                         for v in p.in_vals]
            p.out_vals = [value.get(id(v), v) if isinstance(v, torch.Tensor) else v
                          for v in p.out_vals]
            if self.done:
                return
            self._judge(p)
        self._settle()

    def _mark_mask(self, outputs: list[torch.Tensor]) -> None:
        with torch._C._DisableTorchDispatch():
            for t in outputs:
                self._masks.put(t, True)
                self._states.forget(t)  # its values are known intended, not finite

    def _mask_made(self, p: _Pending) -> bool:
        """A fill of -inf / finfo.min (a mask), or an op that only shapes a mask: its outputs
        are intended values."""
        c = p.call
        dtype = str(p.outs[0].dtype).removeprefix("torch.") if p.outs else None
        if intended_fill(c.name, c.args, c.kwargs, dtype) or (p.masked and shapes_mask(c.name)):
            self._mark_mask(p.outs)
            return True
        return False

    def _mask_propagated(self, p: _Pending) -> bool:
        """A mask combined with finite values (scores + mask): -inf where it masks is
        intended; +inf or NaN is an overflow of the values themselves."""
        if not p.masked:
            return False
        with torch._C._DisableTorchDispatch():
            for t in p.outs:
                if checkable(t) and (torch.isnan(t).any() or torch.isposinf(t).any()):
                    return False
        self._mark_mask(p.outs)
        return True

    def _judge(self, p: _Pending) -> None:
        if p.call.plan.uninitialised:  # empty*: whatever the memory held is no birth
            return
        in_states = [self._state(v, t) for v, t in zip(p.in_vals, p.ins, strict=True)]
        in_state = max(in_states, default=FINITE)
        out_states = [self._state(v, t) for v, t in zip(p.out_vals, p.outs, strict=True)]
        if self._held:
            self._follow(p, out_states)
        worst = max(out_states, default=FINITE)
        if worst == NONFINITE and in_state == NONFINITE:
            # A probe read late (off CPU, in one transfer per batch) was not checked when it
            # was taken: a sum over finite values near the dtype's max (where overflows are
            # born) overflows too, and would pass the birth off as inherited.
            in_state = max((exact_state(t, self.saturation) if s == NONFINITE else s
                            for s, t in zip(in_states, p.ins, strict=True)), default=FINITE)
        if worst <= in_state or worst == FINITE:
            return
        if worst == NONFINITE:
            # a non-finite sum can come from finite data: check the tensors themselves
            exact = [exact_state(t, self.saturation) if s == NONFINITE else s
                     for s, t in zip(out_states, p.outs, strict=True)]
            worst = max(exact)
            if worst <= in_state or worst == FINITE:
                return
        if self._mask_propagated(p):
            return
        kind = "overflow" if worst == NONFINITE else "saturation"
        if kind == "saturation" and self.nums != -1 and self._n_saturation >= self.nums:
            return
        if kind == "overflow" and not self.raise_first:
            self._hold(p, out_states)
        else:
            self._event(p, kind, out_states)

    # -- births held until their values are known to last or to be dropped ---------------------

    def _hold(self, p: _Pending, out_states: list[int]) -> None:
        lineage = Lineage(p.n)
        for t, s in zip(p.outs, out_states, strict=True):
            if s == NONFINITE:
                lineage.add(t)
        in_ids = frozenset(id(t) for t in p.ins)
        with torch._C._DisableTorchDispatch():  # as they are now: later ops may write them
            kept = _Pending(p.call, [t.clone() if plain(t) else t for t in p.ins],
                            [t.clone() if plain(t) else t for t in p.outs],
                            p.in_vals, p.out_vals, p.masked)
        self._held.append(_Held(kept, out_states, in_ids, lineage))

    def _follow(self, p: _Pending, out_states: list[int]) -> None:
        """Pass each held birth's lineage through op `p`: the non-finite outputs of an op that
        read one of its carriers carry it on."""
        if p.call.name.startswith(READS_NO_VALUES_PREFIXES):
            return
        for h in self._held:
            read = [k for k in p.in_keys if h.lineage.carries(k)]
            if not read:
                continue
            for k in read:
                h.lineage.read(k, p.n)
            carried = [t for t, s in zip(p.outs, out_states, strict=True) if s == NONFINITE]
            for t in carried:
                h.lineage.add(t)
            if not p.outs:  # .item() and the like: a value reached Python
                h.lineage.escaped = h.lineage.escaped or p.call.name
            elif not carried:
                h.lineage.absorbed_by = (h.lineage.absorbed_by
                                         or f"op {p.call.seq} {p.call.name}")

    def _settle(self, final: bool = False) -> None:
        """Judge the held births whose fate is known (all of them when `final`), in order."""
        if not self._held:
            return
        held, self._held = self._held, []
        for h in held:
            if self.done:
                return  # stopped at overflow_nums: the rest are not written
            verdict = h.lineage.verdict(self.ops_checked, LINEAGE_WINDOW, final)
            if verdict is None:
                self._held.append(h)
            elif verdict == CONFIRM:
                self._event(h.pending, "overflow", h.out_states, h.in_ids)
            else:
                self._contain(h)

    def _contain(self, h: _Held) -> None:
        p = h.pending
        c = p.call
        ev = OverflowFinding(c.site, self._nonfinite_outputs(p, h.out_states), "overflow",
                             f"contained: {h.lineage.absorbed_by} dropped it")
        self.contained.append(ev)
        self._write(p, {schema.EXTRA_OVERFLOW: {"kind": "overflow", "born": True,
                                                "outputs": ev.outputs, "contained": ev.label}})
        log.info("%s (%s)", ev.message(), ev.label)

    # -- events ------------------------------------------------------------------------------

    @staticmethod
    def _nonfinite_outputs(p: _Pending, out_states: list[int]) -> list[dict[str, Any]]:
        outputs = []
        for i, (t, s) in enumerate(zip(p.outs, out_states, strict=True)):
            if s != FINITE and checkable(t):
                with torch._C._DisableTorchDispatch():
                    n = counts(t)
                outputs.append({"idx": i, "dtype": str(t.dtype).removeprefix("torch."),
                                "shape": list(t.shape), **n})
        return outputs

    def _event(self, p: _Pending, kind: str, out_states: list[int],
               in_ids: frozenset[int] | None = None) -> None:
        c = p.call
        outputs = self._nonfinite_outputs(p, out_states)
        ev = OverflowFinding(c.site, outputs, kind,
                             FROM_COLLECTIVE if is_collective(c.name) else "")
        self.events.append(ev)
        self._window.append((ev, frozenset(id(t) for t in p.ins) if in_ids is None else in_ids))
        extra: dict[str, Any] = {schema.EXTRA_OVERFLOW: {"kind": kind, "born": True,
                                              "outputs": outputs}}
        self._write(p, extra)
        msg = ev.message()
        if kind == "overflow":
            self._n_overflow += 1
            log.info("%s", msg)  # the OverflowWarning below is what users see (once)
            _warn_at_user_line(msg, c.source)
            if self.raise_first:
                self.done = True
                raise OverflowDetected(msg, ev)
            if self.nums != -1 and self._n_overflow >= self.nums:
                self.done = True
                log.warning("overflow check: stopping after %d overflow(s) (overflow_nums=%d)",
                            self._n_overflow, self.nums)
        else:
            self._n_saturation += 1
            log.warning("%s", msg)

    def _write(self, p: _Pending, extra: dict[str, Any], with_tensors: bool = True) -> None:
        rec = self._recorder
        if rec is None or rec.failed:
            return
        if with_tensors:
            rec.write_tensors(p.call, p.ins, p.outs, extra)
        else:
            rec.write(p.call, [], 0, 0, extra)

    # -- GradScaler --------------------------------------------------------------------------

    def _amp_op(self, p: _Pending) -> None:
        """GradScaler's deliberate checks: labelled, recorded, never culprits."""
        c = p.call
        small = c.name == AMP_UPDATE_OP
        extra: dict[str, Any] = {schema.EXTRA_AMP: amp_label(c.name)}
        if small:
            self.resolve()
            self._settle(final=True)  # this step's births are judged before its verdict
            found_inf = c.args[2] if len(c.args) > 2 else c.kwargs["found_inf"]
            with torch._C._DisableTorchDispatch():
                skipped = float(found_inf.item()) > 0  # GradScaler itself synced on it
            extra[schema.EXTRA_STEP_SKIPPED] = skipped
            if skipped:
                self.skipped_steps.append(c.step)
                scale = id(c.args[0]) if c.args else id(c.kwargs.get("self"))
                handled = [ev for ev, ids in self._window if loss_scaled(ev.phase, scale in ids)]
                for ev in handled:
                    ev.label = HANDLED
                if handled:
                    log.warning("overflow check: GradScaler skipped this step; %d overflow(s) "
                                "above were %s", len(handled), HANDLED)
                if len(handled) < len(self._window):
                    log.warning("overflow check: %d forward overflow(s) in this skipped step "
                                "were not made by loss scaling (it scales only the loss and "
                                "the gradients): they stay births",
                                len(self._window) - len(handled))
            self._window = []
        self._write(p, extra, with_tensors=small)
