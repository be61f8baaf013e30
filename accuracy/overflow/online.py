"""Online overflow checking inside `dumper(check_overflow=True)`: find where inf/nan is born.

Each tensor's state (finite, saturated, non-finite) comes from one reduction (`probe`) and is
cached by tensor identity and `_version`, so an op's inputs are usually already known when it
runs. An op is a birth when all its inputs were finite and an output is not; only births (and
GradScaler's own ops, labelled) are written to the dump. On CPU, or when raising was asked for,
each op is judged at once; on other devices the probes wait on the device and are read in one
batch every `interval` ops, so training never syncs per op.
"""

from __future__ import annotations

import logging
import math
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten

from accuracy.aten import written_ids
from accuracy.dumper.flatten import tensors_in
from accuracy.dumpfile import schema
from accuracy.dumpfile.argcodec import encode_call
from accuracy.dumpfile.writer import DumpWriteError, OpEntry
from accuracy.overflow.labels import AMP_CHECK_OPS, AMP_UPDATE_OP, HANDLED, amp_label
from accuracy.overflow.probe import (
    FINITE,
    NONFINITE,
    Saturation,
    checkable,
    counts,
    exact_state,
    probe,
    state,
)

if TYPE_CHECKING:
    from accuracy.dumper.core import dumper as Dumper
    from accuracy.dumpfile.writer import DumpWriter

log = logging.getLogger(__name__)


class OverflowDetected(RuntimeError):  # noqa: N818 - reads as what happened
    """Raised at the first overflow when `overflow_raise=True`; the traceback is the user's."""

    def __init__(self, message: str, event: OverflowEvent) -> None:
        super().__init__(message)
        self.event = event


class OverflowWarning(RuntimeWarning):
    """Shown once per overflow birth, so it is seen even without logging configured."""


@dataclass
class OverflowEvent:
    """One op where non-finite (or saturated) values were born."""

    seq: int
    op: str
    phase: str
    module: str
    source: str
    step: int
    kind: str  # "overflow" | "saturation"
    outputs: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""

    def message(self) -> str:
        what = "produced inf/nan from finite inputs" if self.kind == "overflow" else (
            "produced values near the float16/bfloat16 limit from unsaturated inputs")
        outs = "; ".join(
            f"output {o['idx']} {o['dtype']}{o['shape']}: {o['nan']} nan, {o['inf']} inf"
            f" of {o['numel']}, max |finite| {o['max_abs_finite']:.4g}" for o in self.outputs)
        outs = outs.replace("max |finite| nan", "no finite value")
        return (f"{self.kind} born at op {self.seq} {self.op} ({self.phase}, module "
                f"{self.module or '-'}) at {self.source or 'unknown source'}: {what}. {outs}")


@dataclass
class _Pending:
    """An op whose probes still live on the device."""

    func: Any
    name: str
    args: Any
    kwargs: Any
    ins: list[torch.Tensor]
    outs: list[torch.Tensor]
    in_vals: list[Any]
    out_vals: list[Any]
    ctx: tuple[int, str, str, str, str, int]  # seq, phase, module, source, stack, step


class _States:
    """Probe values of tensor states seen so far: id -> (weakref, _version, value)."""

    def __init__(self) -> None:
        self._map: dict[int, tuple[weakref.ref, int, Any]] = {}

    def get(self, t: torch.Tensor) -> Any:
        hit = self._map.get(id(t))
        if hit is None or hit[0]() is not t:
            return None
        try:
            return hit[2] if t._version == hit[1] else None
        except RuntimeError:
            return None

    def put(self, t: torch.Tensor, value: Any) -> None:
        try:
            self._map[id(t)] = (weakref.ref(t), t._version, value)
        except (RuntimeError, TypeError):
            pass
        if len(self._map) > 200_000:  # drop entries of dead tensors
            self._map = {k: v for k, v in self._map.items() if v[0]() is not None}


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors in args/kwargs/outputs, in pytree order; faster than tree_flatten per op."""
    return tensors_in(obj, out)


def _warn_at_user_line(msg: str, source: str) -> None:
    """A warning that points at the user's line, not at this module."""
    filename, _, line = source.rpartition(":")
    if filename and line.isdigit():
        warnings.warn_explicit(msg, OverflowWarning, filename, int(line))
    else:
        warnings.warn(msg, OverflowWarning, stacklevel=2)




