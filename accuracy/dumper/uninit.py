"""Bytes that are not data yet: uninitialised memory followed until something fills it.

An `empty*` output is whatever memory held. Stacks like FSDP2 allocate such buffers, take views
of them, hand them to custom ops that fill one part (`fsdp.all_gather_copy_in` copies this
rank's shard into the all-gather buffer) and to collectives that fill the rest. Until then,
every view of the buffer holds garbage that differs from run to run: recorded as data it
becomes a false divergence and a false culprit.

`Uninitialised` keeps, per storage, the byte ranges no op has written yet. A tensor use whose
bytes touch such a range is *not data*: the recorder stores its metadata only and names it in
the op's `extra["uninitialized_io"]` (`schema.EXTRA_UNINITIALIZED_IO`), and compare and replay
never judge it. What fills memory
comes from the op registry (`accuracy.aten`): fresh outputs of ordinary ops, the written
arguments of overwriting ops (`copy_`, `fill_`, `out=`), the outputs of collectives that
receive data (all-gather, reduce-scatter, broadcast, a point-to-point receive), and for ops
returning a buffer they fill only partly (`aten.PARTLY_FILLED_OUTPUTS`), everything but that
buffer. What an ATen op computes from such bytes is not data either (a pipeline stage runs its
forward once on an `empty_strided` input to learn its output shapes): its outputs are marked.

`MemoryWatch` is the loop's observer that keeps one `Uninitialised` up to date through every
call, shown or not to the others (accuracy/dumper/loop.py); the recorder asks it which inputs
and outputs are not data, and the live check (`accuracy/live/check.py`), on its own loop,
leaves an op unjudged when it reads such bytes or leaves an output touching them: one
definition of "bytes that are not data" for the dump, compare, replay and the live check.

A storage is identified by its StorageImpl and checked against a weak reference on every
look-up (memory freed and its address reused is never taken for the old buffer). A storage
an uninitialised factory made stays watched after it is filled: when its data pointer changes
without any op we saw (FSDP2 frees an unsharded parameter with `storage.resize_(0)` after
forward and brings it back with `resize_(n)` for backward), it holds fresh garbage again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from accuracy.aten import overwritten_ids
from accuracy.dumper.calls import produced

if TYPE_CHECKING:
    from accuracy.aten import OpPlan
    from accuracy.dumper.calls import Call

log = logging.getLogger(__name__)

Range = tuple[int, int]  # [start, end) in bytes, from the storage's start


def _span(t: torch.Tensor) -> tuple[Range, bool] | None:
    """The bytes `t` can touch, and whether it covers all of them (dense, no overlap)."""
    n = t.numel()
    if n == 0:
        return None
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(),
                                                                     strict=True))
    es = t.element_size()
    start = t.storage_offset() * es
    return (start, start + span * es), span == n


class _Marks:
    __slots__ = ("ptr", "ranges", "ref")

    def __init__(self, ref: StorageWeakRef, ptr: int, ranges: list[Range]) -> None:
        self.ref, self.ptr, self.ranges = ref, ptr, ranges


class Uninitialised:
    """Storage -> byte ranges not written since an uninitialised factory made them."""

    def __init__(self, prune_at: int = 4096) -> None:
        self._marks: dict[int, _Marks] = {}
        self._prune_at = prune_at

    def __bool__(self) -> bool:
        return bool(self._marks)

    def _storage(self, t: torch.Tensor) -> Any:
        # nn.Parameter and other plain subclasses have storage; wrappers (DTensor) do not
        if t.layout != torch.strided or is_traceable_wrapper_subclass(t):
            return None
        try:
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None

    def _live(self, t: torch.Tensor) -> tuple[Any, _Marks | None]:
        s = self._storage(t)
        if s is None:
            return None, None
        m = self._marks.get(s._cdata)
        if m is None:
            return s, None
        if m.ref.expired():  # freed, and the StorageImpl's address reused
            del self._marks[s._cdata]
            return s, None
        ptr = s.data_ptr()
        if ptr != m.ptr:
            # Reallocated without a dispatched op (FSDP2 frees an unsharded parameter with
            # `storage.resize_(0)` and brings it back with `resize_(n)`): fresh memory again.
            m.ptr = ptr
            m.ranges = [(0, s.nbytes())] if ptr and s.nbytes() else []
        return s, m

    def holds(self, t: torch.Tensor) -> bool:
        """Whether any byte `t` views is uninitialised (call with dispatch disabled)."""
        if not self._marks:
            return False
        _, m = self._live(t)
        if m is None or not m.ranges:
            return False
        sp = _span(t)
        if sp is None:
            return False
        (a, b), _ = sp
        return any(s < b and a < e for s, e in m.ranges)

    def mark(self, t: torch.Tensor) -> None:
        """`t` (an uninitialised factory's output) holds no data."""
        s = self._storage(t)
        sp = _span(t)
        if s is None or sp is None:
            return
        if len(self._marks) >= self._prune_at:
            self._marks = {k: m for k, m in self._marks.items() if not m.ref.expired()}
            self._prune_at = max(self._prune_at, 2 * len(self._marks))
        try:
            self._marks[s._cdata] = _Marks(StorageWeakRef(s), s.data_ptr(), [sp[0]])
        except (RuntimeError, TypeError) as e:  # cannot be followed: judged like data
            log.debug("uninitialised buffer not followed: %s", e)

    def fill(self, t: torch.Tensor) -> None:
        """`t`'s bytes were written with data (only a dense `t` clears what it spans)."""
        if not self._marks:
            return
        s, m = self._live(t)
        if m is None or not m.ranges:
            return
        sp = _span(t)
        if sp is None or not sp[1]:
            return
        a, b = sp[0]
        left: list[Range] = []
        for s0, e0 in m.ranges:
            if e0 <= a or b <= s0:
                left.append((s0, e0))
                continue
            if s0 < a:
                left.append((s0, a))
            if b < e0:
                left.append((b, e0))
        m.ranges = left  # kept when empty: a later reallocation is seen by its data pointer

    def taint(self, t: torch.Tensor) -> None:
        """`t`'s bytes were computed from bytes that are not data: not data either."""
        s, m = self._live(t)
        sp = _span(t)
        if s is None or sp is None:
            return
        if m is None:
            self.mark(t)
        else:
            m.ranges.append(sp[0])

    def reads_unfilled(self, plan: OpPlan, inputs: list[torch.Tensor],
                       written: set[int]) -> bool:
        """Whether an ATen op computes from bytes that are not data: an input it reads (not
        one it only overwrites) touches them. Collectives, views and custom ops (FSDP2's
        copy-in fills part of a buffer it was handed) are left to `after`'s own rules."""
        if not self._marks or not plan.aten or plan.collective is not None \
                or plan.uninitialised or (plan.alias_outputs and not plan.mutable) \
                or plan.name.startswith("aten.set_."):  # views another storage: its own marks
            return False
        return any(id(t) not in written and self.holds(t) for t in inputs)

    def after(self, plan: OpPlan, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
              written: set[int], tainted: bool = False) -> None:
        """Update the marks for one op that ran: what it made uninitialised, what it filled.
        `written` holds the ids of the arguments it overwrote (not read-modify-write).
        `tainted` (`reads_unfilled` before it ran): what it wrote is not data either (a
        pipeline stage's shape-inference forward on an `empty_strided` input)."""
        if plan.uninitialised:
            for t in outputs:
                self.mark(t)
            return
        if tainted:
            for t in outputs:
                self.taint(t)
            return
        if not self._marks:
            return
        for t in inputs:
            if id(t) in written:
                self.fill(t)
        keep = plan.partly_filled
        if plan.collective == "recv":  # its buffers hold data once the user's wait returns
            for t in inputs:
                self.fill(t)
            return
        if plan.collective in ("all_reduce", "wait", "barrier", "other", "send"):
            return  # reduced in place, or nothing received: the state carries over
        for i, t in enumerate(outputs):
            if i in keep:
                continue
            if plan.collective is not None or not plan.alias_outputs:
                self.fill(t)


class MemoryWatch:
    """Observer of every call of a loop (also those its filter leaves unshown to the others):
    follows uninitialised memory through each eager op that ran, what it allocated
    uninitialised and what it filled. Registered before the observers that ask it (`memory`),
    so they see each op's effect after it. A kernel launch writes through raw pointers that
    this does not follow: its buffers are Inductor's own, never an `empty*` the step made."""

    def __init__(self) -> None:
        self.memory = Uninitialised()
        self._tainted = False  # the call between before and after reads unfilled bytes

    def before(self, call: Call) -> None:
        memory = self.memory
        if not memory or call.func is None:
            self._tainted = False
            return
        written = overwritten_ids(call.plan, call.args, call.kwargs)
        with torch._C._DisableTorchDispatch():
            self._tainted = memory.reads_unfilled(call.plan, call.inputs, written)

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        plan = call.plan
        tainted, self._tainted = self._tainted, False
        if not (plan.uninitialised or self.memory) or call.func is None:
            return
        outputs = produced(call, outputs)  # a fused op's results are its writes
        written = overwritten_ids(plan, call.args, call.kwargs)
        with torch._C._DisableTorchDispatch():
            self.memory.after(plan, call.inputs, outputs, written, tainted)

    def finish(self) -> dict[str, Any]:
        return {}
