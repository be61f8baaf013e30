"""The miscompile the compiled-program tests inject: a post-grad pass that scales one module's
matmul output by 1.05, as a wrong fused kernel would."""

from __future__ import annotations

import torch


class ScaleMatmul(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Multiply the output of every `op` node of the module whose path ends with `module`."""

    def __init__(self, op: torch._ops.OpOverload, module: str, factor: float = 1.05) -> None:
        self.op, self.module, self.factor = op, module, factor

    def __call__(self, g: torch.fx.Graph) -> None:
        for n in list(g.nodes):
            stack = n.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            if n.target == self.op and path.endswith(self.module):
                with g.inserting_after(n):
                    m = g.call_function(torch.ops.aten.mul.Tensor, (n, self.factor))
                n.replace_all_uses_with(m)
                m.args = (n, self.factor)

    def uuid(self) -> str:  # Inductor's cache key: one per injected fault
        return f"accuracy-test-scale-{self.op}-{self.module}-{self.factor}"
