"""`sim`: an emulated accelerator on CPU, op by op, with a numerics profile and injected faults.

    from accuracy.device_backend import sim
    with sim(profile="fp16-cube", faults=[sim.fault("aten.gelu.default", kind="replace",
                                                     value="gelu-tanh")]):
        with dumper(dump_path="sim.h5"):
            step()

`sim` sits *below* the dumper on the dispatch-mode stack: the dumper sees the op's real
arguments and the device-like result, exactly as on hardware, while the rounding and faults
happen "inside the kernel". Internal work (rounding, writing faults) runs with Python dispatch
disabled, so no other mode ever records it.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from accuracy import hops
from accuracy.aten import returns_nothing, written_tensors
from accuracy.patterns import closest, op_matches

from .faults import (
    _REPLACEMENTS,
    OUTPUT_KINDS,
    QUANT_KINDS,
    Fault,
    apply_output_fault,
    describe_value,
    make_fault,
    select_output,
    set_argument,
)
from .modules import ForwardModules
from .profiles import Profile, Rule, get_profile
from .quantizer import GemmQuantizer
from .rounding import get_rounding
from .subclass import map_plain, plain_parts

log = logging.getLogger(__name__)

_ACTIVE: list[SimMode] = []


def active() -> SimMode | None:
    """The innermost `sim(...)` currently entered, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def any_module_matches(pattern: str, modules: Iterable[str]) -> bool:
    """True if any active module matches, by full name or without the root class name."""
    for name in modules:
        if fnmatchcase(name, pattern):
            return True
        _, _, relative = name.partition(".")
        if relative and fnmatchcase(relative, pattern):
            return True
    return False



_TAG = "accuracy_sim_modules"


