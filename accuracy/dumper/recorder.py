"""The recorder: the one write path into the dump, and the observer that records every call.

`Recorder.write` turns a call and its tensors into the writer's `OpEntry`/`TensorEntry` rows;
the overflow watcher writes its births through it too. As an observer (`before`, `after`),
the recorder describes each eager op's inputs before it runs (in-place ops keep their pre-op
values) and its outputs after, and each compiled kernel's launch (`KernelCall`) after it ran.
Each distinct tensor state (object identity plus `_version`) is stored once; later uses point
at those bytes. What it asks of the other observers: which bytes are not data yet
(`MemoryWatch`, dumper/uninit.py); whether a collective's data arrived (`CollectiveWatch`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from accuracy.aten import OpPlan, workspace_outputs, written_tensors
from accuracy.dumper import collectives
from accuracy.dumper.calls import Call, KernelCall, produced
from accuracy.dumper.deferred_stats import DeferredStats
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.identity import TensorStates, same_memory
from accuracy.dumper.stats_window import StatsWindow
from accuracy.dumper.storage_views import StoredStorages, restore, state
from accuracy.dumper.uninit import Uninitialised
from accuracy.dumpfile import schema, staging
from accuracy.dumpfile.argcodec import encode_call
from accuracy.dumpfile.stats import flat_view, tensor_stats
from accuracy.dumpfile.writer import DumpWriteError, DumpWriter, OpEntry, TensorEntry
from accuracy.native import fastpath

log = logging.getLogger(__name__)

_DTYPE_NAMES: dict[torch.dtype, str] = {}
_CLONE = "aten.clone.default"
_STRIDED = torch.strided


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = schema.dtype_name(dtype)
    return name


def _host_copy(t: torch.Tensor):
    """A private contiguous CPU copy, through the tensor's backend (async on devices)."""
    try:
        from accuracy.device_backend import backend_for_tensor
    except ImportError:  # backends not importable: a plain synchronous copy still works
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu")
        out.copy_(t)
        return out
    return backend_for_tensor(t).to_host(t)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _is_out(plan: OpPlan) -> bool:
    """An ATen `out=` overload (`aten.mm.out`): how Inductor calls its extern kernels."""
    return plan.aten and plan.mutable and plan.name.endswith(".out")


def out_positions(plan: OpPlan, args: tuple, kwargs: dict) -> list[int]:
    """Where an `out=` call's out tensors sit among its flattened inputs (args, then kwargs):
    memory the op overwrites without reading. What it held is no input of the op: garbage in
    a compiled program's fresh buffer (Inductor allocates it outside the dispatcher), which two
    compiled runs would otherwise compare as differing inputs."""
    names = {name for _, name, kwarg_only in plan.overwrites if kwarg_only}
    if not names:
        return []
    pos, found = len(tensors_in(args)), []
    for key, value in kwargs.items():
        n = len(tensors_in(value))
        if key in names:
            found.extend(range(pos, pos + n))
        pos += n
    return found


def _contiguous(entry: TensorEntry) -> bool:
    """Whether a recorded shape/stride pair is row-major contiguous."""
    expected = 1
    for size, stride in zip(reversed(entry.shape), reversed(entry.stride), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True, slots=True)
class TensorUse:
    """How `Recorder.entry` describes one tensor use.

    skip: metadata only (bytes that are not data: uninitialised memory, an `empty*`'s
    output, a wrapper with no local data). fresh: never deduplicated (written by this call:
    an in-place op's output, whose version counter is bumped only after the mode returns).
    alias: another tensor object over the same elements of the same memory counts as the
    same state (`TensorStates.get_alias`). same_as: the input entry of a view-like op whose
    output holds the same elements: its statistics are reused, and with `same_bytes` and
    both tensors contiguous, its stored bytes too. link: the recorded state the tensor holds
    (a copy taken before a kernel launch of memory another write filled). view_of: the input
    entry of a view op: an output inside the bytes stored for that input's storage version is
    a strided row over them (`Placement`), not a copy.
    """

    skip: bool = False
    fresh: bool = False
    alias: bool = False
    same_as: TensorEntry | None = None
    same_bytes: bool = False
    link: Any = None
    view_of: TensorEntry | None = None
    copy_of: TensorEntry | None = None  # a `clone`'s input entry: the same values
    view_base: Any = None  # the tensor `view_of` or `copy_of` describes
    view_call: Any = None  # the view op's (func, args, kwargs)


