"""The call records the loop hands its observers, and the protocol of an observer.

After torch/utils/_debug_mode (`_OpCall` and `_TritonKernelCall`, both appended to one call
list): the loop (accuracy/dumper/loop.py) builds an `OpCall` per eager ATen op and takes a
`KernelCall` per compiled kernel launch, places each (one `CallSite`: seq, op, phase, module,
source, step, rank), and shows it to the same observers: `before(call)`, the call runs,
`after(call, outputs)`. The recorder, the overflow watcher, the golden feeder, the quant and
subclass watchers, the memory and collective watchers, the live check and a user's own
observer are all such observers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from accuracy.aten import returns_nothing, written_tensors
from accuracy.records import CallSite, SiteFields

if TYPE_CHECKING:
    import torch

    from accuracy.aten import OpPlan

UNPLACED = CallSite(-1, "", "", "", "")  # a call the loop has not placed yet
NO_EPOCH = -1  # a call whose collective epoch no observer set (no CollectiveWatch)


@dataclass(slots=True, eq=False)
class Call(SiteFields):
    """What every observer reads of a call: what it is (`plan`), where it ran (`site`),
    the tensors it read (`inputs`), and what observers add to its record (`extra`).

    `func`/`args`/`kwargs` are what an eager op runs on (an observer's `before` may replace
    them, as load mode does; it then updates `inputs` too); a kernel launch has none.
    """

    plan: OpPlan
    inputs: list[torch.Tensor]
    site: CallSite = UNPLACED
    func: Any = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    stack: str = ""  # the full user stack, JSON, with dumper(stack=True)
    epoch: int = NO_EPOCH  # collectives this rank issued before the call (CollectiveWatch)
    fwd_seq: int = -1  # backward ops: the seq of the forward op they differentiate
    collective: dict[str, Any] | None = None  # a settled collective's note (CollectiveWatch)
    extra: dict[str, Any] = field(default_factory=dict)
    # False: the filter left the call out; only observers of every call are shown it
    shown: bool = True

    @property
    def name(self) -> str:
        return self.plan.name


@dataclass(slots=True, eq=False)
class OpCall(Call):
    """One eager ATen call: the loop runs `func(*args, **kwargs)` between the observers'
    `before` and `after`; `result` is what it returned (a collective's `Work` included),
    while the observers' `after` run (then dropped: a call an observer keeps holds no
    output alive)."""

    result: Any = None


@dataclass(slots=True, eq=False)
class KernelCall(Call):
    """One launch of a compiled kernel (op `inductor.<kernel>`): it reaches the loop after
    it ran, with the buffers it wrote as its outputs, so `before` and `after` both come after
    the launch. `inputs` hold the values it read (a buffer it overwrote in place is a copy
    taken before the launch); `links`: input index -> the recorded state a copy taken before
    the launch holds (memory another write filled). `kernel` is the launch site's description
    (accuracy/dumper/compiled/kernels.py: KernelInfo), which placing the call reads."""

    links: dict[int, Any] = field(default_factory=dict)
    kernel: Any = None


def produced(call: Call, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors a call produced: its outputs, or for a fused/foreach op that returns
    nothing (`_fused_adamw_`, `_foreach_add_`), the tensors it wrote, in schema order."""
    if outputs or call.func is None or not call.plan.mutable:
        return outputs
    if not returns_nothing(call.func):
        return outputs
    return written_tensors(call.func, call.args, call.kwargs)


class Observer(Protocol):
    """What the loop calls around each call it shows (see `Loop.observe`).

    An error an observer raises leaves that call unrecorded and is counted (the dump's
    `ops_not_recorded`); only `accuracy.errors.RaisedForTheUser` reaches the user's step.
    """

    def before(self, call: Call) -> None:
        """Before the call runs (inputs hold their pre-call values)."""

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        """After the call ran (and, for a collective, after its data arrived)."""

    def finish(self) -> dict[str, Any]:
        """At the end of the block: attributes for the dump's root ({} for none)."""
