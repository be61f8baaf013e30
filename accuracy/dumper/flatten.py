"""The tensors inside an op's arguments or outputs, in pytree order, cheaply.

ATen arguments nest at most lists in tuples; a plain recursive walk is several times faster
than `torch.utils._pytree.tree_flatten`, and this runs for every op.
"""

from __future__ import annotations

from typing import Any

import torch


def tensors_in(obj: Any, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Tensors in `obj` (tensor, list/tuple, dict values, nested), in flatten order."""
    if out is None:
        out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, list | tuple):
        for x in obj:
            tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            tensors_in(x, out)
    return out
