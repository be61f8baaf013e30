"""Collectives seen by the dumper: which ops communicate, waiting for them, and the epoch.

Three facts make a naive recorder wrong on many ranks (measured with gloo, see issue #15):

- c10d collectives return before the data has arrived (the `Work` finishes later), so their
  outputs must be read only after waiting for that work;
- they write their tensors without bumping `_version`, so every tensor a collective touches
  must be recorded afresh rather than deduplicated against an earlier state;
- functional collectives and DTensor hand the recorder wrapper tensors (no storage of their
  own); their data is the wrapped local tensor, read after the pending collective is waited.

Every op gets the *collective epoch* it runs in: how many collectives this rank had issued
before it. Ranks running the same program agree on epochs, which is what lines them up.

`CollectiveWatch` is the loop's observer for all of it (accuracy/dumper/loop.py): shown every
call, it gives each its epoch, waits for a shown collective's data before the observers after
it read the outputs, forgets what an unrecorded collective overwrote, and describes the
DTensor meshes of an op on DTensors.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from accuracy.aten import P2P_KINDS, collective_kind
from accuracy.dumper.calls import KernelCall, OpCall
from accuracy.dumpfile import schema

if TYPE_CHECKING:
    from accuracy.dumper.calls import Call
    from accuracy.dumper.identity import TensorStates

log = logging.getLogger(__name__)

_REDUCE_OPS = {0: "sum", 1: "avg", 2: "product", 3: "min", 4: "max", 5: "band", 6: "bor",
               7: "bxor", 8: "premul_sum"}

def local_tensor(t: torch.Tensor) -> torch.Tensor | None:
    """The plain tensor holding a wrapper subclass's data on this rank (DTensor's local
    shard, an async collective result after its wait); `t` itself for a plain tensor; None
    when it can't be had (then only the wrapper's metadata is recorded).

    Reading a wrapper's bytes with dispatch disabled crashes the process (it has no storage),
    so the recorder always reads this instead.
    """
    try:
        for _ in range(8):  # wrappers of wrappers, bounded
            if not is_traceable_wrapper_subclass(t):
                return t
            if type(t).__name__ == "AsyncCollectiveTensor" and not getattr(t, "completed", True):
                with torch._C._DisableTorchDispatch():
                    t.elem = torch.ops._c10d_functional.wait_tensor(t.elem)
                t.completed = True
            names, _ = t.__tensor_flatten__()
            t = getattr(t, names[0])
    except Exception as e:  # noqa: BLE001 - an unknown subclass must not fail the user's step
        log.warning("cannot read the data of a %s: recording its metadata only (%s)",
                    type(t).__name__, e)
        return None
    return t if not is_traceable_wrapper_subclass(t) else None


def dtensor_runs_locally(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether DTensor runs `func` as the same op on the arguments' local shards: no
    redistribution of an argument inside the op (an all-gather, or Replicate -> Partial,
    which changes a shard's values without any collective we could see), no rewritten
    arguments (views get local sizes), no custom handler. Only then can a replay re-run the
    op on the recorded local shards. False when it cannot be told."""
    try:
        from torch.distributed.tensor import DTensor

        disp = DTensor._op_dispatcher
        if func in disp._custom_op_handlers:
            return False
        with torch._C._DisableTorchDispatch():
            info = disp.unwrap_to_op_info(func, args, kwargs)
            out = disp.sharding_propagator.propagate_op_sharding(info.schema)
        return not (out.needs_redistribute or out.use_val_from_redistribute_schema)
    except Exception as e:  # noqa: BLE001 - description only: the op is then not re-run
        log.debug("DTensor sharding of %s not known: %s", func, e)
        return False


def _script_kind(obj: Any) -> str:
    try:
        return obj._type().qualified_name().rsplit(".", 1)[-1]
    except (AttributeError, RuntimeError):
        return ""


def _c10d() -> Any:
    return torch._C._distributed_c10d


