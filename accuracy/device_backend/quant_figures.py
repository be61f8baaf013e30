"""The hand-over of quantisation figures from `sim` to whoever records the op.

`sim` quantises a GEMM's operands inside the kernel, below the dumper; it `publish`es one dict
of figures per operand (see formats.operand_figures), and the dumper's observer `take`s them
after the op returns and writes them into the op's record. Neither side imports the other:
this module is the whole contract. Per thread, as dispatch is.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCAL = threading.local()
_SUBSCRIBERS = [0]  # recorders listening (any thread): figures cost ~1.5x the cast itself


def subscribe() -> None:
    """A recorder wants figures from now on (pair with `unsubscribe`)."""
    _SUBSCRIBERS[0] += 1


def unsubscribe() -> None:
    _SUBSCRIBERS[0] = max(0, _SUBSCRIBERS[0] - 1)


def wanted() -> bool:
    """Whether anyone records figures; a quantiser may skip computing them when not."""
    return _SUBSCRIBERS[0] > 0


def publish(figures: list[dict[str, Any]]) -> None:
    """Figures of the op being run (appended to any not yet taken)."""
    pending = getattr(_LOCAL, "pending", None)
    if pending is None:
        pending = _LOCAL.pending = []
    pending.extend(figures)


def take() -> list[dict[str, Any]]:
    """Figures published since the last take, which clears them."""
    pending = getattr(_LOCAL, "pending", None)
    if not pending:
        return []
    _LOCAL.pending = []
    return pending
