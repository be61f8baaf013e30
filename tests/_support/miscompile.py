"""What the compiled-program tests share: the miscompile they inject (a post-grad pass that
scales one module's matmul output by 1.05, as a wrong fused kernel would) and the cache set-up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


class ScaleMatmul(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Multiply the output of every `op` node of the module whose path ends with `module`
    (only the first such node of each graph with `first`)."""

    def __init__(self, op: torch._ops.OpOverload, module: str, factor: float = 1.05,
                 first: bool = False) -> None:
        self.op, self.module, self.factor, self.first = op, module, factor, first

    def __call__(self, g: torch.fx.Graph) -> None:
        for n in list(g.nodes):
            stack = n.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            if n.target == self.op and path.endswith(self.module):
                with g.inserting_after(n):
                    m = g.call_function(torch.ops.aten.mul.Tensor, (n, self.factor))
                n.replace_all_uses_with(m)
                m.args = (n, self.factor)
                if self.first:
                    break

    def uuid(self) -> str:  # Inductor's cache key: one per injected fault
        return (f"accuracy-test-scale-{self.op}-{self.module}-{self.factor}"
                + ("-first" if self.first else ""))


@contextlib.contextmanager
def inductor_cache(folder: Path) -> Iterator[Path]:
    """Inductor's cache in `folder/cache`, one compile thread, dynamo reset on the way out:
    each compiled-program test module compiles its models once, in its own temporary folder."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "cache"))
    mp.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    try:
        yield folder
    finally:
        torch._dynamo.reset()
        mp.undo()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count `n` inside, put back after. A CPU program depends on it:
    Inductor lowers `scatter_add` (max_pool's backward) to ATen's `scatter_reduce_` only with
    more than one thread, else it fuses the scatter into the kernel zero-filling its buffer."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
