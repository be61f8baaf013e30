"""Which op calls the live tools act on, and where each runs (phase, module, source line).

Shared by the live check and substitution: one op/module/phase filter (the patterns of
`accuracy.patterns`), the ops no reference can re-run (collectives, rng draws, uninitialised
factories) with the reason shown to the user, and the dumper's module scope and source lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from accuracy import hops
from accuracy.aten import UNINITIALISED
from accuracy.dumper.scope import BACKWARD, FORWARD, OPTIMIZER, Scope
from accuracy.dumper.source import user_source
from accuracy.patterns import module_matches, op_matches
from accuracy.replay.ops import RNG_REASON, rng_disabled
from accuracy.replay.registry import lookup_reference

log = logging.getLogger(__name__)

PHASES = (FORWARD, BACKWARD, OPTIMIZER)
_COLLECTIVE_NAMESPACES = {"c10d", "_c10d_functional", "_c10d_functional_autograd",
                          "c10d_functional", "_dtensor"}
COLLECTIVE_REASON = "collective: its result depends on the other ranks' data"
UNINITIALISED_REASON = "uninitialised factory: its output is whatever memory held"


def _patterns(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def is_collective(name: str) -> bool:
    """c10d and functional-collective ops (and their wait/wrap helpers)."""
    return name.partition(".")[0] in _COLLECTIVE_NAMESPACES


def unrunnable(func: Any, name: str, args: tuple, kwargs: dict) -> str | None:
    """Why this call cannot be re-run on a reference with the same result, or None."""
    if is_collective(name):
        return COLLECTIVE_REASON
    if name in UNINITIALISED:
        return UNINITIALISED_REASON
    if (torch.Tag.nondeterministic_seeded in func.tags and name != "aten.native_dropout.default"
            and lookup_reference(name) is None and not rng_disabled(func, args, kwargs)):
        return RNG_REASON
    return None


@dataclass(frozen=True)
class Selection:
    """Op calls to act on: op patterns, module patterns, phases, or exact call indices."""

    ops: tuple[str, ...] = ()
    exclude_ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    phases: tuple[str, ...] = PHASES
    calls: frozenset[int] | None = None

    @classmethod
    def build(cls, ops: str | Iterable[str] | None = None,
              modules: str | Iterable[str] | None = None,
              exclude_ops: str | Iterable[str] | None = None,
              phases: str | Iterable[str] | None = None,
              calls: Iterable[int] | None = None) -> Selection:
        ph = _patterns(phases) or PHASES
        bad = [p for p in ph if p not in PHASES]
        if bad:
            raise ValueError(f"phases must be among {PHASES}, not {bad}")
        return cls(_patterns(ops), _patterns(exclude_ops), _patterns(modules), ph,
                   None if calls is None else frozenset(int(c) for c in calls))

    @property
    def empty(self) -> bool:
        """Selects nothing by name (an explicit empty call set)."""
        return self.calls is not None and not self.calls

    def wants(self, seq: int, name: str, module: str, phase: str) -> bool:
        if self.calls is not None and seq not in self.calls:
            return False
        if phase not in self.phases:
            return False
        if self.ops and not any(op_matches(p, name) for p in self.ops):
            return False
        if any(op_matches(p, name) for p in self.exclude_ops):
            return False
        return not self.modules or any(module_matches(p, module) for p in self.modules)


# Weyl sequences: frac(seq * _PHI + step * _SQRT2) is spread evenly over [0, 1) in any run of
# calls, and a step of N calls (N * _PHI irrational) lands a position elsewhere every step.
_PHI = (5 ** 0.5 - 1) / 2
_SQRT2 = 2 ** 0.5 - 1


def in_sample(seq: int, fraction: float, step: int = 0) -> bool:
    """Whether call `seq` of block `step` is in a `fraction` sample of calls.

    Deterministic (the same calls every run, nothing to seed), about `fraction` of any run of
    calls, and a different set in each step, whether steps are numbered (`step`) or one block
    spans them (`seq` goes on counting): a kernel wrong in every call is met within a few
    1 / fraction steps, at 1 / fraction less cost per step."""
    if fraction >= 1.0:
        return True
    return (seq * _PHI + step * _SQRT2) % 1.0 < fraction


def _hop_not_checked(name: str) -> None:
    log.warning("higher-order op %s has no eager implementation to run inside: its ops are "
                "not checked", name)


class _OwnerMode(TorchDispatchMode):
    """Hands every op to its owner's `_on_op`."""

    def __init__(self, owner: SiteMode) -> None:
        super().__init__()
        self.owner = owner

    supports_higher_order_operators = True  # FlexAttention, torch.cond...: accuracy/hops.py

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if hops.is_hop(func):  # its ATen ops come back here one by one
            return hops.run(self, func, args, kwargs or {}, _hop_not_checked)
        return self.owner._on_op(func, args, kwargs or {})


class SiteMode:
    """Base of the live tools: a dispatch mode, entered inside the module scope (Site), that
    hands every op to `_on_op(func, args, kwargs)`."""

    _site: Site | None = None
    _mode: Any = None

    def _on_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError

    def _start(self) -> None:
        self._site = Site().__enter__()
        self._mode = _OwnerMode(self)
        self._mode.__enter__()

    def _stop(self, *exc: Any) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(*exc)
        finally:
            if self._site is not None:
                self._site.__exit__(*exc)
            self._mode = self._site = None


class Site:
    """The dumper's module scope, for a dispatch mode that is not the dumper."""

    def __init__(self) -> None:
        self.scope = Scope()

    def __enter__(self) -> Site:
        self.scope.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.scope.__exit__(*exc)

    def locate(self, with_source: bool = True) -> tuple[str, str, str]:
        """(phase, module, source line) of the op being dispatched."""
        scope = self.scope
        scope.tag_pending()
        if torch._C._current_graph_task_id() != -1:
            origin = scope.backward_origin()
            if origin is not None:
                return BACKWARD, origin[0], origin[2]
            return BACKWARD, "", user_source()[0] if with_source else ""
        return scope.phase, scope.module, user_source()[0] if with_source else ""

    def after(self, phase: str, module: str, seq: int, source: str,
              outputs: list[torch.Tensor]) -> None:
        """Tag a forward op's outputs, so its backward ops know their module and source."""
        if phase == FORWARD:
            self.scope.forward_outputs(outputs, (module, seq, source))
