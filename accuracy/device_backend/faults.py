"""Fault specifications for `sim`, and the code that applies one to a single op call.

A fault selects calls by op pattern (`accuracy.patterns.op_matches`: `aten.gelu`, `aten::gelu`,
`aten.gelu.default`, globs), optionally module pattern
and occurrence (0-based index among the calls that match op and module) or a window of them
(``start`` inclusive, ``stop`` exclusive: a fault that a device develops at some point), and
does one thing:

- ``replace``: run another implementation (a registered name such as "gelu-tanh", or a
  callable ``fn(func, args, kwargs) -> output``);
- ``bias``: multiply the output by ``1 + value`` (relative bias);
- ``noise``: multiply the output by ``1 + value * N(0, 1)``, from a private seeded generator
  (the global RNG is never touched);
- ``nan`` / ``inf``: write NaN / Inf (``-inf`` when ``value < 0``) at flat ``index`` of the output;
- ``eps`` / ``arg``: call the op with a named argument changed (``eps`` is ``arg="eps"``);
- on GEMMs an fp8/MX profile quantises (``arg`` names the operand, default its first):
  ``scale``: the cast uses a scale ``value`` times the right one while scale_inv stays right
  (the operand comes out ``value`` times too large, saturating at the format's max);
  ``stale-amax``: the scale comes from an amax ``value`` times the true one (a stale amax;
  below 1 the top of the operand saturates, above 1 its small values underflow);
  ``saturate``: the operand is cast ``value`` times larger than its scale allows and clipped
  at the format's max (a saturating cast), scale_inv consistent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from accuracy.errors import UsageError

QUANT_KINDS = ("scale", "stale-amax", "saturate")
KINDS = ("replace", "bias", "noise", "nan", "inf", "eps", "arg", *QUANT_KINDS)
OUTPUT_KINDS = ("bias", "noise", "nan", "inf")

Replacement = Callable[[Any, tuple, dict], Any]
_REPLACEMENTS: dict[str, Replacement] = {}


def register_replacement(name: str, fn: Replacement) -> None:
    """Make `kind="replace", value=name` available: fn(func, args, kwargs) -> op output."""
    _REPLACEMENTS[name] = fn


def replacements() -> list[str]:
    """Names usable as `value` of a `replace` fault."""
    return sorted(_REPLACEMENTS)


def _gelu_tanh(func: Any, args: tuple, kwargs: dict) -> Any:
    """GELU (forward or backward) computed with the tanh approximation."""
    if "approximate" not in {a.name for a in func._schema.arguments}:
        raise ValueError(f"gelu-tanh replaces GELU ops only, not {func}")
    args, kwargs = set_argument(func, args, kwargs, "approximate", "tanh")
    return func(*args, **kwargs)


def _softmax_unstable(func: Any, args: tuple, kwargs: dict) -> Any:
    """Softmax without subtracting the max: overflows on large logits, as naive kernels do."""
    if str(func) != "aten._softmax.default":
        raise ValueError(f"softmax-unstable replaces aten._softmax.default only, not {func}")
    x, dim, half_to_float = args[0], args[1], args[2]
    e = torch.exp(x.float() if half_to_float else x)
    return e / e.sum(dim, keepdim=True)


register_replacement("gelu-tanh", _gelu_tanh)
register_replacement("softmax-unstable", _softmax_unstable)


@dataclass(frozen=True)
class Fault:
    """One fault specification. Build it with `sim.fault(...)`, which validates it."""

    op: str
    kind: str
    value: Any = None
    module: str | None = None
    occurrence: int | None = None
    arg: str | None = None
    index: int = 0
    output: int = 0
    seed: int = 0
    start: int | None = None
    stop: int | None = None

    def fires_at(self, occurrence: int) -> bool:
        """Whether this fault fires on the matching call number `occurrence` (0-based)."""
        if self.occurrence is not None and occurrence != self.occurrence:
            return False
        if self.start is not None and occurrence < self.start:
            return False
        return self.stop is None or occurrence < self.stop

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, for dump attributes and reports (start/stop when set)."""
        window = {k: v for k, v in (("start", self.start), ("stop", self.stop)) if v is not None}
        return {
            "op": self.op,
            "kind": self.kind,
            "value": describe_value(self.value),
            "module": self.module,
            "occurrence": self.occurrence,
            "arg": self.arg,
            "index": self.index,
            "output": self.output,
            "seed": self.seed,
            **window,
        }


