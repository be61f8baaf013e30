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
