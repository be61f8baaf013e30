"""`live_check(...)`: re-run every op on a reference while the device step runs; keep figures.

Each op call inside the block is run on the device as usual, then re-run on the reference
(CPU by default) with a copy of the device's own inputs, in the same dtype and upcast, exactly
as `accuracy replay` does from a dump: the same code (`accuracy.replay.ops.rerun`) computes
the same local error figures, and the same rule as `accuracy compare` judges them
(`accuracy.compare.verdict.judge_local`). Only the figures are kept: no tensor is stored, and
inputs are copied to the reference one op at a time, so memory stays bounded.

The check is an observer with no writer on the dumper's loop (accuracy/dumper/loop.py): the
same numbering, the same placing (phase, module, source line: the rows of a dump and the live
check's results name an op alike), and the same memory watcher: bytes that are not data are
followed as the dumper follows them (`accuracy/dumper/uninit.py`, updated by every op, checked
or not), so an op that reads bytes no op has written since an `empty*` (FSDP2's all-gather
buffer before its collective, any buffer filled many calls after its allocation), or leaves an
output touching them, is not judged.

Under `sim`, enter `live_check` inside `sim(...)` (like the dumper): it then sees each op's
real arguments and the sim's faulty result, as on hardware.

Compiled code runs compiled under the check, as under the dumper, and each Inductor kernel
launch is checked against its own ATen ops (accuracy/live/kernels.py): the check judges the
program the job runs, not its eager twin. A region whose launches it could not all judge is
said first (`BLIND:`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from accuracy.aten import OpPlan, overwritten_ids, workspace_outputs
from accuracy.compare import verdict as V
from accuracy.compare.precision import ComputePrecision
from accuracy.dumper.calls import Call, KernelCall, produced
from accuracy.dumper.compiled.watch import watch_dumper
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.identity import TensorStates
from accuracy.dumper.loop import Loop, current_rank
from accuracy.dumper.sites import Sites
from accuracy.dumper.uninit import MemoryWatch
from accuracy.dumpfile.compiled import blind_lines
from accuracy.dumpfile.stats import flat_view, fused_float_stats
from accuracy.errors import AccuracyError, RaisedForTheUser
from accuracy.jsonsafe import jsonable
from accuracy.live.kernels import NOT_GIVEN_REASON, RegionTally, judged_live, kernel_outcome
from accuracy.live.select import CallSelection, in_sample, unrunnable
from accuracy.live.window import HOLE, CheckWindow, on_device, to_host
from accuracy.replay.engine import reference_device
from accuracy.replay.ops import (
    FAILED,
    OK,
    SKIPPED,
    OpOutcome,
    dropout_reference,
    guarded,
    needs_upcast,
    rerun,
)
from accuracy.replay.rebuild import UPCASTS, Unreplayable, build_call
from accuracy.replay.refcall import Reference, ReferenceCall
from accuracy.replay.registry import lookup_reference

log = logging.getLogger(__name__)
STOP_ON = (None, "error", "warning")
UNFILLED_REASON = "uninitialised memory (bytes no op has written since empty*): not judged"
_RANK = {None: 0, V.PASS: 1, V.WARNING: 2, V.ERROR: 3}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fill_tensors(obj: Any, tensors: Iterable[Any]) -> Any:
    """`obj` (call arguments, an op's result) with its tensors, or the holes a call waiting
    in the window left for them (`window.HOLE`), replaced in `tensors_in` order by the next
    of `tensors`."""
    it = iter(tensors)

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor) or o is HOLE:
            return next(it)
        if isinstance(o, list | tuple):
            return type(o)(walk(x) for x in o)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        return o

    return walk(obj)


def _has_dtype(obj: Any) -> bool:
    if isinstance(obj, torch.dtype):
        return True
    if isinstance(obj, list | tuple):
        return any(_has_dtype(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_dtype(x) for x in obj.values())
    return False


def _failed(result: OpResult, e: Exception) -> None:
    """A check that failed (a bug of ours, or the device's): said in its result."""
    log.debug("live check of %s (call %d) failed", result.op, result.seq, exc_info=True)
    result.status, result.reason = FAILED, f"{type(e).__name__}: {str(e)[:300]}"
    result.outputs, result.verdict = [], None


class _LiveCall:
    """The `rec.call(tensors)` of a dump record, for a live call (what `build_call` needs)."""

    def __init__(self, args: tuple, kwargs: dict) -> None:
        self.args, self.kwargs = args, kwargs

    def call(self, tensors: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        args, kwargs = fill_tensors((list(self.args), self.kwargs), tensors)
        return args, kwargs


class _TensorShape:
    """What compare's numerics read of a recorded tensor (shape, dtype, L2), for a live one."""

    def __init__(self, idx: int, t: torch.Tensor) -> None:
        self.idx, self.shape, self.numel = idx, tuple(t.shape), t.numel()
        self.dtype = _dtype_name(t.dtype)
        self._t: torch.Tensor | None = t
        self._stats: dict[str, float | None] | None = None

    @property
    def stats(self) -> dict[str, float | None]:
        """Its L2 norm, measured on first use (a float64 pass: only the judge of an op
        computed coarser than its dtype needs it, see `verdict.judge_local`)."""
        if self._stats is None:
            t, self._t = self._t, None
            l2 = None
            if t is not None and t.is_floating_point() and self.numel > 1:
                with torch._C._DisableTorchDispatch(), torch.no_grad():
                    # a transposed weight as its memory block: the norm ignores order, and
                    # the C pass takes only contiguous tensors (else a float64 copy, ~10x)
                    t = flat_view(t)
                    fused = fused_float_stats(t)  # one C pass, fp64 sums
                    l2 = (fused[0][3] if fused is not None
                          else float(torch.linalg.vector_norm(t, dtype=torch.float64)))
            self._stats = {"l2": l2}
        return self._stats


class _CallShapes:
    """An OpRecord-like view of a live call: op name, input and output shapes."""

    def __init__(self, op: str, inputs: list[torch.Tensor],
                 outputs: list[tuple[int, torch.Tensor]]) -> None:
        self.op = op
        self.inputs = [_TensorShape(i, t) for i, t in enumerate(inputs)]
        self.outputs = [_TensorShape(i, t) for i, t in outputs]


@dataclass
class OpResult:
    """One op call's live-check figures: where it ran, and per output its local error."""

    seq: int
    op: str
    phase: str
    module: str
    source: str
    status: str  # ok | skipped | failed
    reason: str = ""
    verdict: str | None = None  # worst output verdict; None when nothing was judged
    outputs: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        """One line: op, where, verdict and the worst output's figures."""
        where = f"{self.op} (call {self.seq}, {self.phase}) in {self.module or '-'}"
        where += f" at {self.source or '?'}"
        worst = max(self.outputs, key=lambda o: _RANK.get(o.get("verdict"), 0), default=None)
        figs = ""
        if worst is not None:
            figs = (f": output {worst['idx']} error ratio {_fmt(worst.get('error_ratio'))} "
                    f"(device err {_fmt(worst.get('err_device'))}, reference err "
                    f"{_fmt(worst.get('err_reference'))}, max abs {_fmt(worst.get('max_abs'))}, "
                    f"cosine {_fmt(worst.get('cosine'))})")
            if worst.get("compute_precision"):
                figs += f", judged at compute precision {worst['compute_precision']}"
        return f"{where} judged {self.verdict or self.status}{figs}"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class LiveCheckError(AccuracyError, RaisedForTheUser, RuntimeError):
    """Raised by `live_check(stop_on=...)` at the first op judged at or above that level."""

    def __init__(self, result: OpResult) -> None:
        self.result = result
        super().__init__(f"live check stopped: {result.describe()}")



class LiveCheck:
    """Context manager: re-run each selected op on `on` and judge its local error.

    on: reference backend ("cpu", "cuda"...). upcast: "fp64" (default), "fp32" or "none", as
    in replay. ops / exclude_ops / modules / phases: which calls to check (patterns as in the
    dumper). stop_on: None, "error" or "warning": raise LiveCheckError at the first op judged
    at that level. config: verdict thresholds (TOML path or dict), as `accuracy compare
    --config`. keep: "all" OpResults, or only "flagged" ones (warning, error, failed) for
    long runs; counts cover every call either way. sample: the fraction of selected calls
    checked (1.0: all), a different set each step (`step`: the training step's number, when
    each step has its own block); the others run unchecked and are counted as sampled out.
    After the block: `results`, `report()`.

    An observer of its own loop (`before`, `after`: see accuracy/dumper/calls.py), which
    writes nothing: it judges each call it is shown and keeps the figures.
    """

    def __init__(self, on: str = "cpu", *, ops: str | Iterable[str] | None = None,
                 modules: str | Iterable[str] | None = None,
                 exclude_ops: str | Iterable[str] | None = None,
                 phases: str | Iterable[str] | None = None, upcast: str = "fp64",
                 stop_on: str | None = None,
                 config: str | os.PathLike[str] | dict | None = None,
                 keep: str = "all", sample: float = 1.0, step: int = 0) -> None:
        if not 0.0 < float(sample) <= 1.0:
            raise ValueError(f"sample is the fraction of calls checked, in (0, 1], not "
                             f"{sample!r}")
        if upcast not in UPCASTS:
            raise ValueError(f"upcast must be one of {UPCASTS}, not {upcast!r}")
        if keep not in ("all", "flagged"):
            raise ValueError(f"keep must be 'all' or 'flagged', not {keep!r}")
        if stop_on not in STOP_ON:
            raise ValueError(f"stop_on must be one of {STOP_ON}, not {stop_on!r}")
        self.on = on
        self.device = reference_device(on)
        self.upcast = upcast
        self.stop_on = stop_on
        self.selection = CallSelection.build(ops, modules, exclude_ops, phases)
        self.cfg = V.load_config(config)
        self.keep = keep
        self.sample, self.step = float(sample), int(step)
        self.sampled_out = 0  # selected calls left unchecked by the sample
        self.results: list[OpResult] = []
        self.checked = 0
        self._counts: Counter[str] = Counter()
        self._reasons: Counter[str] = Counter()
        self.notes: list[str] = []
        self._sim: Any = None
        self._loop: Loop | None = None
        self._memory = MemoryWatch()  # bytes no op has filled yet (as the dumper follows)
        # before -> after: the call's result, why it is not re-run, its inputs on the
        # reference (tensors), or queued host copies (`deferred`: judged in the window)
        self._pending: tuple[OpResult, str | None, list[Any] | None, bool] | None = None
        self._window = CheckWindow()  # device ops waiting to be judged (accuracy/live/window.py)
        self._warned_stack = False
        # compiled regions entered (accuracy/dumper/compiled/watch.py)
        self.compiled: dict[str, Any] = {}

    # -- context ------------------------------------------------------------------------

    @property
    def calls(self) -> int:
        """Calls the block ran (checked or not)."""
        return self._loop.seq if self._loop is not None else 0

    def __enter__(self) -> LiveCheck:
        self._sim = _active_sim()
        attrs = {"sim": self._sim.describe()} if self._sim is not None else {}
        self.precision = ComputePrecision.from_sources(self.cfg, attrs)
        self.results, self.notes, self.checked = [], [], 0
        self.sampled_out = 0
        self._counts, self._reasons = Counter(), Counter()
        self._memory = MemoryWatch()
        self._window = CheckWindow()
        sites = Sites(rank=current_rank()[0], step=self.step)
        # compiled regions run compiled under the check: their kernel launches are checked
        self._loop = loop = Loop(sites, label="live check", compiled=True, wants=self._wants)
        loop.observe(self._memory, every_call=True)  # unchecked ops fill memory too
        loop.observe(self)
        loop.install()
        # the dumper's compiled source: each launch a KernelCall into this loop (no writer, so
        # no recorded states to link a launch's inputs to)
        self._compiled = watch_dumper(loop, TensorStates(), loop.is_on)
        self._regions = RegionTally(self._compiled)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        waiting = self._window.close()  # judged before the loop goes (their order kept)
        self._regions.settle()
        self.compiled = self._compiled.finish()
        self.notes[:0] = blind_lines(self.compiled)  # unseen compiled code comes first
        self._loop.uninstall(exc_type, exc, tb)
        if self._loop.failed:
            self.notes.append(f"{self._loop.failed['count']} call(s) not checked: the live "
                              f"check failed on them (first: {self._loop.failed['first']})")
        # a stop it asks for is raised here, unless the block is already raising its own
        self._settle(waiting, stop=exc_type is None)
        log.info("live check: %s", self.counts())
        return False

    # -- per call: an observer of the loop -------------------------------------------------

    def _wants(self, call: Call) -> bool:
        """The calls checked: the selection's, in the sample."""
        site = call.site
        if not self.selection.wants(site.seq, site.op, site.module, site.phase):
            return False
        if not in_sample(site.seq, self.sample, self.step):
            self.sampled_out += 1
            return False
        return True

    def before(self, call: Call) -> None:
        self._pending = None
        self._check_stacking()
        site = call.site
        result = OpResult(site.seq, site.op, site.phase, site.module, site.source, SKIPPED)
        if type(call) is KernelCall:  # a compiled kernel's launch: it has run already
            memory = self._memory.memory
            with torch._C._DisableTorchDispatch():
                unfilled = bool(memory) and any(memory.holds(t) for t in call.inputs)
            self._pending = (result, UNFILLED_REASON if unfilled else None, None, False)
            return
        reason = unrunnable(call.func, site.op, call.args, call.kwargs)
        if reason is None and self._reads_unfilled(call.plan, call.args, call.kwargs,
                                                    call.inputs):
            reason = UNFILLED_REASON
        snapshot, deferred = None, False
        if reason is None:
            snapshot, deferred = self._snapshot(call.func, call.args, call.kwargs, result)
        self._pending = (result, reason, snapshot, deferred)

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        result, reason, snapshot, deferred = pending
        if reason is None and self._left_unfilled(call, outputs):
            reason = UNFILLED_REASON  # it left (part of) an output unfilled: not data
        kernel = type(call) is KernelCall
        if reason is None and not kernel and (deferred or self._made_on_device(snapshot, outputs)):
            self._defer(call, outputs, snapshot, result)  # type: ignore[arg-type]
            return
        if reason is not None:
            result.reason = reason
        elif snapshot is not None or kernel:
            try:
                if kernel:
                    self._measure_kernel(call, outputs, result)  # type: ignore[arg-type]
                else:
                    self._measure(call.func, result.op, call.args, call.kwargs, snapshot,
                                  outputs, result)
            except Exception as e:  # noqa: BLE001 - the user's step never fails because of us
                _failed(result, e)
        if kernel:
            self._regions.add(None if result.verdict is not None
                              else (result.reason or result.status).split(":")[0])
        self._judged(result)

    def _made_on_device(self, inputs: list[Any] | None, outputs: list[torch.Tensor]) -> bool:
        """An op with no tensor input whose outputs are on an accelerator (`zeros`, `arange`,
        `full` on the device: masks, positions, optimizer states): nothing of the host's can
        change under it, so it waits in the window too, instead of reading back with a wait."""
        return inputs is not None and not inputs and self.device.type == "cpu" \
            and on_device(outputs)

    def _defer(self, call: Call, outputs: list[torch.Tensor], inputs: list[Any],
               result: OpResult) -> None:
        """Queue the outputs' host copies and leave the op's re-run to the window."""
        try:
            with torch._C._DisableTorchDispatch(), torch.no_grad():
                outs = [(i, to_host(t)) for i, t in enumerate(outputs)]
        except RuntimeError as e:
            result.status, result.reason = FAILED, f"device output to host: {str(e)[:200]}"
            self._judged(result)
            return
        func, name = call.func, result.op
        # the call's arguments without its tensors (the copies hold what the re-run reads)
        args, kwargs = fill_tensors((list(call.args), call.kwargs), itertools.repeat(HOLE))

        def judge() -> OpResult:
            try:
                ins = [c.wait() for c in inputs]
                host = [(i, c.wait()) for i, c in outs]
                outcome = guarded(result.seq, name, lambda: self._rerun(
                    func, name, tuple(args), kwargs, ins, host, result))
                self._judge(name, outcome, ins, host, result)
            except Exception as e:  # noqa: BLE001 - as in `after`
                _failed(result, e)
            return result

        size = sum(t.numel() * t.element_size() for t in (*call.inputs, *outputs))
        devices = {t.device for t in (*call.inputs, *outputs) if t.device.type != "cpu"}
        self._settle(self._window.add(judge, size, devices))

    def _judged(self, result: OpResult) -> None:
        """A call judged now: behind device ops still waiting, in order with them."""
        self._settle(self._window.add(lambda: result) if len(self._window) else [result])

    def _settle(self, results: list[OpResult], stop: bool = True) -> None:
        """Count judged calls, in order; then stop at the first at `stop_on`'s level."""
        for r in results:
            self._tally(r)
        if not (self.stop_on and stop):
            return
        for r in results:
            if _RANK.get(r.verdict, 0) >= _RANK[self.stop_on]:
                raise LiveCheckError(r)

    def finish(self) -> dict[str, Any]:
        return {}

    def _reads_unfilled(self, plan: OpPlan, args: tuple, kwargs: dict,
                        inputs: list[torch.Tensor]) -> bool:
        """Whether the op reads bytes no op has written since an empty* made them (the
        dumper's rule, `accuracy/dumper/uninit.py`). An argument it overwrites without
        reading (`copy_`'s, `fill_`'s target, `out=`) does not count: what it held is
        never used, and `_left_unfilled` sees whether the op filled it."""
        memory = self._memory.memory
        if not memory:
            return False
        skip = overwritten_ids(plan, args, kwargs)
        with torch._C._DisableTorchDispatch():
            return any(memory.holds(t) for t in inputs if id(t) not in skip)

    def _left_unfilled(self, call: Call, outputs: list[torch.Tensor]) -> bool:
        """Whether an output (other than an empty*'s own, which `unrunnable` names) still
        touches unfilled bytes after the op ran (the memory watcher, shown the call before
        this check, has followed it)."""
        memory = self._memory.memory
        if call.plan.uninitialised or not memory:
            return False
        outs = produced(call, outputs)  # a fused op's results are its writes
        with torch._C._DisableTorchDispatch():
            return any(memory.holds(t) for t in outs)

    def _snapshot(self, func: Any, args: tuple, kwargs: dict, result: OpResult
                  ) -> tuple[list[Any] | None, bool]:
        """The device's inputs on the reference, copied before the op may write to them;
        and whether the op waits in the window: inputs on an accelerator checked on the CPU
        are host copies queued without waiting (their `wait()` gives the tensor)."""
        inputs = tensors_in(kwargs, tensors_in(args))
        for t in inputs:
            if t.layout != torch.strided or type(t) not in (torch.Tensor, torch.nn.Parameter) \
                    or t.device.type == "meta":
                result.reason = f"input is not a plain strided tensor ({type(t).__name__}, " \
                                f"{t.layout}, {t.device})"
                return None, False
        copy = func._schema.is_mutable
        deferred = self.device.type == "cpu" and on_device(inputs)
        try:
            with torch._C._DisableTorchDispatch(), torch.no_grad():
                if deferred:
                    return [to_host(t) for t in inputs], True
                return [t.detach().to(self.device, copy=copy) for t in inputs], False
        except RuntimeError as e:
            result.status, result.reason = FAILED, f"copy to {self.device}: {str(e)[:200]}"
            return None, False

    def _measure(self, func: Any, name: str, args: tuple, kwargs: dict,
                 inputs: list[torch.Tensor], outs: list[torch.Tensor], result: OpResult) -> None:
        try:
            with torch._C._DisableTorchDispatch(), torch.no_grad():
                host = [(i, t.detach().to("cpu")) for i, t in enumerate(outs)]
        except RuntimeError as e:
            result.status, result.reason = FAILED, f"device output to host: {str(e)[:200]}"
            return
        outcome = guarded(result.seq, name,
                          lambda: self._rerun(func, name, args, kwargs, inputs, host, result))
        self._judge(name, outcome, inputs, host, result)

    def _measure_kernel(self, call: KernelCall, outs: list[torch.Tensor],
                        result: OpResult) -> None:
        """A kernel launch: its outputs against its ATen ops re-run (accuracy/live/kernels.py);
        only outputs re-run from the graph Inductor was given are judged."""
        host = list(enumerate(outs))
        want = needs_upcast(call.inputs, [t.dtype for t in outs], False, self.upcast)
        outcome = guarded(result.seq, result.op, lambda: kernel_outcome(
            call, outs, Reference(self.device, self.upcast, keep=False), want))
        self._judge(result.op, outcome, call.inputs, host, result, kernel=True)
        if result.status == OK and result.verdict is None:
            why = NOT_GIVEN_REASON if any(o.get("not_judged") for o in result.outputs) \
                else "no output with data to judge"
            result.reason = f"{why}; {result.reason}" if result.reason else why

    def _judge(self, name: str, outcome: OpOutcome, inputs: list[torch.Tensor],
               host: list[tuple[int, torch.Tensor]], result: OpResult,
               kernel: bool = False) -> None:
        """Each measured output judged by its local error, as compare judges a replayed one
        (a kernel's only where re-run from the graph Inductor was given)."""
        result.status, result.reason = outcome.status, outcome.reason
        if outcome.status != OK:
            return
        by_idx = dict(host)
        shapes = _CallShapes(name, inputs, host)  # once per call: its figures are lazy
        for m in outcome.outputs:
            dev = by_idx[m["idx"]]
            entry = dict(m, dtype=_dtype_name(dev.dtype), shape=list(dev.shape),
                         verdict=None, compute_precision=None)
            if kernel and not judged_live(m):
                entry["not_judged"] = NOT_GIVEN_REASON
            elif dev.numel() > 0:  # compare leaves empty tensors unjudged too
                entry["verdict"], figures = V.judge_local(
                    shapes, m["idx"], entry["dtype"],
                    _finite_or_none(m.get("error_ratio")), self.cfg, self.precision,
                    _finite_or_none(m.get("err_reference")))
                entry.update(figures)
            result.outputs.append(entry)
            if _RANK.get(entry["verdict"], 0) > _RANK.get(result.verdict, 0):
                result.verdict = entry["verdict"]

    def _rerun(self, func: Any, name: str, args: tuple, kwargs: dict,
               inputs: list[torch.Tensor], host: list[tuple[int, torch.Tensor]],
               result: OpResult) -> OpOutcome:
        fn, note = func, ""
        registered = lookup_reference(name)
        if registered is not None:
            fn, note = registered, "registered reference"
        elif name == "aten.native_dropout.default":
            if len(host) < 2:
                raise Unreplayable("rng op (dropout) without its mask output")
            fn, note = dropout_reference(host[1][1]), "rng op checked against its own mask"
        mutable = bool(note) or func._schema.is_mutable
        call = _LiveCall(args, kwargs)

        def build(up: str) -> tuple[list[Any], dict[str, Any]]:
            return build_call(call, inputs, self.device, up, mutable)  # type: ignore[arg-type]

        want = needs_upcast(inputs, [t.dtype for _, t in host],
                             _has_dtype((args, kwargs)), self.upcast)
        scratch = workspace_outputs(name)  # kernel workspaces are not data: never measured
        measured = [(i, t) for i, t in host if i not in scratch]
        with torch._C._DisableTorchDispatch():  # the reference runs below no mode (sim...)
            return rerun(ReferenceCall(result.seq, name, fn, build, note), measured,
                         Reference(self.device, self.upcast, keep=False), want)

    def _check_stacking(self) -> None:
        if self._warned_stack:
            return
        now = _active_sim()
        if now is not None and now is not self._sim:
            self._warned_stack = True
            note = ("a sim(...) was entered inside live_check: the check sees its ops before "
                    "the sim's rounding and faults; enter live_check inside sim(...)")
            self.notes.append(note)
            log.warning(note)

    # -- results ------------------------------------------------------------------------

    def _tally(self, r: OpResult) -> None:
        self.checked += 1
        self._counts[r.verdict if r.verdict else (
            r.status if r.status != OK else "not judged")] += 1
        if r.status != OK:
            self._reasons[r.reason.split(":")[0]] += 1
        if self.keep == "all" or r.status == FAILED or r.verdict in (V.WARNING, V.ERROR):
            self.results.append(r)

    def counts(self) -> dict[str, int]:
        """How many checked calls got each verdict, and how many were skipped or failed."""
        return dict(self._counts)

    def errors(self, level: str = V.ERROR) -> list[OpResult]:
        return [r for r in self.results if _RANK.get(r.verdict, 0) >= _RANK[level]]

    def report(self) -> dict[str, Any]:
        """Per-op figures and verdicts with module and source line, JSON-serialisable."""
        return {
            "reference": str(self.device), "upcast": self.upcast,
            "backend": "sim" if self._sim is not None else "",
            "profile": self._sim.profile_name if self._sim is not None else "",
            "faults_applied": list(self._sim.applied) if self._sim is not None else [],
            "calls": self.calls, "checked": self.checked, "sample": self.sample,
            "step": self.step, "sampled_out": self.sampled_out, "counts": self.counts(),
            "not_checked_reasons": dict(self._reasons), "notes": list(self.notes),
            "compiled_regions": self.compiled.get("compiled_regions", []),
            "errors": [asdict(r) for r in self.errors()],
            "ops": [asdict(r) for r in self.results],
        }

    def write(self, path: str | os.PathLike[str]) -> None:
        """The report as JSON (figures only; non-finite numbers as strings)."""
        with open(path, "w") as f:
            json.dump(jsonable(self.report()), f, indent=1)

    def text(self, top: int = 10) -> str:
        """A short human summary: counts, then the worst ops."""
        sampled = (f" (sample {self.sample:g}: {self.sampled_out} selected calls not "
                   f"checked in this block)" if self.sample < 1.0 else "")
        lines = [f"live check on {self.device} (upcast {self.upcast}): {self.calls} calls, "
                 f"{self.checked} checked{sampled}; " + ", ".join(
                     f"{k} {v}" for k, v in sorted(self.counts().items()))]
        lines[1:1] = [f"  BLIND: {b}" for b in blind_lines(self.compiled)]
        worst = sorted((r for r in self.results if r.verdict in (V.ERROR, V.WARNING)),
                       key=lambda r: -_worst_ratio(r))[:top]
        lines += ["  " + r.describe() for r in worst]
        return "\n".join(lines)


def _worst_ratio(r: OpResult) -> float:
    vals = [o.get("error_ratio") for o in r.outputs if o.get("error_ratio") is not None]
    return max(vals, default=0.0)


def _finite_or_none(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v



def _active_sim() -> Any:
    try:
        from accuracy.device_backend.simulator import active
    except ImportError:
        return None
    return active()


def live_check(on: str = "cpu", **kwargs: Any) -> LiveCheck:
    """`with accuracy.live_check(on="cpu", stop_on="error") as chk: step()`; see LiveCheck."""
    return LiveCheck(on, **kwargs)
