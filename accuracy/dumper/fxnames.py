"""Module names inside an FX GraphModule (aot_eager/eager graphs, `torch.export` programs).

A GraphModule runs its whole graph in one generated `forward`: module hooks see only
`GraphModule`. Each node keeps the module it came from (`meta["nn_module_stack"]`), and the
generated code maps its line numbers to nodes (`_lineno_map`), so the node running an op is
found from the frame of the generated `forward` that called it.
"""

from __future__ import annotations

import sys
from typing import Any

from accuracy.dumper.compiled.names import module_path


def _path(entry: Any) -> str:
    return module_path(str(entry[0])) if isinstance(entry, tuple | list) and entry else ""


def root_name(gm: Any) -> str:
    """The class name of the module a graph was traced from ('' if unknown)."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            first = list(stack.values())[0]
            if not _path(first):
                return getattr(first[1], "__name__", None) or str(first[1]).rsplit(".", 1)[-1]
            return ""
    return ""


class GraphNames:
    """Resolves the module of the node a GraphModule is running."""

    def __init__(self, gm: Any, base: str) -> None:
        self.gm, self.base = gm, base
        fwd = getattr(type(gm), "forward", None)
        code = getattr(fwd, "__code__", None)
        self.code = code
        self.first = code.co_firstlineno if code is not None else 0
        self.lines = getattr(gm, "_lineno_map", None) or {}
        self.nodes = list(gm.graph.nodes)
        self._cache: dict[int, str] = {}

    def module(self) -> str:
        if self.code is None or not self.lines:
            return self.base
        f = sys._getframe(1)
        for _ in range(64):
            if f is None:
                return self.base
            if f.f_code is self.code:
                break
            f = f.f_back
        else:
            return self.base
        name = self._cache.get(f.f_lineno)
        if name is None:
            idx = self.lines.get(f.f_lineno - self.first)
            node = self.nodes[idx] if idx is not None and idx < len(self.nodes) else None
            stack = node.meta.get("nn_module_stack") if node is not None else None
            rel = _path(list(stack.values())[-1]) if stack else ""
            name = f"{self.base}.{rel}" if self.base and rel else (rel or self.base)
            self._cache[f.f_lineno] = name
        return name
