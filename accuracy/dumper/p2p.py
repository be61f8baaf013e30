"""Point-to-point communication as the dumper records it: sends, and receives once they arrived.

A gloo point-to-point `Work` (`c10d.send`, `c10d.recv_`, and the `isend`/`irecv` that
`batch_isend_irecv` and the pipelining schedules issue) can be waited once, and the user's
code waits for it (`dist.send`/`dist.recv` do, the schedules do): waiting for it ourselves
hangs the step (issue 48). A dispatch mode never sees the user's `wait()`, so a receive's
row is written when its data is known to be there:

- when a later op reads its buffer (the user must have waited before reading it): the
  reader's phase is the receive's (a gradient is read by the backward, an activation by the
  forward, even where a schedule waits for both at once, as 1F1B does);
- when its `Work.is_completed()` says so and no op read it: at close, or once more than
  `MAX_PENDING` receives wait unread;
- a receive still pending when the dump closes is written with its buffers as metadata
  only, and named in the root attribute `receives_pending` (said first as `BLIND:`).

What a receive wrote is its row's outputs (the received bytes, recorded afresh), so every
later op reading the buffer points at them, compare judges them against golden's and replay
takes them as its inputs. A send's data is its input, recorded before it was sent.

Phase: a send belongs to the phase of the op before it on this rank (a pipeline stage sends
a gradient right after the backward that made it, from outside autograd), a receive to the
phase of the op that first reads what arrived.
`CollectiveWatch.settle` (accuracy/dumper/collectives.py) writes each op's peer, tag and the
index that pairs a send with its peer's receive (`p2p_index`); the offline check pairs them
(accuracy/replay/collectives.py).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import torch

from accuracy.dumper.calls import OpCall
from accuracy.dumper.scope import FORWARD
from accuracy.dumpfile import schema

if TYPE_CHECKING:
    from accuracy.dumper.calls import Call
    from accuracy.dumper.recorder import Recorder

log = logging.getLogger(__name__)

# receives held unread at once; beyond it, those whose Work completed are written now
MAX_PENDING = 64


def _storage_id(t: torch.Tensor) -> int | None:
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return None
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def _work(result: Any) -> Any:
    """The c10d Work a receive returned (None when it cannot be had)."""
    if isinstance(result, torch.ScriptObject):
        try:
            return torch._C._distributed_c10d.Work.unbox(result)
        except (RuntimeError, AttributeError):
            return None
    return None


@dataclasses.dataclass(slots=True, eq=False)
class _Pending:
    call: OpCall
    work: Any
    storages: frozenset[int]

    def completed(self) -> bool:
        try:
            return self.work is not None and bool(self.work.is_completed())
        except RuntimeError:  # a failed receive: its error is the user's to see
            return False


class P2PWatch:
    """Observer of every call (registered after `CollectiveWatch`, before the recorder):
    places sends in the phase before them, holds each shown receive until its data is
    there, then writes it through the recorder (`Recorder.write_received`)."""

    def __init__(self, recorder: Recorder | None) -> None:
        self.recorder = recorder
        self.pending: list[_Pending] = []
        self.last_phase = FORWARD
        self.still_pending: list[dict[str, Any]] = []

    def before(self, call: Call) -> None:
        if self.pending:
            self._arrivals(call)
        kind = call.plan.collective
        if kind == "send":
            call.site = dataclasses.replace(call.site, phase=self.last_phase)
        elif kind != "recv":
            self.last_phase = call.site.phase

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        if call.plan.collective != "recv" or type(call) is not OpCall or not call.shown:
            return
        with torch._C._DisableTorchDispatch():
            ids = frozenset(i for t in call.inputs if (i := _storage_id(t)) is not None)
        self.pending.append(_Pending(call, _work(call.result), ids))

    def _arrivals(self, call: Call) -> None:
        with torch._C._DisableTorchDispatch():
            reads = {i for t in call.inputs if (i := _storage_id(t)) is not None}
        keep = []
        crowded = len(self.pending) > MAX_PENDING
        for p in self.pending:
            if p.storages & reads:  # the user waited before reading it
                self._write(p, call.site.phase)
            elif crowded and p.completed():
                self._write(p, self.last_phase)
            else:
                keep.append(p)
        self.pending = keep

    def _write(self, p: _Pending, phase: str, arrived: bool = True) -> None:
        call = p.call
        call.site = dataclasses.replace(call.site, phase=phase)
        note = call.collective
        if note is not None and note.get("peer") == -1 and p.work is not None:
            try:  # recv_any_source_: the sender is known once it arrived
                note["peer"] = note["src"] = int(p.work._source_rank())
            except (RuntimeError, AttributeError):
                pass
        if not arrived:
            call.extra[schema.EXTRA_RECEIVE_PENDING] = True
            self.still_pending.append({"seq": call.seq, "peer": (note or {}).get("peer", -1),
                                       "tag": (note or {}).get("tag", 0)})
        if self.recorder is not None:
            self.recorder.write_received(call, arrived)

    def finish(self) -> dict[str, Any]:
        for p in self.pending:
            self._write(p, self.last_phase, arrived=p.completed())
        self.pending = []
        if not self.still_pending:
            return {}
        log.warning("%d point-to-point receive(s) had not arrived when the dump closed: "
                    "recorded without their data", len(self.still_pending))
        return {schema.ROOT_RECEIVES_PENDING: self.still_pending}