def _group_of(args: tuple, kwargs: dict) -> Any:
    """The ProcessGroup a collective call names (a boxed ScriptObject or a group name)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.ScriptObject) and _script_kind(a) == "ProcessGroup":
            try:
                return _c10d().ProcessGroup.unbox(a)
            except (RuntimeError, AttributeError):
                return None
    for a in args[1:]:
        if isinstance(a, str):  # functional collectives pass the group's name
            try:
                from torch.distributed.distributed_c10d import _resolve_process_group
                return _resolve_process_group(a)
            except (ValueError, RuntimeError, KeyError, ImportError):
                continue
    return None


def _reduce_op(args: tuple, kwargs: dict) -> str | None:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.ScriptObject) and _script_kind(a) == "ReduceOp":
            try:
                return _REDUCE_OPS.get(int(a.op()), str(a.op()))
            except (RuntimeError, AttributeError):
                return None
    for a in args[1:]:
        if isinstance(a, str) and a.lower() in _REDUCE_OPS.values():
            return a.lower()
    return None


def describe_group(pg: Any) -> dict[str, Any] | None:
    """Name, size, global ranks and backend of a ProcessGroup (None if it can't be read)."""
    if pg is None:
        return None
    try:
        from torch.distributed import get_process_group_ranks
        ranks = list(get_process_group_ranks(pg))
    except (ValueError, RuntimeError, ImportError):
        ranks = []
    try:
        return {"name": str(pg.group_name), "size": int(pg.size()), "ranks": ranks,
                "backend": str(pg.name())}
    except (RuntimeError, AttributeError):
        return None


def describe_mesh(mesh: Any) -> dict[str, Any] | None:
    """Device type, shape, dimension names and global ranks of a DeviceMesh."""
    try:
        with torch._C._DisableTorchDispatch():  # other modes (sim) must not see this
            ranks = mesh.mesh.flatten().tolist()
        return {"device_type": mesh.device_type, "shape": list(mesh.mesh.shape),
                "dim_names": list(mesh.mesh_dim_names or ()), "ranks": ranks}
    except Exception:  # noqa: BLE001 - description only
        return None


def _wait_outputs(kind: str, func: Any, out: Any) -> None:
    """Block until the collective's data is in its output tensors."""
    items = out if isinstance(out, list | tuple) else (out,)
    waited = False
    for o in items:
        if isinstance(o, torch.ScriptObject) and _script_kind(o) == "Work":
            _c10d().Work.unbox(o).wait()
            waited = True
    if waited or func.namespace == "c10d":
        return
    # functional collectives: the result tensor has its work registered; waiting twice is fine
    from accuracy.dumper.flatten import tensors_in

    for t in tensors_in(out):
        if not is_traceable_wrapper_subclass(t):
            torch.ops._c10d_functional.wait_tensor(t)


class Collectives:
    """Per-dump collective state: the epoch, and what each collective was and waited for."""

    def __init__(self) -> None:
        self.epoch = 0  # collectives issued so far
        self.current = 0  # epoch of the op being recorded
        self._kinds: dict[Any, str | None] = {}
        self._per_group: dict[str, int] = {}
        self._p2p: dict[str, int] = {}  # "group:src>dst:tag" -> point-to-point ops so far
        self.groups: dict[str, dict[str, Any]] = {}
        self.meshes: list[dict[str, Any]] = []
        self._mesh_cache: dict[int, dict[str, Any]] = {}

    def kind(self, func: Any) -> str | None:
        k = self._kinds.get(func, 0)
        if k == 0:
            k = self._kinds[func] = collective_kind(func)
        return k  # type: ignore[return-value]

    def enter(self, func: Any) -> str | None:
        """Note one op: sets `current` to its epoch and counts it if it communicates."""
        self.current = self.epoch
        k = self.kind(func)
        if k is not None and k != "wait":
            self.epoch += 1
        return k

    def settle(self, kind: str, func: Any, args: tuple, kwargs: dict, out: Any
               ) -> dict[str, Any]:
        """Wait for the collective's data (never raises); returns what goes in the op's
        `extra["collective"]`: kind, reduce op, group, its index in that group, times.
        A point-to-point op is never waited for (see `p2p_note`)."""
        if kind in P2P_KINDS:
            return self.p2p_note(kind, args)
        issued = time.time()
        t0 = time.perf_counter()
        note: dict[str, Any] = {"kind": kind, "issued": issued}
        try:
            with torch._C._DisableTorchDispatch():
                _wait_outputs(kind, func, out)
        except Exception as e:  # noqa: BLE001 - the user's collective must not fail because of us
            log.warning("could not wait for %s before recording it: %s", func, e)
            note["wait_error"] = str(e)[:200]
        note["wait_s"] = round(time.perf_counter() - t0, 6)
        if kind == "wait":
            return note
        try:
            op = _reduce_op(args, kwargs)
            group = describe_group(_group_of(args, kwargs))
        except Exception as e:  # noqa: BLE001 - description only
            log.debug("collective %s not described: %s", func, e)
            op = group = None
        if op is not None:
            note["reduce_op"] = op
        if group is not None:
            name = group["name"]
            self.groups.setdefault(name, {**group, "collectives": 0})["collectives"] += 1
            note["group"] = name
            note["group_ranks"] = group["ranks"]
            note["group_index"] = self._per_group.get(name, 0)
            self._per_group[name] = note["group_index"] + 1
        return note

    def p2p_note(self, kind: str, args: tuple) -> dict[str, Any]:
        """A send's or receive's note, without waiting: a gloo point-to-point `Work` can be
        waited once, and the user's code waits for it (`dist.send`, the pipelining
        schedules). What a receive wrote is recorded when it arrived (accuracy/dumper/p2p.py).

        `peer` and `src`/`dst` are global ranks; `p2p_index` counts this rank's earlier ops
        of the same direction, peer, group and tag, which pairs the n-th send of a rank with
        the n-th receive of its peer (gloo delivers in that order)."""
        note: dict[str, Any] = {"kind": kind, "issued": time.time(), "wait_s": 0.0}
        try:
            group = describe_group(_group_of(args, {}))
            ints = [a for a in args[2:] if isinstance(a, int) and not isinstance(a, bool)]
            tag = ints[-1] if ints else 0
            peer = ints[0] if len(ints) > 1 else -1  # recv_any_source_: known on arrival
            ranks = group["ranks"] if group is not None else []
            if 0 <= peer < len(ranks):
                peer = ranks[peer]
        except Exception as e:  # noqa: BLE001 - description only
            log.debug("point-to-point op not described: %s", e)
            return note
        from torch.distributed import get_rank

        me = get_rank()
        src, dst = (me, peer) if kind == "send" else (peer, me)
        name = group["name"] if group is not None else ""
        key = f"{name}:{src}>{dst}:{tag}"
        index = self._p2p.get(key, 0)
        self._p2p[key] = index + 1
        note.update(peer=peer, src=src, dst=dst, tag=tag, p2p_index=index)
        if group is not None:
            self.groups.setdefault(name, {**group, "collectives": 0})["collectives"] += 1
            note["group"] = name
            note["group_ranks"] = group["ranks"]
        return note

    def note_mesh(self, t: torch.Tensor) -> dict[str, Any] | None:
        """Describe a DTensor argument's mesh and placements; keeps each distinct mesh once."""
        mesh = getattr(t, "device_mesh", None)
        if mesh is None:
            return None
        d = self._mesh_cache.get(id(mesh))
        if d is None:
            d = self._mesh_cache[id(mesh)] = describe_mesh(mesh) or {}
            if d and d not in self.meshes:
                self.meshes.append(d)
        try:
            placements = [str(p) for p in t.placements]
        except Exception:  # noqa: BLE001 - description only
            placements = []
        return {**d, "placements": placements}

    def attrs(self) -> dict[str, Any]:
        """Root attributes written at close."""
        return {schema.ROOT_COLLECTIVES: self.epoch, schema.ROOT_PROCESS_GROUPS: self.groups,
                schema.ROOT_DEVICE_MESHES: self.meshes}


def process_group_attrs() -> dict[str, Any]:
    """`local_rank` and the default process group, for the dump's root attributes."""
    import os

    attrs: dict[str, Any] = {}
    local = os.environ.get("LOCAL_RANK")
    attrs[schema.ROOT_LOCAL_RANK] = int(local) if local is not None and local.isdigit() else -1
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        try:
            attrs[schema.ROOT_PROCESS_GROUP] = {"backend": str(dist.get_backend()),
                                      "world_size": dist.get_world_size(),
                                      "group_name": str(dist.group.WORLD.group_name)}
        except (RuntimeError, ValueError, AttributeError) as e:
            log.debug("default process group not described: %s", e)
    return attrs


class CollectiveWatch:
    """Observer of every call (see the module's docstring). `states`: the recorder's tensor
    states, whose records of memory an unrecorded collective overwrote (no version bump
    says so) are forgotten; None where nothing is deduplicated."""

    def __init__(self, coll: Collectives, states: TensorStates | None = None) -> None:
        self.coll = coll
        self.states = states

    def before(self, call: Call) -> None:
        coll = self.coll
        if type(call) is KernelCall:  # a launch runs in the epoch of the op before it
            call.epoch = coll.current
            return
        epoch = coll.current = coll.epoch
        call.epoch = epoch
        kind = call.plan.collective
        if kind is not None and kind != "wait":
            coll.epoch = epoch + 1

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        kind = call.plan.collective
        if kind is not None and type(call) is OpCall:
            if call.shown:  # waited: the outputs hold the collective's result
                call.collective = self.coll.settle(kind, call.func, call.args, call.kwargs,
                                                   call.result)
            elif self.states is not None:  # it wrote its tensors, version unchanged
                for t in call.inputs:
                    self.states.forget_aliases(t)
        if not call.shown:
            return
        for t in call.inputs:
            if type(t) is not torch.Tensor:
                meshes = [m for t in call.inputs if type(t) is not torch.Tensor
                          and (m := self.coll.note_mesh(t)) is not None]
                if meshes:  # an op on DTensors: recorded on the local shards
                    call.extra[schema.EXTRA_DTENSOR] = meshes
                    if dtensor_runs_locally(call.func, call.args, call.kwargs):
                        call.extra[schema.EXTRA_DTENSOR_LOCAL] = True  # its kernel saw these
                break

    def finish(self) -> dict[str, Any]:
        return self.coll.attrs()
