"""Which op calls the live tools act on.

Shared by the live check and substitution: one op/module/phase filter (the patterns of
`accuracy.patterns`), the calls in a sample, and the ops no reference can re-run
(collectives, rng draws, uninitialised factories) with the reason shown to the user. Where
each call runs (phase, module, source line) is the loop's placing step, the dumper's
(accuracy/dumper/sites.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from accuracy.aten import UNINITIALISED
from accuracy.dumper.scope import BACKWARD, FORWARD, OPTIMIZER
from accuracy.patterns import module_matches, op_matches
from accuracy.replay.ops import RNG_REASON, rng_disabled
from accuracy.replay.registry import lookup_reference

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
class CallSelection:
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
              calls: Iterable[int] | None = None) -> CallSelection:
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
