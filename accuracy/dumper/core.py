"""`dumper(...)`: record every ATen op run inside a `with` block into one HDF5 dump.

A TorchDispatchMode sees each op after autograd, in forward, backward and optimizer alike.
The dispatch loop (`_on_op`) builds an `OpCall` per op it watches and hands it to its
observers (accuracy/dumper/opcall.py): the golden feeder (load mode), then the recorder, or
the overflow watcher instead of the recorder. Everything written goes through
`Recorder.write`; HDF5 work happens on the writer's background thread.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

import accuracy
from accuracy import hops
from accuracy.aten import OpPlan, plan_of
from accuracy.compiled.inductor import _running_extern
from accuracy.dumper import collectives, guide_args
from accuracy.dumper.filters import Filter, Selection
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.opcall import Observer, OpCall
from accuracy.dumper.quant_observer import QuantFigures
from accuracy.dumper.recorder import Recorder
from accuracy.dumper.scope import BACKWARD, FORWARD, OPTIMIZER, Scope
from accuracy.dumper.source import _internal, user_source
from accuracy.dumper.subclass_watch import SubclassWatch
from accuracy.dumpfile import schema
from accuracy.dumpfile.writer import DumpWriteError, DumpWriter
from accuracy.errors import RaisedForTheUser
from accuracy.steps import Schedule

log = logging.getLogger(__name__)

MODES = ("tensor", "statistics")
# Raised by an observer on purpose, for the user: overflow_raise=True, strict=True
_DELIBERATE = RaisedForTheUser
_INFRA_MODES = tuple(getattr(torch._C._TorchDispatchModeKey, k) for k in ("FAKE", "PROXY")
                     if hasattr(torch._C._TorchDispatchModeKey, k))


def _compile_machinery(args: tuple[Any, ...]) -> bool:
    """Whether a call is compile machinery's, not the step's: tracing under a fake or proxy
    mode, or on fake tensors (DDP's graph splitter runs the user's layers on fake parameters
    while our mode is still on the stack). Such calls compute nothing real: not recorded."""
    if any(torch._C._get_dispatch_mode(k) is not None for k in _INFRA_MODES):
        return True
    return any(isinstance(a, FakeTensor) for a in args)


def _rank() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _active_sim():
    try:
        from accuracy.device_backend import sim as sim_mod
    except ImportError:
        return None
    active = getattr(sim_mod, "active", None)
    return active() if active is not None else None


class _DumpMode(TorchDispatchMode):
    def __init__(self, owner: dumper) -> None:
        super().__init__()
        # torch wraps __torch_dispatch__ with _disable_dynamo, which imports torch._dynamo
        # (about 2 s) at the first op: pay it here, at the dumper's start, not inside the step.
        import torch._dynamo  # noqa: F401
        self.owner = owner

    supports_higher_order_operators = True  # FlexAttention, torch.cond...: accuracy/hops.py

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if hops.is_hop(func):  # its ATen ops come back here one by one
            return hops.run(self, func, args, kwargs, self.owner._hop_not_seen)
        return self.owner._on_op(func, args, kwargs)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while dynamo/Inductor compile, on while compiled code runs: compiled regions
        run compiled under the dumper (accuracy/compiled/ records their kernels)."""
        return True


