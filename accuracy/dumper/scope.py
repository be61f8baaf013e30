"""Where an op runs: module path (forward and backward) and phase.

Forward: PyTorch's global module hooks keep a stack of fully qualified module names, named
the way ModTracker names them (`RootClass.encoder.layers.0`). We do not use ModTracker itself:
it registers gradient hooks on every module call to follow modules into backward, which cost
~15% of the benchmark step, and backward is attributed exactly another way.

Backward: each forward op's autograd node is tagged with the forward op's module, sequence
number and source line; a backward op reads the tag of the node the autograd engine is running
(`torch._C._current_autograd_node()`). A parameter's AccumulateGrad node is attributed to the
module owning the parameter.

Optimizer: torch.optim's global step hooks.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"


class Scope:
    """Tracks the innermost module and the phase while active (`with Scope(): ...`)."""

    def __init__(self) -> None:
        self._stack: list[str] = []
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = (
            weakref.WeakKeyDictionary())
        self._in_optimizer = 0
        self._handles: list[Any] = []
        self._untagged: list[torch.Tensor] = []
        self._tag: tuple[str, int, str] = ("", -1, "")
        self._owners: dict[int, str] = {}
        self._owners_built = -1

    def __enter__(self) -> Scope:
        self._handles = [
            register_module_forward_pre_hook(self._fw_enter),
            register_module_forward_hook(self._fw_exit, always_call=True),
            register_optimizer_step_pre_hook(self._opt_enter),
            register_optimizer_step_post_hook(self._opt_exit),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        self.tag_pending()
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- forward module stack ------------------------------------------------------------

    def _name(self, mod: torch.nn.Module) -> str:
        name = self._names.get(mod)
        if name is None:
            # First sight of a module outside any known tree: it is a root. Name its whole
            # tree now, as ModTracker does: RootClass.child.grandchild.
            name = self._names[mod] = type(mod).__name__
            for sub_name, sub in mod.named_modules():
                if sub_name and sub not in self._names:
                    self._names[sub] = f"{name}.{sub_name}"
        return name

    def _fw_enter(self, mod: torch.nn.Module, _args: Any) -> None:
        if torch._C._current_graph_task_id() == -1:  # modules re-run in backward don't nest
            self._stack.append(self._name(mod))

    def _fw_exit(self, mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        if torch._C._current_graph_task_id() != -1 or not self._stack:
            return
        name = self._name(mod)
        if self._stack[-1] == name:
            self._stack.pop()
        elif name in self._stack:  # an exception skipped inner exits
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(name):]

    def _opt_enter(self, *_: Any) -> None:
        self._in_optimizer += 1

    def _opt_exit(self, *_: Any) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)

    # -- forward -> backward attribution ------------------------------------------------------

    def forward_outputs(self, outputs: list[torch.Tensor], tag: tuple[str, int, str]) -> None:
        """Remember a forward op's outputs; their autograd nodes get `tag` on the next op.

        The dispatch mode runs below autograd, so `grad_fn` is attached only after it returns.
        """
        self.tag_pending()
        self._untagged = outputs
        self._tag = tag

    def tag_pending(self) -> None:
        for t in self._untagged:
            node = t.grad_fn
            if node is not None and "accuracy" not in node.metadata:
                node.metadata["accuracy"] = self._tag
        self._untagged = []

    def backward_origin(self) -> tuple[str, int, str] | None:
        """(module, forward seq, forward source) of the autograd node now running, if known."""
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        tag = node.metadata.get("accuracy")
        if tag is None and hasattr(node, "variable"):  # AccumulateGrad of a parameter
            owner = self._param_owner(node.variable)
            if owner:
                tag = node.metadata["accuracy"] = (owner, -1, "")
        return tag

    def _param_owner(self, param: torch.Tensor) -> str:
        if len(self._names) != self._owners_built:
            self._owners = {
                id(p): name for mod, name in list(self._names.items())
                for p in mod.parameters(recurse=False)
            }
            self._owners_built = len(self._names)
        return self._owners.get(id(param), "")

    # -- what the dumper asks -----------------------------------------------------------------

    @property
    def phase(self) -> str:
        if torch._C._current_graph_task_id() != -1:
            return BACKWARD
        if self._in_optimizer:
            return OPTIMIZER
        return FORWARD

    @property
    def module(self) -> str:
        """Fully qualified name of the innermost active module ('' outside any module)."""
        if torch._C._current_graph_task_id() != -1:
            origin = self.backward_origin()
            return origin[0] if origin is not None else ""
        return self._stack[-1] if self._stack else ""
