"""Snapshots: what is needed to re-run a step exactly, kept every K steps within a budget.

A snapshot, taken just before step s, holds copies of the model's state (parameters and
buffers), the optimizer's state, the state of every generator we can find in use (torch's CPU
generator, each CUDA device's when CUDA is initialised, Python `random`, numpy's global one
when numpy is loaded, and the counters of an active `sim` device), and, for every step from s
on, the batch the step was called with. Generators we cannot see (a private
`torch.Generator`, a data loader's worker state) are not kept: the bit-exact check on the
re-run says when that mattered.
"""

from __future__ import annotations

import copy
import logging
import random
import sys
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

from accuracy.dumper.collectives import local_tensor
from accuracy.errors import UsageError

log = logging.getLogger(__name__)


class SnapshotBudgetError(UsageError):
    """The budget cannot hold a single snapshot."""


def _flat_plain(obj: Any) -> list[Any] | None:
    """The items of a batch `(args, kwargs)` whose args and kwargs' values are plain tensors
    or scalars (the common batch): None for anything else, which takes the pytree path."""
    if not (type(obj) is tuple and len(obj) == 2 and type(obj[0]) is tuple
            and type(obj[1]) is dict):
        return None
    items = [*obj[0], *obj[1].values()]
    if all(type(x) is torch.Tensor or x is None or type(x) in (int, float, bool, str)
           for x in items):
        return items
    return None


def _nbytes(obj: Any) -> int:
    """Host or device bytes a copy of `obj` takes on this rank: a DTensor's own shard (FSDP2,
    tensor parallel), not its global size, which overstated a sharded model's snapshot by
    the world size and refused budgets that held it."""
    flat = _flat_plain(obj)
    if flat is not None:  # a pytree walk costs more than the batch's copy
        return sum(t.nbytes for t in flat if type(t) is torch.Tensor)
    total = 0
    for t in tree_leaves(obj):
        if isinstance(t, torch.Tensor):
            local = local_tensor(t)
            t = t if local is None else local
            total += t.numel() * t.element_size()
    return total


def _clone(obj: Any) -> Any:
    """A copy no dispatch mode sees; a DTensor is copied through its own dispatch (shard by
    shard, no collective): with all Python dispatch off, reading it crashes the process."""
    # the modes are popped only when there are some (a dumper, `sim`): popping none costs
    modes = _disable_current_modes() if torch._C._len_torch_dispatch_stack() else nullcontext()
    if isinstance(modes, nullcontext) and _flat_plain(obj) is not None:
        args, kwargs = obj  # detached copies record no graph: no grad-mode context needed
        return (tuple(_copy(x) for x in args), {k: _copy(v) for k, v in kwargs.items()})
    with modes, torch.no_grad():
        return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, obj)


def _copy(x: Any) -> Any:
    return x.detach().clone() if type(x) is torch.Tensor else x


def parse_bytes(value: int | str | None) -> int | None:
    """'2GB', '512MiB', 10**9 -> bytes; None -> None."""
    if value is None or isinstance(value, int):
        return value
    s = str(value).strip().upper().replace("IB", "B")
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "B": 1}
    for u, mult in units.items():
        if s.endswith(u):
            try:
                return int(float(s[: -len(u)]) * mult)
            except ValueError:
                break
    try:
        return int(s)
    except ValueError:
        raise UsageError(f"budget {value!r} is not a size: write e.g. 2GB, 512MB or bytes") \
            from None


def _sim_active() -> Any:
    mod = sys.modules.get("accuracy.device_backend.simulator")
    return mod.active() if mod is not None else None


def _vendor_device() -> tuple[str, Any] | None:
    """The out-of-tree accelerator registered in this process (torch_npu, torch_mlu, the npu
    test device: all plug in as PrivateUse1) and its `torch.<name>` module, when that module
    has the generator calls CUDA's has."""
    name = torch._C._get_privateuse1_backend_name()
    mod = getattr(torch, name, None) if name != "privateuseone" else None
    if mod is None or not all(hasattr(mod, f) for f in ("get_rng_state_all",
                                                         "set_rng_state_all")):
        return None
    return name, mod


def rng_state() -> dict[str, Any]:
    """States of every generator in use that we can reach: the host's, CUDA's and a vendor
    device's (its dropout masks are drawn there: without them a re-run step draws others)."""
    st: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    vendor = _vendor_device()
    if vendor is not None:
        st["device"] = (vendor[0], vendor[1].get_rng_state_all())
    np = sys.modules.get("numpy")
    if np is not None:
        st["numpy"] = np.random.get_state()
    sim = _sim_active()
    if sim is not None:
        st["sim"] = sim.state()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st:
        torch.cuda.set_rng_state_all(st["cuda"])
    vendor = _vendor_device()
    if "device" in st and vendor is not None and vendor[0] == st["device"][0]:
        vendor[1].set_rng_state_all(st["device"][1])
    if "numpy" in st:
        sys.modules["numpy"].random.set_state(st["numpy"])
    sim = _sim_active()
    if "sim" in st and sim is not None:
        sim.set_state(st["sim"])


