"""An observer naming each tensor of a fused/foreach optimizer call by its parameter.

One `_fused_adamw_` or `_foreach_mul_` updates every parameter at once: a single row. Named
per tensor (`extra["tensor_names"]`), compare gives each parameter its own row and a fault
its own culprit. The names come from the module scope (accuracy/dumper/scope.py: the
parameter, its gradient and its optimizer states, known while `optimizer.step()` runs).
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
    than one parameter. `name_of`: a tensor -> its parameter's name ('' when unknown)."""

    def __init__(self, name_of: Callable[[torch.Tensor], str]) -> None:
        self.name_of = name_of

    def before(self, call: Call) -> None:
        pass

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        if call.phase != OPTIMIZER or type(call) is KernelCall:
            return
        outputs = produced(call, outputs)
        if len(outputs) < 2:
            return
        name = self.name_of
        names = {"input": [name(t) for t in call.inputs],
                 "output": [name(t) for t in outputs]}
        if len({n for n in names["output"] if n}) > 1:
            call.extra[schema.EXTRA_TENSOR_NAMES] = names

    def finish(self) -> dict[str, Any]:
        return {}
