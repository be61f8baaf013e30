"""`sim`'s fp8/MX GEMMs: each operand quantised (scaled cast and back), fp32 accumulation.

Per GEMM call: which operands are gradients (e5m2 in the HYBRID recipe) is read from the call
(convolution_backward names grad_output; a backward mm's gradient operand is the one whose
memory no forward GEMM used: activations and weights are saved by the forward GEMMs that
used them). Scales come from the operand itself (current), from an amax history per GEMM
operand (delayed), or per block of 32 (MX). Faults of kind scale / stale-amax / saturate
change one operand's cast. Chosen GEMMs run in high precision: by module pattern, or when
their figures cross a threshold (the figures are still computed and recorded).
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from . import quant_figures
from .formats import get_format, quantize, tensor_scale
from .profiles import QUANT_OPERANDS, Quant, Rule

log = logging.getLogger(__name__)

_AXES = {op.split(".")[1]: dict(args) for op, args in QUANT_OPERANDS.items()}
THRESHOLD_KEYS = ("underflow_pct", "overflow_pct", "mse", "rel_error")


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1


def _is_weight(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad)


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_storages() -> set[int] | None:
    """Storages of the tensors the running autograd node saved in forward (its activations
    and weights; the gradient it was given is not among them), or None outside a node."""
    node = torch._C._current_autograd_node()
    if node is None:
        return None
    names = _SAVED_NAMES.get(type(node))
    if names is None:
        names = _SAVED_NAMES[type(node)] = tuple(
            n for n in dir(node) if n.startswith("_saved_") and not n.endswith("_sym_sizes"))
    out = set()
    for n in names:
        try:
            v = getattr(node, n)
        except (RuntimeError, AttributeError):  # freed, or not a tensor slot
            continue
        if isinstance(v, torch.Tensor):
            out.add(_storage_key(v))
    return out or None


class GemmQuantizer:
    """The state of one `sim` run's quantised GEMMs (amax histories, forward operands)."""

    def __init__(self, high_precision: Iterable[str] = (),
                 high_precision_over: dict[str, float] | None = None,
                 amax_history: dict[tuple, collections.deque] | None = None) -> None:
        self.high_precision = tuple(high_precision)
        self.over = dict(high_precision_over or {})
        bad = sorted(set(self.over) - set(THRESHOLD_KEYS))
        if bad:
            from accuracy.errors import UsageError
            raise UsageError(f"high_precision_over: unknown figure {bad}; use "
                             f"{', '.join(THRESHOLD_KEYS)}")
        # shared with the caller's dict when given, so a later sim can carry it on
        self.amax_history: dict[tuple, collections.deque] = (
            amax_history if amax_history is not None else {})
        self.switched: list[dict[str, Any]] = []  # GEMMs run in high precision
        # module -> calls and the worst figures of its quantised GEMMs (bounded by modules)
        self.modules: dict[str, dict[str, float]] = {}
        self.survey = False  # compute figures for `modules` even when nobody records them
        self._fwd: dict[int, weakref.ref] = {}
        self._pass: tuple[bool, int] = (False, -1)
        self._seen: dict[tuple, int] = {}

    # -- roles -----------------------------------------------------------------------------

    def _note_forward(self, t: torch.Tensor) -> None:
        if len(self._fwd) > 4096:
            self._fwd = {k: r for k, r in self._fwd.items() if r() is not None}
        self._fwd[_storage_key(t)] = weakref.ref(t)

    def _from_forward(self, t: torch.Tensor) -> bool:
        ref = self._fwd.get(_storage_key(t))
        return ref is not None and ref() is not None

    def _role(self, name: str, t: torch.Tensor, backward: bool, saved: set[int] | None) -> str:
        if name == "grad_output":
            return "gradient"
        if backward:
            known = (_storage_key(t) in saved) if saved is not None else self._from_forward(t)
            if not known:
                return "gradient"
        return "weight" if _is_weight(t) else "activation"

    # -- one call --------------------------------------------------------------------------

    def apply(self, func: Any, rule: Rule, args: tuple, kwargs: dict, modules: list[str],
              faults: list[tuple[Any, dict]], wants_module: Any) -> tuple[tuple, dict,
                                                                           list[dict]]:
        """(args, kwargs) with the rule's operands quantised, and their figures (published
        for the dumper too). `faults`: (fault, record) of quant kinds hitting this call."""
        quant = rule.quant
        assert quant is not None
        backward = torch._C._current_graph_task_id() != -1
        op = str(func)
        base = op.split(".")[1] if op.count(".") >= 2 else op
        axes = _AXES.get(base, {})
        module = max(modules, key=lambda m: m.count("."), default="")
        new_args, new_kwargs = list(args), dict(kwargs)
        figures: list[dict[str, Any]] = []
        operands = []
        for pos, a in enumerate(func._schema.arguments):
            if a.name not in axes:
                continue
            in_args = not a.kwarg_only and pos < len(new_args)
            value = new_args[pos] if in_args else new_kwargs.get(a.name)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                operands.append((pos, a.name, in_args, value))
        saved = _saved_storages() if backward else None
        roles = {name: self._role(name, t, backward, saved) for _, name, _, t in operands}
        kind = "fprop" if not backward else (
            "wgrad" if "weight" not in roles.values() else "dgrad")
        if base == "convolution_backward":
            kind = "dgrad+wgrad"
        # figures only for someone: a recorder, a threshold, or a survey (prove)
        want = quant_figures.wanted() or bool(self.over) or self.survey
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            for pos, name, in_args, t in operands:
                role = roles[name]
                fmt = get_format(quant.gradient if role == "gradient" else quant.forward)
                factor, inv, amax_factor = 1.0, 1.0, 1.0
                for fault, _rec in faults:
                    if (fault.arg or operands[0][1]) != name:
                        continue
                    if fault.kind == "scale":
                        factor *= fault.value
                    elif fault.kind == "saturate":  # scale_inv consistent: clipping only
                        factor *= fault.value
                        inv *= fault.value
                    elif fault.kind == "stale-amax":
                        amax_factor *= fault.value
                scale = self._scale(quant, self._key(module, base, name, role, backward, t),
                                    t, fmt, amax_factor)
                q = quantize(t, fmt, block=quant.block, axis=axes[name], scale=scale,
                             scale_factor=factor, inv_factor=inv, figures=want)
                figs = {"arg": name, "role": role, "gemm": kind, "scaling": quant.scaling,
                        **q.figures}
                if quant.block == 0:
                    figs["scale"] = float(scale) * factor if scale is not None else None
                    figs["scale_inv"] = 1.0 / (float(scale) * inv) if scale else None
                figures.append(figs)
                if not backward:
                    self._note_forward(t)
                if in_args:
                    new_args[pos] = q.value
                else:
                    new_kwargs[name] = q.value
            high = bool(self.high_precision) and any(wants_module(p, modules)
                                                     for p in self.high_precision)
            if not high and self.over:
                high = any(f.get(k, 0.0) > v for f in figures for k, v in self.over.items())
        seen = self.modules.setdefault(module, {"calls": 0.0})
        seen["calls"] += 1
        for f in figures:
            for k in THRESHOLD_KEYS:
                v = f.get(k)
                if isinstance(v, float) and v > seen.get(k, -1.0):
                    seen[k] = v
        if high:
            for f in figures:
                f["high_precision"] = True
            self.switched.append({"op": op, "module": module, "gemm": kind})
            new_args, new_kwargs = list(args), dict(kwargs)
        if want:
            quant_figures.publish(figures)
        return tuple(new_args), new_kwargs, figures

    def _key(self, module: str, op: str, arg: str, role: str, backward: bool,
             t: torch.Tensor) -> tuple:
        """Which amax history an operand belongs to: its GEMM's place (module, op, operand,
        role, shape) and its ordinal among such calls in this pass (a forward pass, or one
        backward graph task), as TE keeps one history per GEMM operand of each layer."""
        current = (backward, torch._C._current_graph_task_id() if backward else -1)
        if current != self._pass:
            if not (current[0] is False and self._pass[0] is False):
                self._seen = {}
            self._pass = current
        place = (module, op, arg, role, backward, tuple(t.shape))
        n = self._seen.get(place, 0)
        self._seen[place] = n + 1
        return (*place, n)

    def _scale(self, quant: Quant, key: tuple, t: torch.Tensor, fmt: Any,
               amax_factor: float) -> float | None:
        """The per-tensor scale (None: MX blocks, computed inside quantize)."""
        if quant.block:
            if amax_factor != 1.0:
                log.warning("sim: stale-amax has no meaning for block scaling; ignored")
            return None
        finite = t.detach().abs().float()
        finite = torch.where(torch.isfinite(finite), finite, torch.zeros_like(finite))
        amax = float(finite.max()) if t.numel() else 0.0
        used = amax
        if quant.scaling == "delayed":
            hist = self.amax_history.get(key)
            if hist is None:
                hist = self.amax_history[key] = collections.deque(maxlen=quant.history)
            used = max(hist) if hist else amax
            hist.append(amax)
        return tensor_scale(used * amax_factor, fmt, quant.margin)


