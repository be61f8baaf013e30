"""Whether inf/nan born in an op reached anything that lasted, or later ops dropped it.

T5 computes `log(relative_position / max_exact)`: log(0) is -inf where a position is 0, and
the -inf is cast to integers that `where` then discards. Such a birth is *contained*: every
tensor that carried its non-finite values was read by a later op, at least one of those ops
made only finite or integer outputs from them, none handed a value to Python (`.item()`), and
all those tensors are gone. A birth whose values live on (in the loss, a gradient, a buffer)
past a window of ops, reach Python, or are freed without any op reading them stays an
overflow, and so does one carried on into `window` tensors (a real overflow spreads op after
op to the loss: it is reported then, not at the block's end). Liveness comes from weak
references: Python frees a temporary when its last user is done with it, so a contained
lineage is known within a few ops.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

CONFIRM, CONTAIN = "confirm", "contain"


def version_of(t: torch.Tensor) -> int:
    """`t._version`, or -1 for an inference tensor (which has none)."""
    try:
        return t._version
    except RuntimeError:
        return -1


@dataclass(eq=False, slots=True)
class _Carrier:
    ref: weakref.ref
    version: int
    read: bool = False


def _holds(c: _Carrier) -> bool:
    """The carrier's tensor is alive and not overwritten since (an in-place op that kept
    its values non-finite made it a carrier again, at its new version)."""
    t = c.ref()
    return t is not None and version_of(t) == c.version


@dataclass(eq=False)
class Lineage:
    """The tensors that carry one birth's non-finite values, as later ops pass them on."""

    last: int  # the op count when a carrier was last made or read
    carriers: dict[int, _Carrier] = field(default_factory=dict)  # id(tensor) -> carrier
    absorbed_by: str = ""  # the first op that read a carrier and made no non-finite output
    escaped: str = ""  # the first op that read a carrier and gave Python a value, no tensor
    made: int = 0  # carriers made so far (a freed one's id may be reused: not len(carriers))

    def add(self, t: torch.Tensor) -> None:
        self.carriers[id(t)] = _Carrier(weakref.ref(t), version_of(t))
        self.made += 1

    def carries(self, key: tuple[int, int]) -> bool:
        """Whether the tensor with this (id, version), still alive, is a carrier."""
        c = self.carriers.get(key[0])
        return c is not None and c.version == key[1] and c.ref() is not None

    def read(self, key: tuple[int, int], now: int) -> None:
        self.carriers[key[0]].read = True
        self.last = now

    def verdict(self, now: int, window: int, final: bool) -> str | None:
        """CONFIRM, CONTAIN, or None while it cannot be told yet."""
        if self.escaped or self.made >= window:  # carried on op after op: it lasts
            return CONFIRM
        if any(_holds(c) for c in self.carriers.values()):
            return CONFIRM if final or now - self.last >= window else None
        if self.absorbed_by and all(c.read for c in self.carriers.values()):
            return CONTAIN
        return CONFIRM  # a carrier was freed unread: nothing tells us its values did not matter