def _warn_if_inside_dumper() -> None:
    """`sim` entered inside `dumper(...)`: the dump has already recorded its backend (cpu)
    and will not say sim, its profile or its faults. Say so now, where the mistake is."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    # the dumper's loop mode says whom it serves (the live tools run the same loop)
    if any(getattr(m, "label", None) == "dumper" for m in _get_current_dispatch_mode_stack()):
        msg = ("sim(...) entered inside dumper(...): the dump records backend 'cpu' without the "
               "sim profile or faults; enter sim first: `with sim(...), dumper(...):`")
        log.warning(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)


def _aliases_input(func: Any, position: int) -> bool:
    """Whether output `position` of `func` is a view of an input (per its schema)."""
    returns = func._schema.returns
    if not returns:
        return False
    ret = returns[min(position, len(returns) - 1)]
    return ret.alias_info is not None


def _replace_output(out: Any, position: int, value: torch.Tensor) -> Any:
    if isinstance(out, torch.Tensor):
        return value
    items = list(out)
    items[position] = value
    return type(out)(items) if isinstance(out, tuple) else items

def _hop_not_emulated(name: str) -> None:
    log.warning("sim: higher-order op %s has no eager implementation to run inside: its ops "
                "run on the host's numerics, not emulated", name)


class SimMode(TorchDispatchMode):
    """Emulated accelerator: applies a numerics profile and faults to every ATen op on CPU.

    Args:
        profile: a registered profile name ("exact", "fp16-cube", "bf16", "tf32", "fp8-e4m3")
            or a `Profile`.
        faults: faults built with `sim.fault(...)`.

    Each `with` block is one run: call counters, occurrences and `applied` start from zero.
    Attributes while (and after) running:
        applied: one dict per applied fault: fault (its index in `faults`), op, module,
            occurrence (0-based), kind, value, call (0-based index of the op among all ops this
            mode saw), plus arg / index / output where they apply.
        calls: how many ops this mode has seen.
    """

    fault = staticmethod(make_fault)
    active = staticmethod(active)

    def __init__(self, profile: str | Profile = "exact", faults: Iterable[Fault] = (), *,
                 high_precision: Iterable[str] = (),
                 high_precision_over: dict[str, float] | None = None,
                 amax_history: dict | None = None) -> None:
        """fp8/MX profiles also take `high_precision` (module patterns whose GEMMs run
        unquantised), `high_precision_over` (figure -> threshold, e.g. {"underflow_pct": 5}:
        GEMMs over it run unquantised) and `amax_history` (a dict delayed scaling keeps its
        histories in; pass the same one to a later sim to carry them on)."""
        super().__init__()
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        if not isinstance(self.profile, Profile):
            raise TypeError(f"profile must be a name or a Profile, got {profile!r}")
        self.faults: tuple[Fault, ...] = tuple(faults)
        for f in self.faults:
            if not isinstance(f, Fault):
                raise TypeError(f"faults must be built with sim.fault(...), got {f!r}")
        self.applied: list[dict[str, Any]] = []
        self.calls = 0
        self._occurrences = [0] * len(self.faults)
        self._plans: dict[Any, tuple[Rule | None, tuple[int, ...]]] = {}
        self._tracker: ForwardModules | None = None
        self.quantizes = any(r.quant is not None for r in self.profile.rules)
        self._quant_args = (tuple(high_precision), high_precision_over, amax_history)
        self.quantizer = GemmQuantizer(*self._quant_args)
        # fp8 GEMMs key amax histories and high-precision choices by module, in backward too
        self._by_module = self.quantizes or any(f.module is not None for f in self.faults)
        self._untagged: list[weakref.ref] = []
        self._pending_modules: tuple[str, ...] = ()

    @property
    def profile_name(self) -> str:
        return self.profile.name

    def describe(self) -> dict[str, Any]:
        """Profile and fault specifications, JSON-serialisable, for the dump's root attributes."""
        d = {
            "backend": "sim",
            "profile": self.profile.name,
            "profile_description": self.profile.description,
            "rules": [r.to_dict() for r in self.profile.rules],
            "faults": [f.to_dict() for f in self.faults],
            "occurrence_base": 0,
        }
        hp, over, _ = self._quant_args
        if hp or over:
            d["high_precision"] = {"modules": list(hp), "over": dict(over or {})}
        return d

    def __enter__(self) -> SimMode:
        if self in _ACTIVE:
            raise RuntimeError("this sim(...) is already active; create a new one to nest")
        _warn_if_inside_dumper()
        self.applied = []
        self.calls = 0
        self._occurrences = [0] * len(self.faults)
        self._elsewhere: set[str] = set()
        hp, over, hist = self._quant_args
        self.quantizer = GemmQuantizer(hp, over, self.quantizer.amax_history if hist is None
                                       else hist)
        self._tracker = ForwardModules()
        self._tracker.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._tracker.__exit__(None, None, None)
            raise
        _ACTIVE.append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._untagged = []
        if exc_type is None:
            self._warn_unmatched()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            if self._tracker is not None:
                self._tracker.__exit__(exc_type, exc, tb)
                self._tracker = None

    def ran_elsewhere(self, op: str) -> None:
        """A call of `op` that another mode took off this device (`substitute`, `prove`): a
        fault on it had no call to meet by design, which is no misspelling."""
        self._elsewhere.add(op)

    def _warn_unmatched(self) -> None:
        """A fault whose pattern met no call leaves the run as clean as no fault: say so, or a
        misspelt op or module reads as 'the tool found nothing'."""
        for fault, n in zip(self.faults, self._occurrences, strict=True):
            if n == 0 and not any(op_matches(fault.op, op) for op in self._elsewhere):
                where = f" in modules matching {fault.module!r}" if fault.module else ""
                seen = [str(f) for f in self._plans]
                near = ", ".join(closest(fault.op, seen, 5)) or "none"
                log.warning("sim: fault %s on %r%s matched no call in this block: nothing was "
                            "injected (ops this sim ran, closest first: %s)",
                            fault.kind, fault.op, where, near)

    def state(self) -> dict[str, Any]:
        """The device's counters (calls, each fault's occurrences): what a snapshot keeps so a
        re-run of a step meets the same faults, as a device's RNG state is kept."""
        return {"calls": self.calls, "occurrences": list(self._occurrences)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore counters saved by `state()` (same faults)."""
        occ = [int(n) for n in state["occurrences"]]
        if len(occ) != len(self.faults):
            raise ValueError(f"state has {len(occ)} fault counters, this sim has "
                             f"{len(self.faults)} faults")
        self.calls, self._occurrences = int(state["calls"]), occ

    # -- dispatch -------------------------------------------------------------------------

    def _plan(self, func: Any) -> tuple[Rule | None, tuple[int, ...]]:
        plan = self._plans.get(func)
        if plan is None:
            name = str(func)
            rule = self.profile.rule_for(name)
            fault_ids = tuple(i for i, f in enumerate(self.faults) if op_matches(f.op, name))
            plan = self._plans[func] = (rule, fault_ids)
        return plan

    def _modules(self) -> list[str]:
        """Active modules. In backward, those of the forward op whose autograd node is
        running (gradient hooks, which a backward module tracker follows, fire for the wrong
        module when a module returns its input unchanged, e.g. Dropout(p=0))."""
        if self._tracker is None:
            return []
        if torch._C._current_graph_task_id() != -1:
            node = torch._C._current_autograd_node()
            tag = node.metadata.get(_TAG) if node is not None else None
            return list(tag) if tag is not None else []
        return list(self._tracker.parents)

    def _tag_pending(self) -> None:
        if not self._untagged:
            return
        # Reading grad_fn of a view may run ops (its node is rebuilt): invisible to modes below.
        with torch._C._DisableTorchDispatch():
            for ref in self._untagged:
                t = ref()
                node = t.grad_fn if t is not None else None
                if node is not None and _TAG not in node.metadata:
                    node.metadata[_TAG] = self._pending_modules
        self._untagged = []

    def _remember_forward(self, out: Any) -> None:
        """Tag this forward op's autograd nodes (attached after dispatch returns, so on the
        next op) with the active modules, for backward fault selection by module."""
        self._tag_pending()
        if torch._C._current_graph_task_id() != -1:
            return
        # weak references: holding a tensor changes what autograd does with it (a gradient
        # it cannot steal is detached and copied), and sim must not change the op stream
        self._untagged = [weakref.ref(t) for t in torch.utils._pytree.tree_leaves(out)
                          if isinstance(t, torch.Tensor)]
        self._pending_modules = tuple(self._modules())

    supports_higher_order_operators = True  # FlexAttention, torch.cond...: accuracy/hops.py

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if hops.is_hop(func):  # its ATen ops come back here one by one, emulated
            return hops.run(self, func, args, kwargs, _hop_not_emulated)
        call = self.calls
        self.calls += 1
        rule, fault_ids = self._plan(func)
        if self._by_module:
            out = self._dispatch(func, args, kwargs, call, rule, fault_ids)
            self._remember_forward(out)
            return out
        return self._dispatch(func, args, kwargs, call, rule, fault_ids)

    def _dispatch(self, func: Any, args: tuple, kwargs: dict, call: int, rule: Rule | None,
                  fault_ids: tuple[int, ...]) -> Any:
        if rule is None and not fault_ids:
            return func(*args, **kwargs)

        hits = self._select_faults(fault_ids, call)
        name = str(func)
        for fault, record in hits:
            if fault.kind in ("eps", "arg"):
                args, kwargs = set_argument(func, args, kwargs, fault.arg, fault.value)
                self._record(record, name)
        if rule is not None and rule.quant is not None:
            qhits = [(f, r) for f, r in hits if f.kind in QUANT_KINDS]
            args, kwargs, _ = self.quantizer.apply(func, rule, args, kwargs, self._modules(),
                                                   qhits, any_module_matches)
            for _f, record in qhits:
                self._record(record, name)
        elif rule is not None:
            args, kwargs = _round_inputs(func, rule, args, kwargs)
        for f, _record in hits:
            if f.kind in QUANT_KINDS and (rule is None or rule.quant is None):
                log.warning("sim: fault %s skipped on %s: the profile does not quantise it",
                            f.kind, name)

        replacement = next(((f, r) for f, r in hits if f.kind == "replace"), None)
        if replacement is not None:
            fault, record = replacement
            impl = fault.value if callable(fault.value) else _REPLACEMENTS[fault.value]
            with torch._C._DisableTorchDispatch(), torch.no_grad():
                out = impl(func, args, kwargs)
            self._record(record, name)
        else:
            out = func(*args, **kwargs)

        if rule is not None and rule.output is not None:
            _round_outputs(out, get_rounding(rule.output))
        for fault, record in hits:
            if fault.kind in OUTPUT_KINDS:
                target = select_output(out, fault.output)
                if target is None and returns_nothing(func):
                    # a fused/foreach op (`_fused_adamw_`): its outputs are what it wrote,
                    # output i the i-th written tensor (parameter i of the first list)
                    target = select_output(written_tensors(func, args, kwargs), fault.output)
                if target is None or not target.is_floating_point():
                    log.warning("sim: fault %s skipped on %s: output %d is not a float tensor",
                                fault.kind, name, fault.output)
                    continue
                with torch._C._DisableTorchDispatch(), torch.no_grad():
                    if _aliases_input(func, fault.output):
                        # A view's output shares the input's memory: fault a copy, so the
                        # input (and every other view of it) keeps its values.
                        copy = map_plain(target, torch.clone)
                        for part in plain_parts(copy):  # a DTensor: its local shard
                            apply_output_fault(fault, part, record["occurrence"])
                        out = _replace_output(out, fault.output, copy)
                    else:
                        for part in plain_parts(target):
                            apply_output_fault(fault, part, record["occurrence"])
                self._record(record, name)
        return out

    def _select_faults(self, fault_ids: tuple[int, ...], call: int) -> list[tuple[Fault, dict]]:
        """Faults that fire on this call; advances each matching fault's occurrence counter."""
        if not fault_ids:
            return []
        modules = self._modules()
        innermost = max(modules, key=lambda m: m.count("."), default=None)
        hits = []
        for i in fault_ids:
            fault = self.faults[i]
            if fault.module is not None and not any_module_matches(fault.module, modules):
                continue
            occurrence = self._occurrences[i]
            self._occurrences[i] += 1
            if not fault.fires_at(occurrence):
                continue
            record = {
                "fault": i,
                "module": innermost,
                "occurrence": occurrence,
                "kind": fault.kind,
                "value": describe_value(fault.value),
                "call": call,
            }
            if fault.kind in ("eps", "arg"):
                record["arg"] = fault.arg
            if fault.kind in ("nan", "inf"):
                record["index"] = fault.index
            if fault.kind in OUTPUT_KINDS:
                record["output"] = fault.output
            hits.append((fault, record))
        return hits

    def _record(self, record: dict[str, Any], op: str) -> None:
        self.applied.append({"op": op, **record})
        log.debug("sim: applied %s", self.applied[-1])


def _round_inputs(func: Any, rule: Rule, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Copies of the inputs the rule names, rounded; the caller's tensors are never modified."""
    rounding = get_rounding(rule.rounding)
    wanted = set(rule.args)
    new_args, new_kwargs = list(args), dict(kwargs)
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        for pos, a in enumerate(func._schema.arguments):
            if wanted and a.name not in wanted:
                continue
            if a.alias_info is not None and a.alias_info.is_write:
                continue
            if not a.kwarg_only and pos < len(new_args):
                value = new_args[pos]
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    new_args[pos] = map_plain(value, rounding)  # DTensor: its local shard
            elif a.name in new_kwargs:
                value = new_kwargs[a.name]
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    new_kwargs[a.name] = map_plain(value, rounding)
    return tuple(new_args), new_kwargs


def _round_outputs(out: Any, rounding: Any) -> None:
    tensors = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(
        out, tuple | list) else []
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                for part in plain_parts(t):  # a DTensor: its local shard
                    part.copy_(rounding(part))


sim = SimMode
