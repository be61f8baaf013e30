"""The compiled source: each Inductor kernel launch emitted into the dumper's loop.

A second source beside the eager dispatch mode (docs/architecture.md): each kernel launch the
hooks report (accuracy/dumper/compiled/launches.py) becomes one `KernelCall`, op
`inductor.<kernel>`, with the buffers it read as inputs (a buffer it overwrote in place: a copy
taken before the launch) and the buffers it materialised as outputs, emitted through
`Loop.emit`: placed like an eager op (seq, phase, module, source line, step, rank) and shown
to the same observers (the recorder writes it as one row; the overflow watcher judges it).
Its `extra` carries the kernel name, its graph (forward/backward) and, per output, the ATen
ops fused into it with their module and source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from accuracy.aten import OpPlan
from accuracy.dumper.calls import KernelCall
from accuracy.dumper.compiled import launches
from accuracy.dumper.compiled.kernels import KernelInfo
from accuracy.dumpfile import schema, symsizes

if TYPE_CHECKING:
    from accuracy.dumper.identity import TensorStates
    from accuracy.dumper.loop import Loop

log = logging.getLogger(__name__)

KERNEL_PREFIX = "inductor."


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
    """Emits kernel launches into one dumper's loop while `recording()` says so. `states`:
    the recorder's tensor states, which a copy taken before a launch links to (the write
    that filled that memory: an extern kernel's out=, an earlier kernel)."""

    def __init__(self, loop: Loop, states: TensorStates, recording: Callable[[], bool],
                 recorded: Callable[[], None],
                 distrusted: Callable[[KernelInfo, str], None] = lambda info, why: None
                 ) -> None:
        self.loop = loop
        self.states = states
        self.recording = recording
        self.recorded = recorded  # a kernel of the latest region was emitted
        # a launch of the latest region whose description is not the running kernel's
        self.distrusted = distrusted
        self.kernels = 0
        self._plans: dict[str, OpPlan] = {}
        self._with_graph: set[int] = set()  # kernel ids whose subgraph is already in the dump
        self._with_ref: set[int] = set()  # kernel ids whose replay reference is in the dump
        self._before: dict[int, list[Any]] = {}  # kernel id -> in-place outputs before launch
        self._before_links: dict[int, list[Any]] = {}  # kernel id -> their recorded states

    def before(self, info: KernelInfo, tensors: list[Any]) -> None:
        """Keep copies of buffers the kernel is about to overwrite (they are its inputs)."""
        if not self.recording():
            return
        states = self.states
        with torch._C._DisableTorchDispatch():
            views = [self._as_before(t, info.before_layout.get(b), info.before_sizes.get(b))
                     if isinstance(t, torch.Tensor) else t
                     for b, t in zip(info.before, tensors, strict=False)]
            # what wrote that memory (an extern kernel's out=, an earlier kernel): the
            # snapshot links to its row
            self._before_links[info.kid] = [
                (states.get(v) or states.get_alias(v))
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
        """A launch ran: its `KernelCall`, emitted into the loop."""
        if not self.recording():
            return
        why = launches.source_mismatch(info.kid)
        if why is not None:  # recorded as this kernel, it would be another kernel's values
            self._before.pop(info.kid, None)
            self._before_links.pop(info.kid, None)
            self.distrusted(info, why)
            return
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
        extra = {
            schema.EXTRA_COMPILED: "inductor", schema.EXTRA_KERNEL: info.kernel,
            schema.EXTRA_GRAPH: info.graph, schema.EXTRA_FUSED_OPS: info.fused_ops(),
            schema.EXTRA_INPUTS: [b for i, b in enumerate(info.buffers) if i not in out_pos]
            + [f"{b}_before" for b in info.before],
            schema.EXTRA_OUTPUTS: [],  # each output's node and module: named when placed
            schema.EXTRA_KID: info.kid,
        }
        if info.fused_graph is not None and info.kid not in self._with_graph:
            self._with_graph.add(info.kid)  # once per launch site
            extra[schema.EXTRA_FUSED_GRAPH] = info.fused_graph
        if info.reference is not None and info.kid not in self._with_ref:
            self._with_ref.add(info.kid)  # once per launch site, like fused_graph
            extra[schema.EXTRA_REFERENCE] = info.reference
        self.loop.emit(KernelCall(plan, inputs, extra=extra, links=links, kernel=info),
                       outputs)
        self.kernels += 1
        self.recorded()
