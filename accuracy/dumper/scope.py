"""Where an op runs: module path (forward and backward) and phase.

Forward module scope comes from PyTorch's own ModTracker; the optimizer phase from
torch.optim's global step hooks. Backward ops are attributed exactly: each forward op's
autograd node is tagged with the forward op's module, sequence number and source line, and a
backward op reads the tag of the node the autograd engine is running. ModTracker's gradient
hooks are the fallback for nodes created outside the block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._tools.mod_tracker import ModTracker
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"


class Scope:
    """Tracks the innermost module and the phase while active (`with Scope(): ...`)."""

    def __init__(self) -> None:
        self._tracker = ModTracker()
        self._in_optimizer = 0
        self._handles: list[Any] = []
        self._cache_key: frozenset[str] | None = None
        self._cache_val = ""
        self._bw_stack: list[str] = []  # modules whose backward started, most recent last
        self._tracker.register_user_hooks(pre_bw_hook=self._bw_enter, post_bw_hook=self._bw_exit)
        self._untagged: list[torch.Tensor] = []
        self._owners: dict[int, str] = {}
        self._owners_built = -1

    def __enter__(self) -> Scope:
        self._tracker.__enter__()
        self._handles = [
            register_optimizer_step_pre_hook(self._opt_enter),
            register_optimizer_step_post_hook(self._opt_exit),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        self.tag_pending()
        for h in self._handles:
            h.remove()
        self._handles = []
        self._tracker.__exit__(*exc)

    def _bw_enter(self, mod: Any, _grads: Any) -> None:
        name = self._tracker.get_known_fqn(mod) if mod is not None else None
        if name:
            self._bw_stack.append(name)

    def _bw_exit(self, mod: Any, _grads: Any) -> None:
        name = self._tracker.get_known_fqn(mod) if mod is not None else None
        if name and name in self._bw_stack:
            del self._bw_stack[len(self._bw_stack) - 1 - self._bw_stack[::-1].index(name)]

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
        known = self._tracker._known_modules
        if len(known) != self._owners_built:
            self._owners = {
                id(p): name for mod, name in list(known.items())
                for p in mod.parameters(recurse=False)
            }
            self._owners_built = len(known)
        return self._owners.get(id(param), "")

    @property
    def phase(self) -> str:
        if torch._C._current_graph_task_id() != -1:
            return BACKWARD
        if self._in_optimizer:
            return OPTIMIZER
        return FORWARD

    @property
    def module(self) -> str:
        """Fully qualified name of the innermost active module ('' outside any module).

        Forward nesting is strict, so the deepest active name is the innermost. In backward a
        module whose inputs need no gradient never reports its end, so the most recently
        started module's backward is the one running.
        """
        if torch._C._current_graph_task_id() != -1:
            origin = self.backward_origin()
            if origin is not None:
                return origin[0]
            return self._bw_stack[-1] if self._bw_stack else ""
        self._bw_stack.clear()
        parents = self._tracker.parents
        if len(parents) <= 1:
            return ""
        key = frozenset(parents)
        if key != self._cache_key:
            names = [p for p in parents if p != "Global"]
            self._cache_val = max(names, key=lambda n: (n.count("."), n)) if names else ""
            self._cache_key = key
        return self._cache_val
