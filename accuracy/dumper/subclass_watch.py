"""An observer that notices tensor subclasses the dumper cannot see into.

A `__torch_dispatch__` wrapper subclass (torchao's fp8 training tensors, a quantised or sparse
tensor type) carries meaning outside its inner tensors: scales, block layouts, a format. The
dumper records the ops it sees, which for such a tensor are the wrapper's own calls or the raw
inner data, never what the wrapper means. This observer names each such type and how many ops
took it, so every reader says, first, that those values were not seen as what they are
(`dumpfile.compiled.blind_lines`). DTensor is understood (its local shards are recorded).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from accuracy.dumper.calls import Call
from accuracy.dumpfile import schema

# Wrapper subclasses whose inner tensors the dumper already records as what they are.
UNDERSTOOD = frozenset({"DTensor", "FakeTensor", "FunctionalTensor", "AsyncCollectiveTensor"})


def unseen_subclass(t: Any) -> str | None:
    """The type name of a wrapper subclass the dumper does not understand, else None."""
    if not isinstance(t, torch.Tensor) or type(t) is torch.Tensor:
        return None
    name = type(t).__name__
    if name in UNDERSTOOD or not is_traceable_wrapper_subclass(t):
        return None
    return f"{type(t).__module__}.{type(t).__qualname__}"


class SubclassWatch:
    """Observer: `extra["tensor_subclasses"]` on each op that took an unseen wrapper subclass,
    and the root attribute `tensor_subclasses` ({type: ops}) at the end."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()

    def before(self, call: Call) -> None:
        # call.inputs holds every tensor of the call (accuracy/dumper/flatten.py); nearly
        # always plain tensors, told apart by one type check each: no pytree walk per op
        plain = torch.Tensor
        for t in call.inputs:
            if type(t) is not plain:
                break
        else:
            return
        names = sorted({n for t in call.inputs if (n := unseen_subclass(t)) is not None})
        if names:
            call.extra[schema.EXTRA_TENSOR_SUBCLASSES] = names
            self.ops.update(names)

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        pass

    def finish(self) -> dict[str, Any]:
        return {schema.ROOT_TENSOR_SUBCLASSES: dict(self.ops)} if self.ops else {}
