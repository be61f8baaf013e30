"""`dumper(...)`: record every ATen op run inside a `with` block into one HDF5 dump.

A TorchDispatchMode sees each op after autograd, in forward, backward and optimizer alike.
Inputs are captured before the op runs (so in-place ops keep their pre-op values), outputs
after. Each distinct tensor state (object identity plus `_version`) is stored once; later
uses point at those bytes. HDF5 work happens on the writer's background thread.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import accuracy
from accuracy.dumper import collectives, guide_args
from accuracy.dumper.filters import Filter, Selection
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.scope import BACKWARD, FORWARD, OPTIMIZER, Scope
from accuracy.dumper.source import user_source
from accuracy.dumper.stats import tensor_stats
from accuracy.dumpfile import schema
from accuracy.dumpfile.argcodec import encode_call
from accuracy.dumpfile.writer import DumpWriteError, DumpWriter, OpEntry, TensorEntry

log = logging.getLogger(__name__)

MODES = ("tensor", "statistics")
# Outputs of these are uninitialised memory: never stored, never compared.
UNINITIALISED = {
    "aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
    "aten.new_empty.default", "aten.new_empty_strided.default", "aten.empty.out",
}


# Views whose output, when it shares the input's memory from the same offset, holds exactly
# the input's elements: same statistics, no new computation. (Memory is checked each time: a
# device or a sim fault may return fresh data from a "view".)
SAME_ELEMENTS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.detach.default", "aten.alias.default", "aten.t.default", "aten.transpose.int",
    "aten.permute.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.unsqueeze.default", "aten.flatten.using_ints", "aten._reshape_alias.default",
    "aten.lift_fresh.default",
}
# ...and of these, a contiguous output also has the input's bytes in the same order.
SAME_BYTES = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.detach.default", "aten.alias.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.unsqueeze.default", "aten.flatten.using_ints",
    "aten._reshape_alias.default", "aten.lift_fresh.default",
}


def _rank() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _host_copy(t: torch.Tensor):
    """A private contiguous CPU copy, through the tensor's backend (async on devices)."""
    try:
        from accuracy.device_backend import backend_for_tensor
    except ImportError:  # backends not importable: a plain synchronous copy still works
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu")
        out.copy_(t)
        return out
    return backend_for_tensor(t).to_host(t)