class dumper:  # noqa: N801 - a context manager named like Ascend's torch.utils.dumper
    """Record the ATen ops of the enclosed block into `dump_path` (HDF5).

    mode: "tensor" stores every tensor plus statistics; "statistics" stores statistics only.
    ops / exclude_ops / modules: glob patterns (`aten.mm`, `aten.*norm*`, `encoder.layers.0.*`).
    data_mode: "all", or any of "input", "output", "forward", "backward", "optimizer".
    steps: step numbers to record when the block spans several steps (advance with `step()`):
    an int, a list with msprobe's ranges ([0, "10-20"], kept ranges) or a `range`, or
    `accuracy.schedule(wait=, warmup=, active=, repeat=, skip_first=)`; on other steps no
    dispatch mode is installed.
    stack: also store each op's full user stack. overwrite: replace an existing file.
    strict: raise if writing fails (disk full...) instead of carrying on without the dump.
    max_pending_bytes: memory allowed for tensors waiting for the disk before training waits.
    check_overflow: record only ops that turn finite inputs into inf/nan (see docs/overflow.md);
    overflow_nums: stop after that many (-1: all); overflow_raise: raise OverflowDetected at
    the first; saturation: also flag values near the float16/bfloat16 limit.
    load_file_path: a golden tensor dump (or an `accuracy extract` file of some of its ops);
    each op with the same name and seq computes on its recorded inputs (load mode, see
    docs/replay.md); '' or None: no load.
    Ascend's guide keywords (accuracy/dumper/guide_args.py): use_dump=False records nothing;
    use_load=True asks for load mode on load_file_path; a folder dump_path gets
    `dump_{rank}.h5` inside; load_with_acl_dump=True is refused (Ascend ACL only).
    ranks: the ranks that record (e.g. [0, 3]); the others record nothing and write no file.
    select: a file from `accuracy suspects`: record only those ops, under their first-run seq
    numbers (the two-tier flow, see docs/cluster.md).
    """

    def __init__(
        self,
        dump_path: str | os.PathLike[str] | None = None,
        mode: str = "tensor",
        *,
        ops: str | Iterable[str] | None = None,
        exclude_ops: str | Iterable[str] | None = None,
        modules: str | Iterable[str] | None = None,
        data_mode: str | Iterable[str] = "all",
        steps: int | Iterable[int | str] | Schedule | None = None,
        stack: bool = False,
        overwrite: bool = False,
        strict: bool = False,
        max_pending_bytes: int = 1 << 30,
        flush_ops: int = 1024,
        flush_seconds: float = 1.0,
        check_overflow: bool = False,
        overflow_nums: int = 1,
        overflow_raise: bool = False,
        saturation: Any = None,
        load_file_path: str | os.PathLike[str] | None = None,
        use_dump: bool = True,
        use_load: bool | None = None,
        load_with_acl_dump: bool = False,
        ranks: int | Iterable[int] | None = None,
        select: str | os.PathLike[str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.rank, self.world_size = _rank()
        plan = guide_args.resolve(dump_path, self.rank, use_dump=use_dump, use_load=use_load,
                                  load_file_path=load_file_path,
                                  load_with_acl_dump=load_with_acl_dump,
                                  check_overflow=check_overflow)
        self.active = plan.active  # False: use_dump=False with nothing to load or check
        self.path = plan.path
        load_file_path = plan.load_file_path
        self.ranks = None if ranks is None else sorted({ranks} if isinstance(ranks, int)
                                                       else {int(r) for r in ranks})
        if self.ranks is not None and self.rank not in self.ranks:
            self.active = False  # a rank outside `ranks=`: no file, no interception
        self.mode = mode
        self.filter = Filter.build(ops, exclude_ops, modules, data_mode, steps)
        self.select = Selection.load(select) if select is not None else None
        self.stack = stack
        self.overwrite = overwrite
        self.strict = strict
        self.max_pending_bytes = max_pending_bytes
        self.flush_ops = flush_ops
        self.flush_seconds = flush_seconds
        self.load_file_path = load_file_path
        self._loader = None
        self.current_step = 0
        self._seq = 0
        self._writer: DumpWriter | None = None
        self._recorder: Recorder | None = None
        self._observers: tuple[Observer, ...] = ()
        self._failed_ops: dict[str, Any] = {}  # ops an observer failed on: count, first error
        self._hops_not_seen: dict[str, int] = {}  # higher-order ops run without their ops seen
        f = self.filter
        # no filter at all: the loop skips the per-op checks
        self._everything = (not (f.ops or f.exclude_ops or f.modules) and f.steps is None
                            and f.phases == Filter().phases and self.select is None)
        self._op_wanted: dict[str, bool] = {}
        self._overflow = None
        if check_overflow:  # record only the ops where inf/nan is born
            from accuracy.dumper.overflow_watch import OverflowChecker
            self._overflow = OverflowChecker(overflow_nums, overflow_raise, saturation)

    # -- public ----------------------------------------------------------------------------

    def step(self) -> None:
        """Mark the end of a training step (for the `steps` window). Between recorded steps
        no dispatch mode is installed: an unselected step runs at the bare speed."""
        self.current_step += 1
        if self._writer is not None and self._idle_allowed:
            self._set_installed(self.filter.wants_step(self.current_step))

    def __enter__(self) -> dumper:
        if not self.active:  # use_dump=False, or a rank outside `ranks=`: no file
            if self.ranks is not None and self.rank not in self.ranks:
                log.info("rank %d is not in ranks=%s: not recording", self.rank, self.ranks)
            return self
        self._sim = _active_sim()
        self._coll = collectives.Collectives()
        if self.load_file_path is not None:  # load mode: feed golden inputs
            from accuracy.dumper.golden_feed import GoldenFeeder
            self._loader = GoldenFeeder(self.load_file_path)
        self._writer = DumpWriter(
            self.path,
            self._start_attrs(),
            overwrite=self.overwrite,
            flush_ops=self.flush_ops,
            flush_seconds=self.flush_seconds,
            max_pending_bytes=self.max_pending_bytes,
        )
        self._recorder = Recorder(self._writer, self.mode, self.filter.io, self._coll,
                                  sim=self._sim, strict=self.strict,
                                  # it sees every op of a recorded step, so it can wait
                                  # before each write (idle steps wait on leaving)
                                  defer_stats=self._sees_every_op())
        observers: list[Observer] = [] if self._loader is None else [self._loader]
        observers.append(QuantFigures())  # before the recorder: fills extra["quant"]
        observers.append(SubclassWatch())  # tensor subclasses it cannot see into: said first
        if self._overflow is not None:  # records only births, through the recorder
            self._overflow.attach(self._recorder, str(self.path))
            observers.append(self._overflow)
        else:
            observers.append(self._recorder)
        self._observers = tuple(observers)
        self._mode = _DumpMode(self)
        # load and select mode match ops by their seq, which counts every op of every step:
        # they keep the mode installed; otherwise it is off on the steps the window skips
        self._idle_allowed = self._loader is None and self.select is None
        self._set_installed(not self._idle_allowed or self.filter.wants_step(self.current_step))
        from accuracy.compiled.watch import watch_dumper  # compiled regions: never blind
        self._compiled = watch_dumper(self)
        log.info("dumping %s mode to %s", self.mode, self.path)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.active:
            return False
        try:
            self._set_installed(False, (exc_type, exc, tb))
        finally:
            self._close(complete=exc_type is None)
        return False

    _installed = False
    _idle_allowed = True

    def _sees_every_op(self) -> bool:
        """Whether the recorder is shown every op while the mode is installed (no op, module
        or phase filter, no select/load/overflow mode)."""
        f = self.filter
        return (not (f.ops or f.exclude_ops or f.modules) and f.phases == Filter().phases
                and self.select is None and self._loader is None and self._overflow is None)

    def _set_installed(self, on: bool, exit_info: tuple[Any, Any, Any] | None = None) -> None:
        """Install the dispatch mode and module scope for a recorded step, or take them off
        for an idle one. Taken off only when ours is the innermost mode (another mode entered
        inside the block stays, and ours with it: recording then goes on, said once)."""
        if on == self._installed:
            return
        if on:
            self._scope = Scope().__enter__()
            self._recorder.tensor_name = self._scope.optimizer_tensor_name
            self._mode.__enter__()
            self._installed = True
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if exit_info is None and _get_current_dispatch_mode() is not self._mode:  # idle step
            log.warning("another dispatch mode was entered inside the dumper's block: the "
                        "dumper stays installed on idle steps (slower, records nothing more)")
            self._idle_allowed = False
            return
        self._installed = False
        self._recorder.drain()  # unwatched ops follow: no statistics may still be pending
        exit_info = exit_info or (None, None, None)
        try:
            self._mode.__exit__(*exit_info)
        finally:
            self._scope.__exit__(*exit_info)

    # -- internals -------------------------------------------------------------------------

    def _start_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "mode": self.mode,
            **({schema.SUMS_ATTR: schema.SUMS_OMITTED} if self.mode == "tensor" else {}),
            "rank": self.rank,
            "world_size": self.world_size,
            "torch_version": torch.__version__,
            "accuracy_version": accuracy.__version__,
            "python_version": platform.python_version(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            **collectives.process_group_attrs(),
            "ranks_recorded": self.ranks if self.ranks is not None else "all",
            "check_overflow": self._overflow is not None,
            "select": self.select.source if self.select is not None else "",
            "filter": {
                "ops": list(self.filter.ops), "exclude_ops": list(self.filter.exclude_ops),
                "modules": list(self.filter.modules), "io": sorted(self.filter.io),
                "phases": sorted(self.filter.phases),
                "steps": None if self.filter.steps is None else self.filter.steps.describe(),
            },
        }
        if self._sim is not None:
            attrs["backend"] = "sim"
            attrs["profile"] = self._sim.profile_name
            attrs["sim"] = self._sim.describe()
        return attrs

    def _observe(self, call: OpCall, outputs: list[torch.Tensor] | None) -> bool:
        """Every observer's `before` (outputs None) or `after`. An error of ours is logged
        and counted, the op left unrecorded, and the step goes on: the user's training
        never dies because of the dumper (only the errors raised for the user pass)."""
        try:
            for o in self._observers:
                if outputs is None:
                    o.before(call)
                else:
                    o.after(call, outputs)
            return True
        except _DELIBERATE:
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            failed = self._failed_ops
            if not failed:
                log.warning("the dumper failed on %s (seq %d), which is left unrecorded; the "
                            "step goes on (further failures are counted in the dump)",
                            call.plan.name, call.seq, exc_info=True)
                failed.update(count=0, first=f"{call.plan.name} seq {call.seq}: "
                              f"{type(e).__name__}: {str(e)[:200]}")
            failed["count"] += 1
            return False

    def _hop_not_seen(self, name: str) -> None:
        """A higher-order op ran with no implementation our mode can run inside: its ATen
        ops are not in the dump (said first by every reader: dumpfile/compiled.py)."""
        if name not in self._hops_not_seen:
            log.warning("higher-order op %s has no eager implementation the dumper can run "
                        "inside: it runs unrecorded (said in the dump)", name)
        self._hops_not_seen[name] = self._hops_not_seen.get(name, 0) + 1

    @property
    def ops_recorded(self) -> int:
        """Ops written to the dump so far."""
        return self._recorder.ops_recorded if self._recorder is not None else 0

    def _close(self, complete: bool) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        attrs: dict[str, Any] = {}
        try:
            attrs.update(self._compiled.finish())  # which compiled regions ran, and how
            for o in self._observers:  # the overflow watcher still writes its pending births
                attrs.update(o.finish())
        finally:
            if self._loader is not None:
                attrs["load_file_path"] = str(self.load_file_path)
                self._loader.close()
                self._loader = None
        rec = self._recorder
        attrs = {"ops_recorded": rec.ops_recorded, "ops_seen": self._seq,
                 "steps": sorted(rec.steps_seen), **self._backend_attrs(), **self._coll.attrs(),
                 **attrs}
        if self._sim is not None:
            attrs["faults_applied"] = list(self._sim.applied)
        if self._failed_ops:
            attrs["ops_not_recorded"] = dict(self._failed_ops)
        if self._hops_not_seen:
            attrs["higher_order_ops_not_recorded"] = dict(self._hops_not_seen)
        try:
            writer.close(attrs, complete=complete and not rec.failed)
        except DumpWriteError as e:
            if self.strict:
                raise
            log.error("%s; the dump is incomplete", e)
        if not complete:
            log.warning("the block raised: %s is closed and marked incomplete", self.path)

    def _backend_attrs(self) -> dict[str, Any]:
        if self._sim is not None:
            return {}
        devices = sorted(self._recorder.devices - {"cpu"}) or ["cpu"]
        try:
            from accuracy.device_backend import get_backend
        except ImportError:
            return {"backend": devices[0], "backend_version": "", "devices": devices}
        backend = get_backend(devices[0])
        return {"backend": backend.name, "backend_version": backend.version() or "",
                "devices": devices}

    def _wants(self, plan: OpPlan, seq: int, phase: str, module: str) -> bool:
        f = self.filter
        wanted = self._op_wanted.get(plan.name)
        if wanted is None:
            wanted = self._op_wanted[plan.name] = f.wants_op(plan.name)
        return (wanted and f.wants_step(self.current_step) and phase in f.phases
                and f.wants_module(module)
                and (self.select is None or self.select.wants(seq, plan.name)))

    def _on_op(self, func, args, kwargs):
        """The dispatch loop: one OpCall, every observer's before/after around the op."""
        if _compile_machinery(args):
            return func(*args, **kwargs)
        plan = plan_of(func)
        seq = self._seq
        self._seq += 1
        scope = self._scope
        coll = self._coll
        coll.current = coll.epoch  # the op's collective epoch
        if plan.collective is not None and plan.collective != "wait":
            coll.epoch += 1
        scope.tag_pending()
        fwd_seq = -1
        if torch._C._current_graph_task_id() != -1:  # backward: the node tells everything
            phase = BACKWARD
            origin = scope.backward_origin()
            if origin is not None:
                module, fwd_seq, source = origin
                stack = ""
            else:
                module = ""
                source, stack = user_source(self.stack)
        else:
            phase, module = scope.op_phase(plan), scope.module
            if phase == OPTIMIZER:  # optimizer rows name the parameter they update
                module = scope.optimizer_param(args, kwargs) or module
            source, stack = user_source(self.stack)
        watch = getattr(self, "_compiled", None)
        if watch is not None and getattr(watch, "aten_graphs", False):
            # an op of an aot_eager/eager compiled graph: its FX node's module and line
            site = watch.source.graph_site(phase == BACKWARD, sys._getframe(1), _internal)
            if site is not None:
                module, source = site[0], site[1] or source
                fwd_seq = -1
        if _running_extern[0]:  # an Inductor extern kernel call: its FX node's module
            src = getattr(watch, "source", None)
            site = src.extern_site(phase == BACKWARD) if src is not None else None
            if site is not None:
                module, source = site[0], site[1] or source
        rec = self._recorder
        if rec is None or rec.failed or not (self._everything or self._wants(plan, seq, phase,
                                                                              module)):
            out = func(*args, **kwargs)
            if plan.collective is not None and rec is not None:
                # it wrote its tensors, version unchanged
                for t in tensors_in(kwargs, tensors_in(args)):
                    rec.seen.forget_aliases(t)
            if rec is not None and (plan.uninitialised or rec.uninit):  # unrecorded fills too
                rec.track(plan, args, kwargs, tensors_in(kwargs, tensors_in(args)),
                          tensors_in(out))
            outputs = None
        else:
            call = OpCall(func, plan, seq, phase, module, source, stack, self.current_step,
                          coll.current, args, kwargs, tensors_in(kwargs, tensors_in(args)),
                          fwd_seq)
            observed = self._observe(call, None)
            out = func(*call.args, **call.kwargs)
            if plan.collective is not None:  # waited: the outputs hold the collective's result
                call.collective = coll.settle(plan.collective, func, call.args, call.kwargs, out)
            outputs = tensors_in(out)
            if observed:
                self._observe(call, outputs)
        if phase == FORWARD:
            scope.forward_outputs(tensors_in(out) if outputs is None else outputs,
                                  (module, seq, source))
        return out
