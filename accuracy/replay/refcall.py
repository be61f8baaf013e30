"""One op call as a reference re-runs it, and where and how it runs: what `ops.rerun` takes.

Shared by replay (eager rows and compiled kernels' ATen graphs) and the live check; a module
of its own so that `replay/kernels.py`, which `ops` imports, can build them too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ReferenceCall:
    """One op call as the reference re-runs it: its seq and name, the function run (the op,
    a registered reference, dropout's mask replay, a kernel's ATen graph), `build(up)` giving
    its (args, kwargs) on the reference for `up` in ("none", the asked upcast), and a note
    said with its outcome."""

    seq: int
    op: str
    fn: Any
    build: Callable[[str], tuple[list[Any], dict[str, Any]]]
    note: str = ""


@dataclass(frozen=True)
class Reference:
    """Where and how calls are re-run: the reference device, the upcast asked for ("fp64",
    "fp32" or "none"), and whether an outcome keeps the same-dtype outputs (contiguous, on
    the host)."""

    device: torch.device
    upcast: str
    keep: bool = True