def _active_sim():
    try:
        from accuracy.device_backend import sim as sim_mod
    except ImportError:
        return None
    active = getattr(sim_mod, "active", None)
    return active() if active is not None else None


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` views the memory of `b` from the same element (strides may differ)."""
    try:
        return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                and a.storage_offset() == b.storage_offset() and a.dtype == b.dtype)
    except (RuntimeError, NotImplementedError):
        return False


def _entry_dtype(entry: TensorEntry) -> torch.dtype:
    return getattr(torch, entry.dtype)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _contiguous(entry: TensorEntry) -> bool:
    """Whether a recorded shape/stride pair is row-major contiguous."""
    expected = 1
    for size, stride in zip(reversed(entry.shape), reversed(entry.stride), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


class _Seen:
    """Tensor states already recorded: id -> (weakref, _version, row, stats, storage)."""

    def __init__(self) -> None:
        self._map: dict[int, tuple[weakref.ref, int, int, Any, int]] = {}

    def lookup(self, t: torch.Tensor) -> tuple[int, Any] | None:
        hit = self._map.get(id(t))
        if hit is None:
            return None
        ref, version, row, stats, _ = hit
        if ref() is not t:
            return None
        try:
            if t._version != version:
                return None
        except RuntimeError:  # inference tensors have no version counter
            return None
        return row, stats

    def forget(self, t: torch.Tensor) -> None:
        self._map.pop(id(t), None)

    def forget_aliases(self, t: torch.Tensor) -> None:
        """Forget every recorded tensor sharing `t`'s memory: for writers that bump no version
        counter (collectives, custom ops), views and bases of what they wrote are stale too."""
        self.forget(t)
        ptr = _storage_ptr(t)
        if ptr:
            for key in [k for k, v in self._map.items() if v[4] == ptr]:
                del self._map[key]

    def remember(self, t: torch.Tensor, row: int, stats: Any) -> None:
        try:
            version = t._version
            ref = weakref.ref(t)
        except (RuntimeError, TypeError):
            return
        self._map[id(t)] = (ref, version, row, stats, _storage_ptr(t))


class _DumpMode(TorchDispatchMode):
    def __init__(self, owner: dumper) -> None:
        super().__init__()
        # torch wraps __torch_dispatch__ with _disable_dynamo, which imports torch._dynamo
        # (about 2 s) at the first op: pay it here, at the dumper's start, not inside the step.
        import torch._dynamo  # noqa: F401
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        return self.owner._on_op(func, args, kwargs)


class dumper:  # noqa: N801 - a context manager named like Ascend's torch.utils.dumper
    """Record the ATen ops of the enclosed block into `dump_path` (HDF5).

    mode: "tensor" stores every tensor plus statistics; "statistics" stores statistics only.
    ops / exclude_ops / modules: glob patterns (`aten.mm`, `aten.*norm*`, `encoder.layers.0.*`).
    data_mode: "all", or any of "input", "output", "forward", "backward", "optimizer".
    steps: step numbers to record when the block spans several steps (advance with `step()`).
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
        steps: int | Iterable[int] | None = None,
        stack: bool = False,
        overwrite: bool = False,
        strict: bool = False,
        max_pending_bytes: int = 1 << 30,
        flush_ops: int = 256,
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
        self.ops_recorded = 0
        self._seq = 0
        self._names: dict[Any, str] = {}
        self._devices: set[str] = set()
        self._steps_seen: set[int] = set()
        self._writer: DumpWriter | None = None
        self._failed = False
        self._overflow = None
        if check_overflow:  # record only the ops where inf/nan is born (accuracy.overflow)
            from accuracy.overflow.online import OverflowChecker
            self._overflow = OverflowChecker(overflow_nums, overflow_raise, saturation)

    # -- public ----------------------------------------------------------------------------

    def step(self) -> None:
        """Mark the end of a training step (for the `steps` window)."""
        self.current_step += 1

    def __enter__(self) -> dumper:
        if not self.active:  # use_dump=False, or a rank outside `ranks=`: no file
            if self.ranks is not None and self.rank not in self.ranks:
                log.info("rank %d is not in ranks=%s: not recording", self.rank, self.ranks)
            return self
        self._sim = _active_sim()
        self._coll = collectives.Collectives()
        if self.load_file_path is not None:  # load mode: feed golden inputs (accuracy.replay)
            from accuracy.replay.load_mode import GoldenFeeder
            self._loader = GoldenFeeder(self.load_file_path)
        self._writer = DumpWriter(
            self.path,
            self._start_attrs(),
            overwrite=self.overwrite,
            flush_ops=self.flush_ops,
            flush_seconds=self.flush_seconds,
            max_pending_bytes=self.max_pending_bytes,
        )
        self._seen = _Seen()
        self._scope = Scope().__enter__()
        self._mode = _DumpMode(self)
        self._mode.__enter__()
        log.info("dumping %s mode to %s", self.mode, self.path)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.active:
            return False
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            self._scope.__exit__(exc_type, exc, tb)
            self._close(complete=exc_type is None)
        return False

    # -- internals -------------------------------------------------------------------------

    def _start_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "mode": self.mode,
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
                "steps": sorted(self.filter.steps) if self.filter.steps is not None else None,
            },
        }
        if self._sim is not None:
            attrs["backend"] = "sim"
            attrs["profile"] = self._sim.profile_name
            attrs["sim"] = self._sim.describe()
        return attrs

    def _close(self, complete: bool) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        attrs: dict[str, Any] = {"ops_recorded": self.ops_recorded, "ops_seen": self._seq,
                                 "steps": sorted(self._steps_seen)}
        attrs.update(self._backend_attrs())
        attrs.update(self._coll.attrs())
        if self._overflow is not None:
            attrs.update(self._overflow.finish(self, writer))
        if self._sim is not None:
            attrs["faults_applied"] = list(self._sim.applied)
        if self._loader is not None:
            attrs.update(load_file_path=str(self.load_file_path), ops_loaded=self._loader.fed)
            self._loader.close()
            self._loader = None
        try:
            writer.close(attrs, complete=complete and not self._failed)
        except DumpWriteError as e:
            if self.strict:
                raise
            log.error("%s; the dump is incomplete", e)
        if not complete:
            log.warning("the block raised: %s is closed and marked incomplete", self.path)

    def _backend_attrs(self) -> dict[str, Any]:
        if self._sim is not None:
            return {}
        devices = sorted(self._devices - {"cpu"}) or ["cpu"]
        try:
            from accuracy.device_backend import get_backend
        except ImportError:
            return {"backend": devices[0], "backend_version": "", "devices": devices}
        backend = get_backend(devices[0])
        return {"backend": backend.name, "backend_version": backend.version() or "",
                "devices": devices}

    def _op_name(self, func) -> str:
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = str(func)
        return name

    def _on_op(self, func, args, kwargs):
        seq = self._seq
        self._seq += 1
        scope = self._scope
        self._coll.enter(func)  # the op's collective epoch
        scope.tag_pending()
        if torch._C._current_graph_task_id() != -1:  # backward: the node tells everything
            origin = scope.backward_origin()
            module = origin[0] if origin is not None else ""
            if origin is not None:
                source, stack = origin[2], ""
            else:
                source, stack = user_source(self.stack)
            return self._record(func, args, kwargs, seq, BACKWARD, module, source, stack,
                                origin)[0]
        phase, module = scope.phase, scope.module
        if phase == OPTIMIZER:  # optimizer rows name the parameter they update
            module = scope.optimizer_param(args, kwargs) or module
        source, stack = user_source(self.stack)
        out, out_tensors = self._record(func, args, kwargs, seq, phase, module, source, stack,
                                        None)
        if phase == FORWARD:
            scope.forward_outputs(tensors_in(out) if out_tensors is None else out_tensors,
                                  (module, seq, source))
        return out

    def _record(self, func, args, kwargs, seq, phase, module, source, stack, origin):
        """Run the op, recording it unless filtered; returns (output, its tensors or None)."""
        writer = self._writer
        if writer is None or self._failed:
            return func(*args, **kwargs), None
        f = self.filter
        name = self._op_name(func)
        if not (f.wants_step(self.current_step) and phase in f.phases and f.wants_op(name)
                and f.wants_module(module)
                and (self.select is None or self.select.wants(seq, name))):
            out = func(*args, **kwargs)
            if self._coll.kind(func) is not None:  # it wrote its tensors, version unchanged
                for t in tensors_in(kwargs, tensors_in(args)):
                    self._seen.forget_aliases(t)
            return out, None
        if self._overflow is not None:
            return self._overflow.on_op(self, writer, func, name, args, kwargs, seq, phase,
                                        module, source, stack), None
        loaded = False
        if self._loader is not None:
            args, kwargs, loaded = self._loader.feed(name, seq, func, args, kwargs)

        in_tensors = tensors_in(kwargs, tensors_in(args))
        entries: list[TensorEntry] = []
        with torch._C._DisableTorchDispatch():
            if "input" in f.io:
                for i, t in enumerate(in_tensors):
                    entries.append(self._entry(writer, seq, schema.INPUT, i, t))
        n_faults = len(self._sim.applied) if self._sim is not None else 0
        out = func(*args, **kwargs)
        coll_kind = self._coll.kind(func)
        coll = (self._coll.settle(coll_kind, func, args, kwargs, out) if coll_kind is not None
                else None)  # waited: the outputs hold the collective's result
        out_tensors = tensors_in(out)
        uninit = name in UNINITIALISED
        mutable = func._schema.is_mutable or coll is not None
        if mutable:
            # Some kernels write an argument without bumping its version counter (GradScaler's
            # found_inf): never trust an earlier record of a tensor a mutable op received.
            for t in in_tensors:
                self._seen.forget(t)
            if coll is not None or func.namespace != "aten":  # no version bump to see
                for t in in_tensors:
                    self._seen.forget_aliases(t)
        same = None
        if (name in SAME_ELEMENTS and entries and len(out_tensors) == 1 and not mutable
                and _same_memory(out_tensors[0], in_tensors[0])):
            same = entries[0]
        with torch._C._DisableTorchDispatch():
            if "output" in f.io:
                for i, t in enumerate(out_tensors):
                    entries.append(self._entry(writer, seq, schema.OUTPUT, i, t, skip=uninit,
                                               fresh=mutable, same_as=same,
                                               same_bytes=name in SAME_BYTES))
                    if coll is not None and entries[-1].stats is not None:
                        # no version bump will follow: later uses may share these bytes
                        local = collectives.local_tensor(t)
                        self._seen.remember(t if local is None else local, entries[-1].first,
                                            entries[-1].stats)

        counter = iter(range(len(in_tensors)))
        extra: dict[str, Any] = {}
        if uninit:
            extra["uninitialized"] = True
        if torch.Tag.nondeterministic_seeded in func.tags:
            extra["rng"] = True
        if mutable and coll is None:
            extra["inplace"] = True
        if coll is not None:
            extra["collective"] = coll
        meshes = [m for t in in_tensors if type(t) is not torch.Tensor
                  and (m := self._coll.note_mesh(t)) is not None]
        if meshes:  # an op on DTensors: recorded on the local shards
            extra["dtensor"] = meshes
        if loaded:
            extra["loaded"] = True
        if self._sim is not None and len(self._sim.applied) > n_faults:
            extra["faults"] = list(self._sim.applied[n_faults:])
        if origin is not None and origin[1] >= 0:
            extra["fwd_seq"] = origin[1]
        op = OpEntry(
            seq=seq, op=name, phase=phase, module=module, source=source, stack=stack,
            args=encode_call(args, kwargs, lambda _t: next(counter)), step=self.current_step,
            n_in=len(in_tensors), n_out=len(out_tensors), extra=extra, epoch=self._coll.current,
        )
        try:
            writer.add_op(op, entries)
        except DumpWriteError as e:
            self._failed = True
            if self.strict:
                raise
            log.error("%s; dumping stops here, training goes on", e)
        self.ops_recorded += 1
        self._steps_seen.add(self.current_step)
        return out, out_tensors

    def _entry(self, writer: DumpWriter, seq: int, io: int, idx: int, t: torch.Tensor,
               skip: bool = False, fresh: bool = False, same_as: TensorEntry | None = None,
               same_bytes: bool = False) -> TensorEntry:
        """Describe one tensor use.

        `fresh` forbids dedupe (outputs of in-place ops, whose version counter is bumped only
        after this mode returns). `same_as` is the input entry of a view-like op whose output
        holds the same elements: its statistics are reused, and with `same_bytes` and both
        tensors contiguous, its stored bytes too.
        """
        if type(t) is not torch.Tensor:  # wrapper subclasses: DTensor, async collective results
            local = collectives.local_tensor(t)
            t, skip = (t, True) if local is None else (local, skip)
        device = str(t.device)
        self._devices.add(t.device.type)
        row = writer.new_row()
        entry = TensorEntry(
            row=row, seq=seq, io=io, idx=idx, dtype=schema.dtype_name(t.dtype),
            shape=tuple(t.shape), stride=tuple(t.stride()) if t.layout == torch.strided else (),
            device=device, stats=None,
        )
        if skip or t.layout != torch.strided or t.dim() > schema.MAX_DIMS:
            return entry
        seen = None if fresh else self._seen.lookup(t)
        if seen is not None:
            entry.first, entry.stats = seen
            return entry
        if same_as is not None and same_as.stats is not None and t.dtype == _entry_dtype(
                same_as) and t.numel() == _numel(same_as.shape):
            entry.stats = same_as.stats
            if (self.mode == "tensor" and same_bytes and same_as.first >= 0
                    and t.is_contiguous() and _contiguous(same_as)):
                entry.first = same_as.first
                self._seen.remember(t, entry.first, entry.stats)
                return entry
        else:
            entry.stats = tensor_stats(t)
        if self.mode == "tensor":
            entry.data = _host_copy(t)
            entry.first = row
            entry.nbytes = t.numel() * t.element_size()
        if not fresh:
            self._seen.remember(t, row if self.mode == "tensor" else -1, entry.stats)
        return entry