PLAIN = TensorUse()
_USES = {(skip, fresh, alias): TensorUse(skip, fresh, alias)
         for skip in (False, True) for fresh in (False, True) for alias in (False, True)}


def use(skip: bool = False, fresh: bool = False, alias: bool = False) -> TensorUse:
    """The shared `TensorUse` of these flags (no same_as, link)."""
    return _USES[(skip, fresh, alias)]


class Recorder:
    """Writes calls into one dump; as an observer, records every call it is shown."""

    def __init__(self, writer: DumpWriter, mode: str, io: frozenset[str] | set[str],
                 memory: Uninitialised | None = None, sim: Any = None, strict: bool = False,
                 defer_stats: bool = False) -> None:
        self.writer = writer
        self.tensor_mode = mode == "tensor"
        self.want_inputs = "input" in io
        self.want_outputs = "output" in io
        self.sim = sim
        self.strict = strict
        self.seen = TensorStates(track_storage=True)
        self.storages = StoredStorages()  # where stored copies lie: views placed over them
        # bytes no op has filled yet: never recorded as data (kept by MemoryWatch)
        self.memory = memory if memory is not None else Uninitialised()
        self._uninit_in: list[int] = []
        self.devices: set[str] = set()
        self._device_names: dict[torch.device, str] = {}
        self.ops_recorded = 0
        self.steps_seen: set[int] = set()
        self.failed = False
        # per call, between before() and after()
        self._in_entries: list[TensorEntry] = []
        self._n_faults = 0
        # seq -> {"i<idx>": row}: inputs that are strided views of a remembered write
        self._views: dict[int, dict[str, int]] = {}
        # statistics mode with a spare core, every op shown to the recorder: large CPU
        # tensors' reductions run on a helper thread (accuracy/dumper/deferred_stats.py)
        # Opt-in (ACCURACY_STATS_THREAD=1) until it is timed on a quiet machine: one A/B at
        # load 3.5 gave a slower step with it (GIL hand-offs), one at load 17 a faster one.
        self._deferred = (DeferredStats() if defer_stats and not self.tensor_mode
                          and os.environ.get("ACCURACY_STATS_THREAD") == "1"
                          and torch.get_num_threads() < (os.cpu_count() or 1) else None)
        # accelerator tensors' figures and copies: fetched once per window of ops
        # (accuracy/dumper/stats_window.py)
        self._window = StatsWindow(min(writer.max_pending_bytes, staging.RING_BYTES))
        # the C++ per-tensor statistics (accuracy/native/stats.cpp): built or loaded now,
        # before the step, never inside it; unavailable, dumpfile/stats.py's Python path runs
        fastpath.load()

    # -- the one write path ------------------------------------------------------------------

    def write(self, call: Call, entries: list[TensorEntry], n_in: int, n_out: int,
              extra: dict[str, Any]) -> None:
        """Queue one op record; a write failure stops the dump (or raises when strict)."""
        views = self._views.pop(call.seq, None) if self._views else None
        if views:  # tensor ("i<idx>") -> the row of the write it is a strided view of
            extra[schema.EXTRA_VIEW_OF] = views
        op = OpEntry(call.site, stack=call.stack, args=encode_call(call.args, call.kwargs),
                     n_in=n_in, n_out=n_out, extra=extra, epoch=call.epoch)
        try:
            self.writer.add_op(op, entries)
        except DumpWriteError as e:
            self.failed = True
            if self.strict:
                raise
            log.error("%s; dumping stops here, training goes on", e)
            return
        self.ops_recorded += 1
        self.steps_seen.add(call.step)
        self._window.op_written()

    def write_tensors(self, call: Call, inputs: list[torch.Tensor],
                      outputs: list[torch.Tensor], extra: dict[str, Any],
                      written: bool = False, links: dict[int, Any] | None = None) -> None:
        """Write `call` with these input and output tensors described afresh (the overflow
        watcher's births, judged after the fact). `written`: the outputs were just written
        by code that bumps no version counter (an Inductor kernel writing a buffer in place):
        their earlier states, and their aliases', are stale. `links`: input index -> the
        recorded state it holds (a copy taken before a launch of memory another write
        filled)."""
        with torch._C._DisableTorchDispatch():
            # a buffer another launch wrote is handed over as a fresh reinterpreted view:
            # found by its memory, it links to that write
            links = links or {}
            alias, out_use = use(alias=True), use(fresh=written)
            entries = [self.entry(call.seq, schema.INPUT, i, t,
                                  alias if i not in links else TensorUse(alias=True,
                                                                         link=links[i]))
                       for i, t in enumerate(inputs)]
            for i, t in enumerate(outputs):
                e = self.entry(call.seq, schema.OUTPUT, i, t, out_use)
                entries.append(e)
                if written and e.stats is not None:
                    self.seen.forget_aliases(t)
                    self.seen.put(t, state(e), memory=True)
        self.write(call, entries, len(inputs), len(outputs), extra)

    # -- observer ----------------------------------------------------------------------------

    def drain(self) -> None:
        """Wait for the statistics still being computed (before memory may be written)."""
        if self._deferred is not None:
            self._deferred.drain()

    def close_window(self) -> None:
        """Fetch the open window's accelerator figures (the step leaves the dumper, or the
        dump closes: the writer waits for them)."""
        self._window.close()

    def write_received(self, call: Call, arrived: bool) -> None:
        """Write a point-to-point receive once its data is there (dumper/p2p.py): its
        buffers as they were handed over (metadata: what they held is overwritten unread)
        and as they are now, its outputs, stored afresh (the receive bumped no version
        counter), so later reads point at the received bytes. `arrived` False: the dump
        closes first; the outputs are metadata only."""
        seq, entry, seen = call.seq, self.entry, self.seen
        entries: list[TensorEntry] = []
        n_in = n_out = 0
        with torch._C._DisableTorchDispatch():
            if self.want_inputs:
                entries = [entry(seq, schema.INPUT, i, t, use(skip=True))
                           for i, t in enumerate(call.inputs)]
                n_in = len(entries)
            for t in call.inputs:
                seen.forget_aliases(t)
            if self.want_outputs:
                for i, t in enumerate(call.inputs):
                    e = entry(seq, schema.OUTPUT, i, t, use(skip=not arrived, fresh=True))
                    entries.append(e)
                    if e.stats is not None:
                        seen.put(t, state(e))
                n_out = len(call.inputs)
        if call.collective is not None:
            call.extra[schema.EXTRA_COLLECTIVE] = call.collective
        self.write(call, entries, n_in, n_out, call.extra)

    def before(self, call: Call) -> None:
        if type(call) is KernelCall:  # described after the launch, in `after`
            return
        if call.plan.collective == "recv":  # written once its data arrived: write_received
            self._in_entries = []
            return
        memory = self.memory
        self._uninit_in = []
        if memory:
            with torch._C._DisableTorchDispatch():
                self._uninit_in = [i for i, t in enumerate(call.inputs) if memory.holds(t)]
        if _is_out(call.plan):
            outs = out_positions(call.plan, call.args, call.kwargs)
            self._uninit_in = sorted({*self._uninit_in, *outs}) if outs else self._uninit_in
        if self.want_inputs:
            seq, entry = call.seq, self.entry
            skip = self._uninit_in
            # an extern kernel reading Inductor's buffers; once a compiled program ran,
            # any op reading them (a fallback kernel, eager code given a compiled output)
            alias = _is_out(call.plan) or self.seen.has_memory()
            plain, skipped = use(alias=alias), use(skip=True, alias=alias)
            with torch._C._DisableTorchDispatch():
                self._in_entries = [entry(seq, schema.INPUT, i, t,
                                          skipped if i in skip else plain)
                                    for i, t in enumerate(call.inputs)]
        else:
            self._in_entries = []
        plan = call.plan
        if self._deferred is not None and (plan.mutable or not plan.aten
                                           or plan.collective is not None):
            # this op may write a tensor whose statistics are pending, its own inputs' too
            self._deferred.drain()
        if self.sim is not None:
            self._n_faults = len(self.sim.applied)

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        if type(call) is KernelCall:
            # A kernel writes through raw pointers (no version counter moves, even into
            # reused memory): its outputs are described afresh, never linked to bytes
            # recorded before.
            self.write_tensors(call, call.inputs, outputs, call.extra, written=True,
                               links=call.links)
            return
        plan = call.plan
        if plan.collective == "recv":
            return
        outputs = produced(call, outputs)  # a fused/foreach op's results are its writes
        coll = call.collective
        entries, self._in_entries = self._in_entries, []
        mutable = plan.mutable or coll is not None
        if mutable:
            # Some kernels write an argument without bumping its version counter (GradScaler's
            # found_inf): never trust an earlier record of a tensor a mutable op received.
            seen = self.seen
            for t in call.inputs:
                seen.forget(t)
            if coll is not None or not plan.aten:  # no version bump to see
                for t in call.inputs:
                    seen.forget_aliases(t)
            if seen.has_memory() and call.func is not None:
                # an eager write into memory a compiled launch wrote (DDP copies the reduced
                # gradients into the grads a compiled backward made): that launch's record
                # of the memory is stale, though no version counter it holds moved
                for t in written_tensors(call.func, call.args, call.kwargs):
                    seen.forget_memory(t)
            for t in call.inputs:
                if type(t) is not torch.Tensor:
                    # a DTensor's in-place op writes its local shard below autograd, where
                    # no version counter is bumped: the shard's earlier record is stale
                    local = collectives.local_tensor(t)
                    if local is not None:
                        seen.forget_aliases(local)
        memory = self.memory
        uninit_out: list[int] = []
        if memory and not plan.uninitialised:
            with torch._C._DisableTorchDispatch():
                uninit_out = [i for i, t in enumerate(outputs) if memory.holds(t)]
        if self.want_outputs:
            same = None
            if (plan.same_elements and entries and len(outputs) == 1 and not mutable
                    and same_memory(outputs[0], call.inputs[0])):
                same = entries[0]
            seq, entry = call.seq, self.entry
            out_op = coll is None and _is_out(plan) and not torch.is_inference_mode_enabled()
            unfilled = use(skip=True, fresh=mutable)
            # a view op's outputs may be placed over the bytes stored for its input
            # and a clone's output reads its input's (the same values)
            placed = entries and self.tensor_mode and not mutable
            view_of = entries[0] if placed and plan.view else None
            copy_of = entries[0] if placed and plan.name == _CLONE and len(outputs) == 1 \
                else None
            if same is not None or view_of is not None or copy_of is not None:
                data = TensorUse(skip=plan.uninitialised, fresh=mutable, same_as=same,
                                 same_bytes=plan.same_bytes, view_of=view_of, copy_of=copy_of,
                                 view_base=call.inputs[0] if placed else None,
                                 view_call=(call.func, call.args, call.kwargs)
                                 if view_of is not None else None)
            else:
                data = use(skip=plan.uninitialised, fresh=mutable)
            with torch._C._DisableTorchDispatch():
                for i, t in enumerate(outputs):
                    e = entry(seq, schema.OUTPUT, i, t, unfilled if i in uninit_out else data)
                    entries.append(e)
                    if out_op and e.stats is not None:
                        # an `out=` buffer (Inductor's extern kernels write theirs): the
                        # counter moves once this mode returns; the kernel that reads the
                        # buffer next links to this write
                        try:
                            self.seen.forget_aliases(t)
                            self.seen.put(t, state(e), version=t._version + 1,
                                          memory=True)
                        except RuntimeError:  # inference tensors have no version counter
                            pass
                    if coll is not None and e.stats is not None:
                        # no version bump will follow: later uses may share these bytes
                        local = collectives.local_tensor(t)
                        self.seen.put(t if local is None else local, state(e))

        extra = call.extra
        if plan.uninitialised:
            extra[schema.EXTRA_UNINITIALIZED] = True
        if self._uninit_in or uninit_out:  # views of memory not filled yet: not data
            extra[schema.EXTRA_UNINITIALIZED_IO] = {"input": self._uninit_in,
                                                    "output": uninit_out}
        if plan.rng:
            extra[schema.EXTRA_RNG] = True
        scratch = workspace_outputs(plan.name)
        if scratch:  # kernel scratch memory: stored (its backward replays with it), never judged
            extra[schema.EXTRA_WORKSPACE] = sorted(scratch)
        if mutable and coll is None:
            extra[schema.EXTRA_INPLACE] = True
        if coll is not None:
            extra[schema.EXTRA_COLLECTIVE] = coll
        if self.sim is not None and len(self.sim.applied) > self._n_faults:
            extra[schema.EXTRA_FAULTS] = list(self.sim.applied[self._n_faults:])
        if call.fwd_seq >= 0:
            extra[schema.EXTRA_FWD_SEQ] = call.fwd_seq
        self.write(call, entries, len(call.inputs), len(outputs), extra)

    def finish(self) -> dict[str, Any]:
        self._window.close()
        if self._deferred is not None:
            self._deferred.close()
            self._deferred = None
        return {}

    # -- tensors -----------------------------------------------------------------------------

    def entry(self, seq: int, io: int, idx: int, t: torch.Tensor,
              how: TensorUse = PLAIN) -> TensorEntry:
        """Describe one tensor use of call `seq` (`io`: schema.INPUT/OUTPUT, `idx`: its
        index there) as `how` says (see `TensorUse`); call with python dispatch disabled."""
        skip, fresh = how.skip, how.fresh
        if type(t) is not torch.Tensor:  # wrapper subclasses: DTensor, async collective results
            local = collectives.local_tensor(t)
            t, skip = (t, True) if local is None else (local, skip)
        dev = t.device
        device = self._device_names.get(dev)
        if device is None:
            device = self._device_names[dev] = str(dev)
            self.devices.add(dev.type)
        strided = t.layout == _STRIDED
        entry = TensorEntry(self.writer.new_row(), seq, io, idx, _dtype_name(t.dtype),
                            tuple(t.shape), tuple(t.stride()) if strided else (), device, None)
        if skip or not strided or t.dim() > schema.MAX_DIMS:
            return entry
        seen = None if fresh else (how.link if how.link is not None else self.seen.get(t))
        if seen is None and how.alias and not fresh:
            seen = self.seen.get_alias(t)
            if seen is None:
                # part of what a launch wrote, seen through another view (`hidden[:, 0]`
                # of a kernel's output): its own bytes, and which write it is a view of
                view = self.seen.get_view(t)
                if view is not None and view[0] >= 0:
                    self._views.setdefault(seq, {})[f"{'io'[io]}{idx}"] = view[0]
        if seen is not None:
            restore(entry, seen)
            return entry
        same_as = how.same_as
        if same_as is not None and same_as.stats is not None and entry.dtype == same_as.dtype \
                and t.numel() == _numel(same_as.shape):
            entry.stats = same_as.stats
            if (self.tensor_mode and how.same_bytes and same_as.first >= 0
                    and t.is_contiguous() and _contiguous(same_as)):
                entry.first = same_as.first
                if same_as.holder >= 0:  # where those values lie, for later views of it
                    self.storages.reshaped(entry, same_as)
                self.seen.put(t, state(entry))
                return entry
        elif how.copy_of is not None and how.copy_of.stats is not None \
                and entry.dtype == how.copy_of.dtype:
            entry.stats = how.copy_of.stats  # a clone: its input's values
        elif self._deferred is not None and self._deferred.wants(flat := flat_view(t)):
            entry.stats = self._deferred.submit(flat)
        else:  # a tensor dump's bytes carry a content hash: no bit-pattern sum beside it
            stats = tensor_stats(t, sums=not self.tensor_mode)
            entry.stats = self._window.figures(stats) if StatsWindow.wants(stats) else stats
        if self.tensor_mode:
            storages = self.storages
            if not ((how.view_of is not None
                     and storages.place(t, entry, how.view_of, how.view_base,
                                        how.view_call and (*how.view_call, idx)))
                    or (how.copy_of is not None
                        and storages.copy_of(t, entry, how.copy_of, how.view_base))):
                src = self.storages.extent(t)  # storage order: a plain copy, views placed
                entry.strided = src is not None
                src = t if src is None else src
                if dev.type == "cpu":
                    self._window.hold(t.numel() * t.element_size())  # staged behind the window
                    entry.data = self.writer.stage(src) or _host_copy(src)
                else:
                    entry.data = self._window.copy(src, _host_copy)
                entry.first = entry.row
                entry.nbytes = t.numel() * t.element_size()
                self.storages.stored(entry, t)
        if not fresh:
            self.seen.put(t, state(entry) if self.tensor_mode else (-1, entry.stats))
        return entry