class OverflowChecker:
    """The per-op logic behind `dumper(check_overflow=True, ...)`."""

    def __init__(self, nums: int = 1, raise_first: bool = False, saturation: object = None,
                 interval: int = 64, defer: bool | None = None) -> None:
        if nums == 0 or nums < -1:
            raise ValueError(f"overflow_nums must be -1 (all) or a positive count, not {nums}")
        self.nums = nums
        self.raise_first = raise_first
        self.saturation = Saturation.build(saturation)
        self.interval = interval
        self._defer = defer  # None: defer only for tensors off the CPU (tests force True)
        self.events: list[OverflowEvent] = []
        self.amp_ops = 0
        self.skipped_steps: list[int] = []
        self.ops_checked = 0
        self.done = False
        self._states = _States()
        self._pending: list[_Pending] = []
        self._window: list[OverflowEvent] = []  # births since GradScaler's last update
        self._n_overflow = 0
        self._n_saturation = 0

    # -- dumper hooks ------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {"overflow_nums": self.nums, "raise": self.raise_first,
                "saturation": self.saturation.describe() if self.saturation else None}

    def on_op(self, d: Dumper, writer: DumpWriter, func: Any, name: str, args: tuple,
              kwargs: dict, seq: int, phase: str, module: str, source: str, stack: str) -> Any:
        """Run one op, judge it, and write it to the dump if it is a birth."""
        ctx = (seq, phase, module, source, stack, d.current_step)
        if name in AMP_CHECK_OPS or name == AMP_UPDATE_OP:  # watched even after stopping
            return self._amp_op(d, writer, func, name, args, kwargs, ctx)
        if self.done:
            return func(*args, **kwargs)
        self.ops_checked += 1
        ins = _tensors(kwargs, _tensors(args, []))
        with torch._C._DisableTorchDispatch():
            in_vals = [self._value_of(t) for t in ins]
            written = written_ids(func, args, kwargs) if func._schema.is_mutable else ()
            # in-place ops overwrite their inputs: keep the pre-op values of the written ones
            ins_pre = [t.clone() if id(t) in written and checkable(t) else t for t in ins]
        out = func(*args, **kwargs)
        outs = _tensors(out, [])
        with torch._C._DisableTorchDispatch():
            out_vals = [self._probe_and_cache(t) for t in outs]
        p = _Pending(func, name, args, kwargs, ins_pre, outs, in_vals, out_vals, ctx)
        if all(not isinstance(v, torch.Tensor) for v in in_vals + out_vals):
            self._judge(d, writer, p)
        else:
            self._pending.append(p)
            if len(self._pending) >= self.interval:
                self.resolve(d, writer)
        return out

    def finish(self, d: Dumper, writer: DumpWriter) -> dict[str, Any]:
        """Judge what is still pending; the summary attributes for the dump's root."""
        if not self.done:
            self.resolve(d, writer)
        n_handled = sum(1 for e in self.events if e.label == HANDLED)
        if self.events:
            log.warning("overflow check: %d birth(s) (%d handled by loss scaling) in %d ops; "
                        "see %s", len(self.events), n_handled, self.ops_checked, d.path)
        else:
            log.info("overflow check: no inf/nan born in %d ops", self.ops_checked)
        return {"overflow": {
            **self.describe(), "ops_checked": self.ops_checked, "stopped_early": self.done,
            "events": [asdict(e) for e in self.events], "amp_ops": self.amp_ops,
            "skipped_steps": self.skipped_steps,
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

    def resolve(self, d: Dumper, writer: DumpWriter) -> None:
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
            self._judge(d, writer, p)

    def _judge(self, d: Dumper, writer: DumpWriter, p: _Pending) -> None:
        in_state = max((self._state(v, t) for v, t in zip(p.in_vals, p.ins, strict=True)),
                       default=FINITE)
        out_states = [self._state(v, t) for v, t in zip(p.out_vals, p.outs, strict=True)]
        worst = max(out_states, default=FINITE)
        if worst <= in_state or worst == FINITE:
            return
        if worst == NONFINITE:
            # a non-finite sum can come from finite data: check the tensors themselves
            exact = [exact_state(t, self.saturation) if s == NONFINITE else s
                     for s, t in zip(out_states, p.outs, strict=True)]
            worst = max(exact)
            if worst <= in_state or worst == FINITE:
                return
        kind = "overflow" if worst == NONFINITE else "saturation"
        if kind == "saturation" and self.nums != -1 and self._n_saturation >= self.nums:
            return
        self._event(d, writer, p, kind, out_states)

    def _event(self, d: Dumper, writer: DumpWriter, p: _Pending, kind: str,
               out_states: list[int]) -> None:
        seq, phase, module, source, stack, step = p.ctx
        outputs = []
        for i, (t, s) in enumerate(zip(p.outs, out_states, strict=True)):
            if s != FINITE and checkable(t):
                with torch._C._DisableTorchDispatch():
                    c = counts(t)
                outputs.append({"idx": i, "dtype": str(t.dtype).removeprefix("torch."),
                                "shape": list(t.shape), **c})
        ev = OverflowEvent(seq, p.name, phase, module, source, step, kind, outputs)
        self.events.append(ev)
        self._window.append(ev)
        extra: dict[str, Any] = {"overflow": {"kind": kind, "born": True,
                                              "outputs": outputs}}
        self._write(d, writer, p, extra)
        msg = ev.message()
        if kind == "overflow":
            self._n_overflow += 1
            log.warning("%s", msg)
            _warn_at_user_line(msg, source)
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

    def _write(self, d: Dumper, writer: DumpWriter, p: _Pending, extra: dict[str, Any],
               with_tensors: bool = True) -> None:
        seq, phase, module, source, stack, step = p.ctx
        entries = []
        if with_tensors:
            with torch._C._DisableTorchDispatch():
                entries = [d._entry(writer, seq, schema.INPUT, i, t)
                           for i, t in enumerate(p.ins)]
                entries += [d._entry(writer, seq, schema.OUTPUT, i, t)
                            for i, t in enumerate(p.outs)]
        counter = iter(range(len(p.ins)))
        op = OpEntry(seq=seq, op=p.name, phase=phase, module=module, source=source, stack=stack,
                     args=encode_call(p.args, p.kwargs, lambda _t: next(counter)), step=step,
                     n_in=len(p.ins) if with_tensors else 0,
                     n_out=len(p.outs) if with_tensors else 0, extra=extra)
        try:
            writer.add_op(op, entries)
        except DumpWriteError as e:
            if d.strict:
                raise
            log.error("%s; the overflow record of op %d is lost", e, seq)
            return
        d.ops_recorded += 1
        d._steps_seen.add(step)

    # -- GradScaler --------------------------------------------------------------------------

    def _amp_op(self, d: Dumper, writer: DumpWriter, func: Any, name: str, args: tuple,
                kwargs: dict, ctx: tuple) -> Any:
        """GradScaler's deliberate checks: labelled, recorded, never culprits."""
        self.amp_ops += 1
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        small = name == AMP_UPDATE_OP  # scale, growth tracker, found_inf: a few bytes
        with torch._C._DisableTorchDispatch():
            ins_pre = [t.clone() for t in ins] if small else ins
        out = func(*args, **kwargs)
        p = _Pending(func, name, args, kwargs, ins_pre, [], [], [], ctx)
        extra: dict[str, Any] = {"amp": amp_label(name)}
        if name == AMP_UPDATE_OP:
            self.resolve(d, writer)
            found_inf = args[2] if len(args) > 2 else kwargs["found_inf"]
            with torch._C._DisableTorchDispatch():
                skipped = float(found_inf.item()) > 0  # GradScaler itself synced on it
            extra["step_skipped"] = skipped
            if skipped:
                self.skipped_steps.append(ctx[5])
                for ev in self._window:
                    ev.label = HANDLED
                if self._window:
                    log.warning("overflow check: GradScaler skipped this step; %d overflow(s) "
                                "above were %s", len(self._window), HANDLED)
            self._window = []
        self._write(d, writer, p, extra, with_tensors=small)
        return out