def describe_value(value: Any) -> Any:
    """A JSON-safe rendering of a fault value (callables by qualified name)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if callable(value):
        return f"callable:{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    if isinstance(value, list | tuple):
        return [describe_value(v) for v in value]
    return repr(value)


def make_fault(
    op: str,
    module: str | None = None,
    *,
    kind: str,
    value: Any = None,
    occurrence: int | None = None,
    arg: str | None = None,
    index: int = 0,
    output: int = 0,
    seed: int = 0,
    start: int | None = None,
    stop: int | None = None,
) -> Fault:
    """Validate and build a fault (exposed as `sim.fault`). `occurrence` is 0-based;
    `start`/`stop`: fire on matching calls start <= n < stop only (either may be None)."""
    if kind not in KINDS:
        raise UsageError(f"unknown fault kind {kind!r}; expected one of {', '.join(KINDS)}")
    if occurrence is not None and (not isinstance(occurrence, int) or occurrence < 0):
        raise UsageError(f"occurrence must be a 0-based int or None, got {occurrence!r}")
    for name, bound in (("start", start), ("stop", stop)):
        if bound is not None and (not isinstance(bound, int) or bound < 0):
            raise UsageError(f"{name} must be a 0-based int or None, got {bound!r}")
    if start is not None and stop is not None and stop <= start:
        raise UsageError(f"stop ({stop}) must be greater than start ({start})")
    if kind == "replace":
        if not (callable(value) or value in _REPLACEMENTS):
            raise UsageError(
                f"replace needs a callable or one of {replacements()}, got {value!r}"
            )
    elif kind in ("bias", "noise"):
        if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value):
            raise UsageError(f"{kind} needs a finite relative magnitude as value, got {value!r}")
        value = float(value)
    elif kind in ("nan", "inf"):
        if value is not None and not isinstance(value, Real):
            raise UsageError(f"{kind} takes no value (or a sign for inf), got {value!r}")
    elif kind == "eps":
        if arg not in (None, "eps"):
            raise UsageError("kind='eps' always changes the 'eps' argument; use kind='arg'")
        if not isinstance(value, Real):
            raise UsageError(f"eps needs a number as value, got {value!r}")
        arg, value = "eps", float(value)
    elif kind in QUANT_KINDS:
        if not isinstance(value, Real) or isinstance(value, bool) or not (
                math.isfinite(value) and value > 0):
            raise UsageError(f"{kind} needs a positive factor as value, got {value!r}")
        value = float(value)
    elif kind == "arg" and not arg:
        raise UsageError("kind='arg' needs arg=<schema argument name>")
    return Fault(op=op, kind=kind, value=value, module=module, occurrence=occurrence, arg=arg,
                 index=int(index), output=int(output), seed=int(seed), start=start, stop=stop)


def set_argument(func: Any, args: tuple, kwargs: dict, name: str, value: Any) -> tuple[tuple, dict]:
    """Return (args, kwargs) for `func` with the schema argument `name` set to `value`."""
    schema_args = func._schema.arguments
    for pos, a in enumerate(schema_args):
        if a.name != name:
            continue
        if not a.kwarg_only and pos < len(args):
            return args[:pos] + (value,) + args[pos + 1 :], kwargs
        return args, {**kwargs, name: value}
    known = ", ".join(a.name for a in schema_args)
    raise UsageError(f"{func} has no argument {name!r} (it has: {known})")


def select_output(out: Any, position: int) -> torch.Tensor | None:
    """The output tensor a fault targets: `out` itself, or item `position` of a tuple/list."""
    if isinstance(out, torch.Tensor):
        return out if position == 0 else None
    if isinstance(out, tuple | list) and -len(out) <= position < len(out):
        item = out[position]
        return item if isinstance(item, torch.Tensor) else None
    return None


def _unravel(index: int, shape: torch.Size) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        index, c = divmod(index, size)
        coords.append(c)
    return tuple(reversed(coords))


def apply_output_fault(fault: Fault, target: torch.Tensor, occurrence: int) -> None:
    """Modify `target` in place (caller disables dispatch and grad)."""
    if fault.kind == "bias":
        target.mul_(1.0 + fault.value)
    elif fault.kind == "noise":
        gen = torch.Generator(device="cpu")
        gen.manual_seed((fault.seed * 1_000_003 + occurrence) & 0xFFFF_FFFF_FFFF)
        n = torch.randn(target.shape, generator=gen, dtype=torch.float64)
        target.copy_(target.double() * (1.0 + fault.value * n))
    else:
        numel = target.numel()
        if not -numel <= fault.index < numel:
            raise IndexError(f"fault index {fault.index} out of range for {numel} elements")
        if fault.kind == "nan":
            fill = math.nan
        else:
            fill = -math.inf if (fault.value is not None and fault.value < 0) else math.inf
        target[_unravel(fault.index % numel, target.shape)] = fill
