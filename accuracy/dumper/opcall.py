"""One op call as the dump loop sees it, and the protocol of what observes it.

After torch/utils/_debug_mode's `_OpCall` and its hooks of one signature: the dispatch loop
(accuracy/dumper/core.py) builds an `OpCall` per op, calls every observer's `before(call)`,
runs the op, then every observer's `after(call, outputs)`. The recorder, the overflow watcher
and the golden feeder (load mode) are such observers; what they write goes through the one
write path, `Recorder.write`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from accuracy.aten import OpPlan


@dataclass(slots=True)
class OpCall:
    """One ATen call: what it is, where it ran, and its tensors.

    `args`/`kwargs` are what the op runs on (an observer's `before` may replace them, as load
    mode does; then it updates `inputs` too). `extra` gathers what observers add to the op's
    record.
    """

    func: Any
    plan: OpPlan
    seq: int
    phase: str
    module: str
    source: str
    stack: str
    step: int
    epoch: int
    args: tuple
    kwargs: dict
    inputs: list[torch.Tensor]
    fwd_seq: int = -1  # backward ops: the seq of the forward op they differentiate
    collective: dict[str, Any] | None = None  # the settled collective's note
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.plan.name


class Observer(Protocol):
    """What the dump loop calls around each op it watches."""

    def before(self, call: OpCall) -> None:
        """Before the op runs (inputs hold their pre-op values)."""

    def after(self, call: OpCall, outputs: list[torch.Tensor]) -> None:
        """After the op ran (and, for a collective, after its data arrived)."""

    def finish(self) -> dict[str, Any]:
        """At the dumper's exit: attributes for the dump's root."""