@dataclass
class State:
    """Model, optimizer and generator states at the start of `step`."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    rng: dict[str, Any]
    nbytes: int
    extra: list[Any] = field(default_factory=list)

    @classmethod
    def take(cls, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None,
             stateful: tuple[Any, ...] = ()) -> State:
        """stateful: more objects with state_dict()/load_state_dict() (an LR scheduler, a
        GradScaler) whose state a step reads."""
        m = _clone(model.state_dict())
        o = _clone(optimizer.state_dict()) if optimizer is not None else None
        extra = [_clone(copy.deepcopy(obj.state_dict())) for obj in stateful]
        return cls(step, m, o, rng_state(), _nbytes(m) + _nbytes(o) + _nbytes(extra), extra)

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                stateful: tuple[Any, ...] = ()) -> None:
        with _disable_current_modes(), torch.no_grad():
            model.load_state_dict(self.model)
            if optimizer is not None and self.optimizer is not None:
                optimizer.load_state_dict(copy.deepcopy(self.optimizer))
            for obj, st in zip(stateful, self.extra, strict=True):
                obj.load_state_dict(copy.deepcopy(st))
        set_rng_state(self.rng)


@dataclass
class Store:
    """Snapshots every `every` steps and the batches since the oldest one, within `budget`."""

    every: int
    budget: int | None
    stateful: tuple[Any, ...] = ()
    snapshots: deque[State] = field(default_factory=deque)
    batches: dict[int, tuple[Any, int] | None] = field(default_factory=dict)
    disabled: str | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise UsageError(f"snapshot_every must be >= 1, got {self.every}")

    def used(self) -> int:
        return sum(s.nbytes for s in self.snapshots) + sum(
            b[1] for b in self.batches.values() if b is not None)

    def check_budget(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
        """Refuse a budget smaller than one snapshot (estimated now: the model's state and the
        optimizer's current state). Returns the estimate."""
        need = _nbytes(model.state_dict()) + (_nbytes(optimizer.state_dict())
                                              if optimizer is not None else 0)
        if self.budget is not None and self.budget < need:
            raise SnapshotBudgetError(
                f"snapshot budget {self.budget} bytes cannot hold one snapshot: it needs at least "
                f"{need} bytes (model and optimizer state, plus the batches of "
                f"{self.every} steps); raise the budget or pass snapshot_every=None")
        return need

    def before_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    batch: Any) -> None:
        """Called before each step runs: snapshot when due, keep the batch."""
        if self.disabled:
            return
        if step % self.every == 0:
            # a capture re-runs the flagged step, the current one, from the latest snapshot
            # at or before it: an older one is never read again. Kept without a budget, every
            # snapshot stayed in memory (a copy of the model and optimizer every K steps)
            self.snapshots.clear()
            self.batches.clear()
            snap = State.take(step, model, optimizer, self.stateful)
            self.snapshots.append(snap)
            self._evict()
            if self.disabled:
                return
        if self.snapshots:
            self.batches[step] = None
            if batch is not None:
                self.set_batch(step, batch)

    def set_batch(self, step: int, batch: Any) -> None:
        """Keep the batch of `step` (when known after the step began: a Trainer's inputs)."""
        if self.disabled or not self.snapshots:
            return
        self.batches[step] = (_clone(batch), _nbytes(batch))
        self._evict()

    def add_part(self, step: int, part: Any) -> None:
        """One more micro-batch of `step`: its kept batch is `(([part, ...],), {})`, the
        argument of a step function that runs every micro-batch of an optimizer step."""
        if self.disabled or not self.snapshots:
            return
        kept = self.batches.get(step)
        parts, nbytes = (kept[0][0][0], kept[1]) if kept is not None else ([], 0)
        parts.append(_clone(part))
        self.batches[step] = ((parts,), {}), nbytes + _nbytes(part)
        self._evict()

    def _evict(self) -> None:
        if self.budget is None:
            return
        while self.used() > self.budget and len(self.snapshots) > 1:
            self.snapshots.popleft()
            oldest = self.snapshots[0].step
            for s in [s for s in self.batches if s < oldest]:
                del self.batches[s]
        if self.used() > self.budget:
            need = self.used()
            self.snapshots.clear()
            self.batches.clear()
            self.disabled = (f"snapshots stopped: one snapshot with its batches needs {need} "
                             f"bytes, over the budget of {self.budget} bytes (the optimizer's "
                             "state grew after its first step); raise snapshot_budget")
            log.warning("monitor: %s", self.disabled)

    def latest_before(self, step: int) -> State | None:
        for snap in reversed(self.snapshots):
            if snap.step <= step:
                return snap
        return None
