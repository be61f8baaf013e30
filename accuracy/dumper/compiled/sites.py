"""Where compiled work runs, named as the eager rows of the same module are.

The placing step of the loop (accuracy/dumper/sites.py) asks this while a dumper's compiled
watch runs, for three kinds of call:

- a kernel launch: the module and source line of the FX node whose value its first output
  holds, under the names of the region call it runs for (`names.RegionCall`); each output's
  own node, op and module go into the row's `extra["outputs"]`;
- an ATen op an `aot_eager`/`eager` graph runs: its FX node's (`graphs.graph_node`); in a
  backward graph, the forward node it differentiates, under the call whose forward made the
  autograd node the engine runs;
- an Inductor extern kernel's ATen call (`aten.mm.out`...): the node its line was marked with.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any, Protocol

from accuracy.dumper.compiled import graphs, launches
from accuracy.dumper.compiled.kernels import KernelInfo, Origin, node_site
from accuracy.dumper.compiled.names import RegionCall
from accuracy.dumpfile import schema

if TYPE_CHECKING:
    from accuracy.dumper.calls import KernelCall
    from accuracy.dumper.sites import Sites


class RegionSource(Protocol):
    """What naming needs of the compiled watch (`watch.CompileWatch`), which builds this
    class: written as a protocol so the two modules do not import each other."""

    aten_graphs: bool

    def region_call(self) -> RegionCall: ...


class CompiledSites:
    """Names compiled work for one dumper's loop (see the module's docstring)."""

    def __init__(self, watch: RegionSource, sites: Sites) -> None:
        self.watch = watch
        self.sites = sites
        # compile id (a forward graph and its backward share one) -> the names of the
        # latest call its forward ran in: for a backward whose autograd node has none
        self._calls: dict[str, RegionCall] = {}

    @property
    def aten_graphs(self) -> bool:
        """Whether a region of an ATen backend (aot_eager...) was entered: its ops name nodes."""
        return self.watch.aten_graphs

    def kernel_site(self, call: KernelCall, backward: bool) -> tuple[str, str]:
        """(module, source) of a launch: its first output's node's; each output's own node,
        op and module fill `call.extra["outputs"]`."""
        info: KernelInfo = call.kernel
        region = self._call(backward, info.compile_id)
        outs = [info.buffers[i] for i in info.outputs]
        prim = held(outs[0], info)
        call.extra[schema.EXTRA_OUTPUTS] = [_out(b, info, region) for b in outs]
        return _name(region, prim), prim.source if prim is not None else ""

    def extern_site(self, backward: bool) -> tuple[str, str] | None:
        """(module, source) of the extern kernel call running now (its FX node's, under the
        region's path), or None outside one."""
        if not launches.running_extern():
            return None
        cur = launches.current_extern()
        if cur is None:
            return None
        origin = cur[1]
        return _name(self._call(backward, cur[2]), origin), origin.source

    def graph_site(self, backward: bool, frame: Any, internal: Any) -> tuple[str, str] | None:
        """(module, source) of the ATen op an `aot_eager`/`eager` compiled graph is running
        now, from its FX node (`graphs.graph_node`), named as the eager dump names modules;
        None for an op outside such a graph. A backward op is named by its node's
        `fwd_nn_module_stack` (the forward node it differentiates) under the call whose
        forward made the autograd node the engine runs, so the whole backward graph no longer
        takes the module of the last forward op."""
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
                call = dataclasses.replace(call, base=self.sites.module)
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
            call = dataclasses.replace(call, base=self.sites.module)
        self._calls[compile_id] = call
        graphs.file_call(sys._getframe(2), call)
        return call


def _name(call: RegionCall, origin: Origin | None) -> str:
    """An origin node's module as the eager dump names it."""
    if origin is None:
        return call.base
    return call.module(origin.root, origin.module, origin.root_cls)


def held(buf: str, info: KernelInfo) -> Origin | None:
    """The node whose value output buffer `buf` holds (its origin node, through views)."""
    prim = info.held.get(buf)
    if prim is None:
        origins = info.origins.get(buf, [])
        prim = next((o for o in origins if o.node == info.primary.get(buf)), None)
        if prim is None and origins:
            # a guess (no origin node: a buffer written in place): not known to hold a
            # value inside a decomposition, which would leave a real output unpaired
            prim = dataclasses.replace(origins[-1], inner=False)
    return prim


def _out(buf: str, info: KernelInfo, call: RegionCall) -> dict[str, Any]:
    origins = info.origins.get(buf, [])
    prim = held(buf, info)
    out = {"buffer": buf,
           "node": prim.node if prim else "", "op": prim.op if prim else "",
           "module": _name(call, prim),
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
