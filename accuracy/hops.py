"""Higher-order operators (FlexAttention, `torch.cond`, `while_loop`, `scan`...) under our
dispatch modes.

torch hands a higher-order operator (HOP) called in eager code to the innermost
TorchDispatchMode, and raises NotImplementedError when the mode does not declare
`supports_higher_order_operators`: a user's eager `flex_attention` or `torch.cond` died inside
`with dumper(...)`. Our modes declare it and hand each HOP to `run`: its dense implementation
(the one eager code runs on CPU or CUDA) is called with the mode pushed again, so the ATen ops
inside it (the branch taken, the attention's scores, `score_mod` and softmax) reach the mode
one by one, as any other op. Some dense implementations (`cond`, `scan`, `invoke_subgraph`)
only call their subgraphs and refuse to start under a mode, before doing anything: those run
without it, with each subgraph they call wrapped to push the mode back, so the ops inside are
seen all the same. A HOP with no dense implementation runs as torch would run it without the
mode, and the caller is told it was not seen, to say so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils._python_dispatch import TorchDispatchMode

_BACKEND_KEYS = {"cpu": DispatchKey.CPU, "cuda": DispatchKey.CUDA}


def is_hop(func: Any) -> bool:
    return isinstance(func, torch._ops.HigherOrderOperator)


def _device_type(args: tuple, kwargs: dict) -> str:
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            return a.device.type
    return "cpu"


def dense_kernel(func: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """The implementation eager code runs for `func` on its tensors' device, or None."""
    kernels = getattr(func, "py_kernels", {})
    kernel = kernels.get(DispatchKey.CompositeExplicitAutograd)
    if kernel is None:
        key = _BACKEND_KEYS.get(_device_type(args, kwargs))
        kernel = kernels.get(key) if key is not None else None
    return kernel


@contextlib.contextmanager
def _pushed(mode: Any) -> Iterator[None]:
    """`mode` back on the dispatch stack, as torch's own `with` pushes it, without the mode's
    own `__enter__`/`__exit__` (a sim's starts a new run and refuses to nest)."""
    TorchDispatchMode.__enter__(mode)
    try:
        yield
    finally:
        TorchDispatchMode.__exit__(mode, None, None, None)


def run(mode: Any, func: Any, args: tuple, kwargs: dict,
        unseen: Callable[[str], None]) -> Any:
    """Run HOP `func` for `mode` (called from its `__torch_dispatch__`, where torch has
    popped it): inside the dense implementation with the mode on, so its ATen ops reach the
    mode; else as torch would without the mode, calling `unseen(name)`."""
    kernel = dense_kernel(func, args, kwargs)
    if kernel is None:
        unseen(func.name())
        return func(*args, **kwargs)
    if func.name() not in _MODE_FREE:
        try:
            with _pushed(mode):
                return kernel(*args, **kwargs)
        except AssertionError as e:
            if _REFUSES_MODES not in str(e):
                raise
            _MODE_FREE.add(func.name())  # refused before doing anything: run it as below

    def under_mode(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            with _pushed(mode):
                return fn(*a, **k)
        return call

    args, kwargs = torch.utils._pytree.tree_map(
        lambda x: under_mode(x) if callable(x) and not isinstance(x, torch.Tensor) else x,
        (args, kwargs))
    return kernel(*args, **kwargs)


# torch's dense implementations that only call subgraphs check this first (cond, scan, base_hop)
_REFUSES_MODES = "Mode should never be enabled"
_MODE_FREE: set[str] = set()  # HOPs whose dense implementation refused to run under a mode
