"""User-supplied reference implementations, for ops the reference backend has no kernel for.

A device-specific fused op (an NPU fused attention, an RMSNorm kernel) has no CPU kernel, so
replay cannot run it as recorded; a few lines of plain PyTorch give it one:

    from accuracy.replay import register_reference

    @register_reference("npu.npu_rms_norm.default")
    def rms_norm(x, gamma, eps=1e-6):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * r * gamma, r
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accuracy.patterns import op_matches

ReferenceFn = Callable[..., Any]
_REGISTRY: list[tuple[str, ReferenceFn]] = []


def register_reference(pattern: str, fn: ReferenceFn | None = None) -> Any:
    """Give ops matching `pattern` (name, overload-less name or glob) a reference `fn`.

    `fn` is called with the recorded call's arguments (tensors on the reference device) and
    must return the outputs in the op's structure. Usable as a decorator. Later registrations
    win over earlier ones, and any registration wins over the ATen kernel.
    """

    def add(f: ReferenceFn) -> ReferenceFn:
        _REGISTRY.append((pattern, f))
        return f

    return add(fn) if fn is not None else add


def register_builtin_reference(pattern: str, fn: ReferenceFn) -> None:
    """A reference this package ships (e.g. `replay.rnn`): below every user registration."""
    _REGISTRY.insert(0, (pattern, fn))


def unregister_reference(pattern: str) -> None:
    """Remove every registration made with exactly `pattern`."""
    _REGISTRY[:] = [(p, f) for p, f in _REGISTRY if p != pattern]


def lookup_reference(op: str) -> ReferenceFn | None:
    """The newest registered reference for `op`, or None."""
    for pattern, fn in reversed(_REGISTRY):
        if op_matches(pattern, op):
            return fn
    return None
