"""The compiled source: Inductor kernels' buffers written as rows by the dumper's recorder.

A second source beside the eager dispatch loop (docs/architecture.md): each kernel launch seen
by `accuracy/compiled/inductor.py` becomes one row, op `inductor.<kernel>`, with the buffers
it read as inputs and the buffers it materialised as outputs, through `Recorder.write_tensors`
(the one write path). The row carries what an eager row carries (seq, phase, step, module,
source line) plus the kernel name, its graph (forward/backward) and, per output, the ATen ops
fused into it with their module and source (`extra`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from accuracy.aten import OpPlan
from accuracy.compiled import graphs
from accuracy.compiled.inductor import KernelInfo, Origin
from accuracy.compiled.names import RegionCall
from accuracy.dumpfile import symsizes

log = logging.getLogger(__name__)

KERNEL_PREFIX = "inductor."


@dataclass(slots=True)
class KernelCall:
    """What `Recorder.write_tensors` reads of a call (the fields of the dumper's `OpCall`;
    this package imports nothing from the dumper, which imports it)."""

    plan: OpPlan
    seq: int
    phase: str
    module: str
    source: str
    step: int
    epoch: int
    inputs: list[Any]
    stack: str = ""
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.plan.name


def _plan(name: str) -> OpPlan:
    return OpPlan(name=name, aten=False, mutable=False, writes=(), view=False, rng=False,
                  uninitialised=False, same_elements=False, same_bytes=False, collective=None,
                  amp=False)


def concrete_layout(layout: Any, sizes: list[Any], shape: tuple[int, ...]
                    ) -> tuple[list[int], list[int]] | None:
    """A symbolic (size, stride) evaluated with the symbols that `shape`, the live shape of
    a buffer of symbolic size `sizes`, binds; None when it binds too few."""
    if len(sizes) != len(shape):
        return None
    try:
        env = symsizes.bind(zip(sizes, shape, strict=True))
        return ([int(symsizes.evaluate(d, env)) for d in layout[0]],
                [int(symsizes.evaluate(d, env)) for d in layout[1]])
    except ValueError:
        return None


class CompiledSource:
    """Writes kernel rows for one dumper while its dispatch mode is on the stack."""

    def __init__(self, owner: Any, watch: Any) -> None:
        self.owner = owner
        self.watch = watch
        self.kernels = 0
        self._plans: dict[str, OpPlan] = {}
        # compile id (a forward graph and its backward share one) -> the names of the
        # latest call its forward ran in: for a backward whose autograd node has none
        self._calls: dict[str, RegionCall] = {}
        self._with_graph: set[int] = set()  # kernel ids whose subgraph is already in the dump
        self._with_ref: set[int] = set()  # kernel ids whose replay reference is in the dump
        self._before: dict[int, list[Any]] = {}  # kernel id -> in-place outputs before launch
        self._before_links: dict[int, list[Any]] = {}  # kernel id -> their recorded states

    def before(self, info: KernelInfo, tensors: list[Any]) -> None:
        """Keep copies of buffers the kernel is about to overwrite (they are its inputs)."""
        rec = getattr(self.owner, "_recorder", None)
        if rec is None or rec.failed or not self.watch._active():
            return
        with torch._C._DisableTorchDispatch():
            views = [self._as_before(t, info.before_layout.get(b), info.before_sizes.get(b))
                     if isinstance(t, torch.Tensor) else t
                     for b, t in zip(info.before, tensors, strict=False)]
            # what wrote that memory (an extern kernel's out=, an earlier kernel): the
            # snapshot links to its row
            self._before_links[info.kid] = [
                (rec.seen.get(v) or rec.seen.get_alias(v))
                if isinstance(v, torch.Tensor) else None for v in views]
            self._before[info.kid] = [v.clone() if isinstance(v, torch.Tensor) else v
                                      for v in views]

    @staticmethod
    def _as_before(t: torch.Tensor, layout: Any, sizes: Any = None) -> torch.Tensor:
        """The value the memory of output `t` holds before the launch: the reused buffer's
        value, a view with that buffer's size and stride (the output's own view of the
        memory is another tensor); `t` as it is when the layout is unknown or does not fit
        in its storage. A symbolic layout (`dynamic=True`) is evaluated with the symbols
        bound by `t`'s shape against its symbolic `sizes`."""
        if layout is not None and sizes is not None:
            layout = concrete_layout(layout, sizes, tuple(t.shape))
        if layout is not None:
            size, stride = layout
            need = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True) if n > 0)
            if all(n > 0 for n in size) and t.storage_offset() * t.element_size() \
                    + need * t.element_size() <= t.untyped_storage().nbytes():
                return t.as_strided(size, stride, t.storage_offset())
        return t

    def kernel(self, info: KernelInfo, tensors: list[Any]) -> None:
        owner = self.owner
        rec = getattr(owner, "_recorder", None)
        if rec is None or rec.failed or not self.watch._active():
            return
        backward = torch._C._current_graph_task_id() != -1
        scope = owner._scope
        phase = "backward" if backward else scope.phase
        region = self._call(backward, info.compile_id)
        outs = [info.buffers[i] for i in info.outputs]
        first = outs[0]
        prim = self._held(first, info)
        module = self._name(region, prim)
        source = prim.source if prim is not None else ""
        seq = owner._seq
        owner._seq += 1
        name = KERNEL_PREFIX + info.kernel
        plan = self._plans.get(name)
        if plan is None:
            plan = self._plans[name] = _plan(name)
        out_pos = set(info.outputs)
        inputs = [t for i, t in enumerate(tensors) if i not in out_pos
                  and isinstance(t, torch.Tensor)]
        befores = self._before.pop(info.kid, [])
        known = self._before_links.pop(info.kid, None) or [None] * len(befores)
        links: dict[int, Any] = {}
        for t, v in zip(befores, known, strict=False):
            if isinstance(t, torch.Tensor):
                if v is not None:
                    links[len(inputs)] = v
                inputs.append(t)
        outputs = [tensors[i] for i in info.outputs if isinstance(tensors[i], torch.Tensor)]
        call = KernelCall(plan, seq, phase, module, source, owner.current_step,
                          owner._coll.current, inputs)
        extra = {
            "compiled": "inductor", "kernel": info.kernel, "graph": info.graph,
            "fused_ops": info.fused_ops(),
            "inputs": [b for i, b in enumerate(info.buffers) if i not in out_pos]
            + [f"{b}_before" for b in info.before],
            "outputs": [self._out(b, info, region) for b in outs],
            "kid": info.kid,
        }
        if info.fused_graph is not None and info.kid not in self._with_graph:
            self._with_graph.add(info.kid)  # once per launch site
            extra["fused_graph"] = info.fused_graph
        if info.reference is not None and info.kid not in self._with_ref:
            self._with_ref.add(info.kid)  # once per launch site, like fused_graph
            extra["reference"] = info.reference
        checker = getattr(owner, "_overflow", None)
        if checker is not None:  # check_overflow: judged as an op is; only births written
            checker.kernel(call, outputs)
        else:
            # A kernel writes through raw pointers (no version counter moves, even into
            # reused memory): its outputs are described afresh, never linked to bytes
            # recorded before.
            rec.write_tensors(call, inputs, outputs, extra, written=True, links=links)
        self.kernels += 1
        self.watch.recorded()

    def extern_site(self, backward: bool) -> tuple[str, str] | None:
        """(module, source) of the extern kernel call running now (its FX node's, under the
        region's path), or None outside one."""
        from accuracy.compiled.inductor import current_extern

        cur = current_extern()
        if cur is None:
            return None
        origin = cur[1]
        return self._name(self._call(backward, cur[2]), origin), origin.source

    def graph_site(self, backward: bool, frame: Any, internal: Any) -> tuple[str, str] | None:
        """(module, source) of the ATen op an `aot_eager`/`eager` compiled graph is running
        now, from its FX node (`graphs.graph_node`), named as the eager dump names modules;
        None for an op outside such a graph. A backward op is named by its node's
        `fwd_nn_module_stack` (the forward node it differentiates) under the call whose
        forward made the autograd node the engine runs, so the whole backward graph no longer
        takes the module of the last forward op."""
        from accuracy.compiled.inductor import node_site

        if backward:
            call = graphs.backward_call()
            if call is None:
                return None
            hit = graphs.graph_node(frame, internal)
            if hit is None:  # the compiled function's own wrapper ops, around its graph
                return call.base, ""
        else:
            hit = graphs.graph_node(frame, internal)
            if hit is None or not graphs.in_region(hit[1]):  # not a graph dynamo runs
                return None
            call = self.watch.region_call()
            if not call.base:
                call = dataclasses.replace(call, base=self.owner._scope.module)
            graphs.file_call(hit[1], call)
        root, rel, _, root_cls, source = node_site(hit[0])
        return call.module(root, rel, root_cls), source

    def _call(self, backward: bool, compile_id: str) -> RegionCall:
        """The names of the region call a kernel runs for. Forward: the latest region entered
        (filed on the call's autograd node, for its backward). Backward: the call whose
        forward made the autograd node the engine runs (blocks sharing one compiled program
        each name their own backward), else the latest forward of the same compile."""
        if backward:
            return graphs.backward_call() or self._calls.get(compile_id) or RegionCall("")
        call = self.watch.region_call()
        if not call.base:
            call = dataclasses.replace(call, base=self.owner._scope.module)
        self._calls[compile_id] = call
        graphs.file_call(sys._getframe(2), call)
        return call

    @staticmethod
    def _name(call: RegionCall, origin: Origin | None) -> str:
        """An origin node's module as the eager dump names it."""
        if origin is None:
            return call.base
        return call.module(origin.root, origin.module, origin.root_cls)

    @staticmethod
    def _held(buf: str, info: KernelInfo) -> Origin | None:
        """The node whose value the buffer holds (its origin node, through views)."""
        prim = info.held.get(buf)
        if prim is None:
            origins = info.origins.get(buf, [])
            prim = next((o for o in origins if o.node == info.primary.get(buf)), None)
            if prim is None and origins:
                # a guess (no origin node: a buffer written in place): not known to hold a
                # value inside a decomposition, which would leave a real output unpaired
                prim = dataclasses.replace(origins[-1], inner=False)
        return prim

    @classmethod
    def _out(cls, buf: str, info: KernelInfo, call: RegionCall) -> dict[str, Any]:
        origins = info.origins.get(buf, [])
        prim = cls._held(buf, info)
        out = {"buffer": buf,
               "node": prim.node if prim else "", "op": prim.op if prim else "",
               "module": cls._name(call, prim),
               "source": prim.source if prim else "",
               "multi": bool(prim.multi) if prim else False,
               "fused": sorted({o.op for o in origins})}
        if prim is not None and prim.orig:
            out["orig"] = prim.orig
        if prim is not None and prim.index >= 0:
            out["index"] = prim.index
        if prim is not None and prim.inner:  # inside `orig`'s decomposition: no eager value
            out["inner"] = True
        return out
