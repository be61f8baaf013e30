"""Tensor subclasses (DTensor, async collective results) seen by `sim`: work on their data.

A wrapper subclass has no storage of its own; its data are the plain tensors it wraps (a
DTensor's local shard). `sim` rounds and faults "inside the kernel", with dispatch disabled,
where a wrapper cannot run an op: so it rounds the wrapped tensors and rebuilds the wrapper
around them (inputs), or changes the wrapped tensors in place (outputs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_MAX_DEPTH = 8  # wrappers of wrappers, bounded


def plain_parts(t: torch.Tensor, depth: int = 0) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s data (`[t]` for a plain tensor)."""
    if not is_traceable_wrapper_subclass(t) or depth >= _MAX_DEPTH:
        return [t] if not is_traceable_wrapper_subclass(t) else []
    names, _ = t.__tensor_flatten__()
    out: list[torch.Tensor] = []
    for n in names:
        inner = getattr(t, n)
        if isinstance(inner, torch.Tensor):  # names may list non-tensors (a DeviceMesh)
            out += plain_parts(inner, depth + 1)
    return out


def map_plain(t: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor],
              depth: int = 0) -> torch.Tensor:
    """`fn` applied to the plain tensors inside `t`, rewrapped like `t` (same placements,
    shape and strides); `fn(t)` for a plain tensor."""
    if not is_traceable_wrapper_subclass(t):
        return fn(t)
    if depth >= _MAX_DEPTH:
        return t
    names, ctx = t.__tensor_flatten__()
    inner = {}
    for n in names:
        v = getattr(t, n)
        inner[n] = map_plain(v, fn, depth + 1) if isinstance(v, torch.Tensor) else v
    return type(t).__tensor_unflatten__(inner, ctx, t.size(), t.stride())