def requantize(func: Any, args: list[Any] | tuple, kwargs: dict[str, Any],
               figures: list[dict[str, Any]]) -> tuple[list[Any], dict[str, Any], int]:
    """An honest kernel's operands for a recorded fp8/MX GEMM call (the replay's reference).

    Each operand named in the recorded figures is quantised again as an honest kernel would:
    current and block scaling recompute the scale from the operand itself; delayed scaling
    takes the recorded scale (it depends on history) with scale_inv = 1 / scale. Operands that
    ran in high precision stay. Returns (args, kwargs, how many operands were quantised).
    """
    base = str(func).split(".")[1] if str(func).count(".") >= 2 else str(func)
    axes = _AXES.get(base, {})
    by_name = {f.get("arg"): f for f in figures if isinstance(f, dict)}
    new_args, new_kwargs, done = list(args), dict(kwargs), 0
    with torch.no_grad():
        for pos, a in enumerate(func._schema.arguments):
            f = by_name.get(a.name)
            if f is None or a.name not in axes or f.get("high_precision"):
                continue
            in_args = not a.kwarg_only and pos < len(new_args)
            value = new_args[pos] if in_args else new_kwargs.get(a.name)
            if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
                continue
            fmt = get_format(str(f.get("format")))
            block = int(f.get("block") or 0)
            scale = f.get("scale") if f.get("scaling") == "delayed" else None
            if scale is not None and not (isinstance(scale, float | int) and scale > 0):
                scale = None
            q = quantize(value, fmt, block=block, axis=axes[a.name], scale=scale,
                         figures=False).value
            if in_args:
                new_args[pos] = q
            else:
                new_kwargs[a.name] = q
            done += 1
    return new_args, new_kwargs, done
