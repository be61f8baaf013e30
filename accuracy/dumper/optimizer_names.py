"""An observer naming each tensor an optimizer call writes by its parameter and its state.

One `_fused_adamw_` or `_foreach_mul_` updates every parameter at once: a single row. Named
per tensor (`extra["tensor_names"]`), compare gives each parameter its own row and a fault
its own culprit. Each output that is a parameter, a gradient or an optimizer state is also
named with its role (`extra["optimizer_states"]`: `exp_avg` of `lm_head.weight`), whatever
the implementation wrote it, so that compare pairs a foreach/fused optimizer (every device's
default) with the per-tensor one CPU runs by the states they produce. The names come from
the module scope (accuracy/dumper/scope.py: the parameter, its gradient and its optimizer
states, known while `optimizer.step()` runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accuracy.dumper.calls import Call, KernelCall, produced
from accuracy.dumper.scope import OPTIMIZER
from accuracy.dumpfile import schema


class OptimizerNames:
    """Observer: `extra["tensor_names"]` on an optimizer call whose outputs belong to more
    than one parameter, `extra["optimizer_states"]` on one that writes a parameter, gradient
    or state. `name_of`: a tensor -> its parameter's name ('' when unknown); `state_of`: a
    tensor -> (parameter name, role) or None."""

    def __init__(self, name_of: Callable[[torch.Tensor], str],
                 state_of: Callable[[torch.Tensor], tuple[str, str] | None] | None = None
                 ) -> None:
        self.name_of = name_of
        self.state_of = state_of

    def before(self, call: Call) -> None:
        pass

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        if call.phase != OPTIMIZER or type(call) is KernelCall:
            return
        outputs = produced(call, outputs)
        if self.state_of is not None:
            written = self._states(outputs)
            if any(written):
                call.extra[schema.EXTRA_OPTIMIZER_STATES] = {
                    "input": self._states(call.inputs), "output": written}
        if len(outputs) < 2:
            return
        name = self.name_of
        names = {"input": [name(t) for t in call.inputs],
                 "output": [name(t) for t in outputs]}
        if len({n for n in names["output"] if n}) > 1:
            call.extra[schema.EXTRA_TENSOR_NAMES] = names

    def _states(self, tensors: list[torch.Tensor]) -> list[list[str] | None]:
        assert self.state_of is not None
        out = []
        for t in tensors:
            s = self.state_of(t) if isinstance(t, torch.Tensor) else None
            out.append(list(s) if s else None)
        return out

    def finish(self) -> dict[str, Any]:
        return {}
