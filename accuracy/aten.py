"""What we know about ATen ops from their schemas, in one place (the dumper's load mode, the
overflow watcher and the live tools all ask the same questions)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def written_ids(func: Any, args: tuple, kwargs: dict) -> set[int]:
    """ids of the tensors an in-place or out= op writes (its `Tensor(a!)` arguments)."""
    ids: set[int] = set()
    for pos, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[pos] if not a.kwarg_only and pos < len(args) else kwargs.get(a.name)
        for v in tree_flatten(value)[0]:
            if isinstance(v, torch.Tensor):
                ids.add(id(v))
    return ids


def is_view(func: Any) -> bool:
    """True when the op returns a view of an input (an alias it does not write)."""
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)
