"""The modules whose forward is running, for `sim`'s module patterns (faults,
`high_precision`), inside `torch.compile`d modules too.

Under `sim` a compiled module runs its Python frames eagerly (dynamo does not compile while a
dispatch mode is active), yet torch's ModTracker ignores every module inside an
`OptimizedModule`, so a module-scoped fault met no call on a compiled model while the dump
named the very op's module. `sim` needs only the forward's modules (a backward op reads the
modules its autograd node was tagged with in forward), so this tracker is the forward half,
with names as the eager model's and the dump's: a root by its class, the rest by path
(`Net.layers.1.fc`); a compile wrapper and its `_orig_mod` are transparent.
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from typing import Any

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

_ORIG_MOD = re.compile(r"\._orig_mod(?=\.|$)")


def _is_wrapper(mod: Any) -> bool:
    """A `torch.compile(module)` wrapper: the module it wraps runs inside and is named."""
    return type(mod).__name__ == "OptimizedModule" and \
        isinstance(getattr(mod, "_orig_mod", None), torch.nn.Module)


class ForwardModules:
    """`parents`: the names of the modules whose forward is running (a context manager)."""

    def __init__(self) -> None:
        self.parents: set[str] = set()
        self._depth: Counter[str] = Counter()
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = \
            weakref.WeakKeyDictionary()
        self._handles: list[Any] = []

    def name(self, mod: torch.nn.Module) -> str:
        """A module first seen names itself by class and its submodules by path."""
        name = self._names.get(mod)
        if name is None:
            root = mod._orig_mod if _is_wrapper(mod) else mod
            name = type(root).__name__
            for path, sub in mod.named_modules():
                if path and sub not in self._names:
                    self._names[sub] = _ORIG_MOD.sub("", f"{name}.{path}")
            self._names[mod] = name
        return name

    def _enter(self, mod: torch.nn.Module, _input: Any) -> None:
        if _is_wrapper(mod) or torch.compiler.is_compiling():
            return
        name = self.name(mod)
        self._depth[name] += 1
        self.parents.add(name)

    def _exit(self, mod: torch.nn.Module, _input: Any, _output: Any) -> None:
        if _is_wrapper(mod) or torch.compiler.is_compiling():
            return
        name = self.name(mod)
        if self._depth[name] > 0:
            self._depth[name] -= 1
            if self._depth[name] == 0:
                self.parents.discard(name)

    def __enter__(self) -> ForwardModules:
        self._handles = [register_module_forward_pre_hook(self._enter),
                         register_module_forward_hook(self._exit, always_call=True)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.parents.clear()
        self._depth.clear()
