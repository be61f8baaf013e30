"""`dumper(...)`: record every ATen op run inside a `with` block into one HDF5 dump.

The dumper runs the one loop (accuracy/dumper/loop.py): its TorchDispatchMode sees each op
after autograd, in forward, backward and optimizer alike, and the Inductor launch hook
(accuracy/dumper/compiled/) hands it each compiled kernel's launch. Every call is placed
(phase, module, source line, step, rank) and shown to the observers, in order: the collective
and memory watchers (every call), the golden feeder (load mode), the optimizer namer, the
quant and subclass watchers, the user's own (`dumper.observe`), then the recorder, or the
overflow watcher instead of the recorder. Everything written goes through `Recorder.write`;
HDF5 work happens on the writer's background thread.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
from collections.abc import Iterable
from typing import Any

import torch

import accuracy
from accuracy.dumper import collectives, guide_args
from accuracy.dumper.calls import Call, Observer
from accuracy.dumper.filters import Filter, SuspectSelection
from accuracy.dumper.loop import Loop, current_rank
from accuracy.dumper.optimizer_names import OptimizerNames
from accuracy.dumper.p2p import P2PWatch
from accuracy.dumper.quant_observer import QuantFigures
from accuracy.dumper.recorder import Recorder
from accuracy.dumper.sites import Sites
from accuracy.dumper.subclass_watch import SubclassWatch
from accuracy.dumper.uninit import MemoryWatch
from accuracy.dumpfile import schema
from accuracy.dumpfile.writer import DumpWriteError, DumpWriter
from accuracy.steps import Schedule

log = logging.getLogger(__name__)

MODES = ("tensor", "statistics")


def _active_sim():
    try:
        from accuracy.device_backend import sim as sim_mod
    except ImportError:
        return None
    active = getattr(sim_mod, "active", None)
    return active() if active is not None else None


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

    `observe(observer)` shows your own observer (`before(call)`, `after(call, outputs)`,
    `finish()`: see accuracy/dumper/calls.py) every call the dumper records: eager ops and
    compiled kernel launches alike, each with its `site` (seq, op, phase, module, source,
    step, rank).
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
        self.rank, self.world_size = current_rank()
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
        self.select = SuspectSelection.load(select) if select is not None else None
        self.stack = stack
        self.overwrite = overwrite
        self.strict = strict
        self.max_pending_bytes = max_pending_bytes
        self.flush_ops = flush_ops
        self.flush_seconds = flush_seconds
        self.load_file_path = load_file_path
        self._loader = None
        self._step = 0
        self._writer: DumpWriter | None = None
        self._recorder: Recorder | None = None
        self._loop: Loop | None = None
        self._compiled: Any = None  # the compiled-region watch (dumper/compiled/watch.py)
        self._user_observers: list[Observer] = []
        self._overflow = None
        if check_overflow:  # record only the ops where inf/nan is born
            from accuracy.dumper.overflow_watch import OverflowChecker
            self._overflow = OverflowChecker(overflow_nums, overflow_raise, saturation)

    # -- public ----------------------------------------------------------------------------

    @property
    def current_step(self) -> int:
        """The step being run (for the `steps` window; a driver may set it)."""
        return self._step

    @current_step.setter
    def current_step(self, step: int) -> None:
        self._step = step
        if self._loop is not None:
            self._loop.sites.step = step

    @property
    def loop(self) -> Loop | None:
        """The dumper's loop (None before the block, or when the dumper is inactive)."""
        return self._loop

    def observe(self, observer: Observer) -> Observer:
        """Show `observer` every call the dumper records (see the class docstring). Given
        before the block, it comes before the recorder, so what its `before`/`after` put in
        `call.extra` is written with the row; given inside, it sees the calls from then on."""
        if self._loop is not None:
            self._loop.observe(observer)
        else:
            self._user_observers.append(observer)
        return observer

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
        memory = MemoryWatch()
        self._recorder = rec = Recorder(self._writer, self.mode, self.filter.io,
                                        memory=memory.memory, sim=self._sim,
                                        strict=self.strict,
                                        # it sees every op of a recorded step, so it can wait
                                        # before each write (idle steps wait on leaving)
                                        defer_stats=self._sees_every_op())
        sites = Sites(stack=self.stack, rank=self.rank, step=self.current_step)
        self._loop = loop = Loop(sites, compiled=True, wants=self._wants_of(rec))
        # every call, recorded or not: epochs and collectives' writes, unfilled memory
        loop.observe(collectives.CollectiveWatch(collectives.Collectives(), rec.seen),
                     every_call=True)
        # receives written once they arrived (the overflow check writes births only)
        loop.observe(P2PWatch(rec if self._overflow is None else None), every_call=True)
        loop.observe(memory, every_call=True)
        if self._loader is not None:
            loop.observe(self._loader)
        # before the recorder: what these put in call.extra is written
        loop.observe(OptimizerNames(sites.optimizer_tensor_name, sites.optimizer_state))
        loop.observe(QuantFigures())
        loop.observe(SubclassWatch())  # tensor subclasses it cannot see into: said first
        for o in self._user_observers:
            loop.observe(o)
        if self._overflow is not None:  # records only births, through the recorder
            self._overflow.attach(rec, str(self.path))
            loop.observe(self._overflow)
        else:
            loop.observe(rec)
        # load and select mode match ops by their seq, which counts every op of every step:
        # they keep the mode installed; otherwise it is off on the steps the window skips
        self._idle_allowed = self._loader is None and self.select is None
        self._set_installed(not self._idle_allowed or self.filter.wants_step(self.current_step))
        from accuracy.dumper.compiled.watch import watch_dumper  # compiled regions: never blind
        self._compiled = watch_dumper(loop, rec.seen, self._recording)
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
        loop = self._loop
        if on == self._installed:
            return
        if on:
            loop.install()
            self._installed = True
            return
        if exit_info is None and not loop.is_innermost():  # idle step
            log.warning("another dispatch mode was entered inside the dumper's block: the "
                        "dumper stays installed on idle steps (slower, records nothing more)")
            self._idle_allowed = False
            return
        self._installed = False
        self._recorder.drain()  # unwatched ops follow: no statistics may still be pending
        self._recorder.close_window()  # the step's last figures fetched, not held idle
        loop.uninstall(*(exit_info or (None, None, None)))

    # -- internals -------------------------------------------------------------------------

    def _start_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            schema.ROOT_MODE: self.mode,
            **({schema.SUMS_ATTR: schema.SUMS_OMITTED} if self.mode == "tensor" else {}),
            schema.ROOT_RANK: self.rank,
            schema.ROOT_WORLD_SIZE: self.world_size,
            schema.ROOT_TORCH_VERSION: torch.__version__,
            schema.ROOT_ACCURACY_VERSION: accuracy.__version__,
            schema.ROOT_PYTHON_VERSION: platform.python_version(),
            schema.ROOT_CREATED: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            schema.ROOT_HOST: platform.node(),
            **collectives.process_group_attrs(),
            schema.ROOT_RANKS_RECORDED: self.ranks if self.ranks is not None else "all",
            schema.ROOT_CHECK_OVERFLOW: self._overflow is not None,
            schema.ROOT_SELECT: self.select.source if self.select is not None else "",
            schema.ROOT_FILTER: {
                "ops": list(self.filter.ops), "exclude_ops": list(self.filter.exclude_ops),
                "modules": list(self.filter.modules), "io": sorted(self.filter.io),
                "phases": sorted(self.filter.phases),
                "steps": None if self.filter.steps is None else self.filter.steps.describe(),
            },
        }
        if self._sim is not None:
            attrs[schema.ROOT_BACKEND] = "sim"
            attrs[schema.ROOT_PROFILE] = self._sim.profile_name
            attrs[schema.ROOT_SIM] = self._sim.describe()
        return attrs

    @property
    def ops_recorded(self) -> int:
        """Ops written to the dump so far."""
        return self._recorder.ops_recorded if self._recorder is not None else 0

    def _close(self, complete: bool) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        attrs: dict[str, Any] = {}
        loop = self._loop
        try:
            attrs.update(self._compiled.finish())  # which compiled regions ran, and how
            # every observer's: the overflow watcher still writes its pending births
            attrs.update(loop.finish())
        finally:
            self._recorder.close_window()  # the writer waits for the last window's figures
            if self._loader is not None:
                attrs[schema.ROOT_LOAD_FILE_PATH] = str(self.load_file_path)
                self._loader.close()
                self._loader = None
        rec = self._recorder
        attrs = {schema.ROOT_OPS_RECORDED: rec.ops_recorded, schema.ROOT_OPS_SEEN: loop.seq,
                 schema.ROOT_STEPS: sorted(rec.steps_seen), **self._backend_attrs(), **attrs}
        if self._sim is not None:
            attrs[schema.ROOT_FAULTS_APPLIED] = list(self._sim.applied)
        if loop.failed:
            attrs[schema.ROOT_OPS_NOT_RECORDED] = dict(loop.failed)
        if loop.hops_not_seen:
            attrs[schema.ROOT_HOPS_NOT_RECORDED] = dict(loop.hops_not_seen)
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
            return {schema.ROOT_BACKEND: devices[0], schema.ROOT_BACKEND_VERSION: "",
                    schema.ROOT_DEVICES: devices}
        backend = get_backend(devices[0])
        return {schema.ROOT_BACKEND: backend.name,
                schema.ROOT_BACKEND_VERSION: backend.version() or "",
                schema.ROOT_DEVICES: devices}

    def _recording(self) -> bool:
        """Whether compiled kernels launched now are recorded: the loop is on, the step is
        one the dumper records (load and select modes keep the mode on every step: their
        seqs count every op), and the writer has not failed."""
        rec = self._recorder
        return (rec is not None and not rec.failed and self._loop.is_on()
                and self.filter.wants_step(self.current_step))

    def _wants_of(self, rec: Recorder) -> Any:
        """The loop's filter: which calls its observers are shown (kernel launches always:
        the compiled source asks `_recording` before it emits one)."""
        f = self.filter
        select = self.select
        if (not (f.ops or f.exclude_ops or f.modules) and f.steps is None
                and f.phases == Filter().phases and select is None):  # no filter at all
            return lambda call: not rec.failed
        wanted_ops: dict[str, bool] = {}

        def wants(call: Call) -> bool:
            if rec.failed:
                return False
            if call.func is None:  # a kernel launch
                return True
            site = call.site
            name = site.op
            wanted = wanted_ops.get(name)
            if wanted is None:
                wanted = wanted_ops[name] = f.wants_op(name)
            return (wanted and f.wants_step(site.step) and site.phase in f.phases
                    and f.wants_module(site.module)
                    and (select is None or select.wants(site.seq, name)))
        return wants
