"""Triggers: rules that flag a step as having gone wrong, from its loss and figures.

Each trigger sees one `StepFigures` per step and returns a reason (a sentence) or None.
Defaults (see docs/monitor.md), chosen to stay quiet on a healthy run's noise:

- `NonFinite()`: the loss (when the driver gives one), or the global gradient norm, is NaN
  or Inf.
- `LossSpike(window=20, warmup=5, mads=6.0, rel=0.5)`: the loss exceeds the median of the
  previous `window` finite losses by more than both `mads` robust deviations (1.4826 x MAD)
  and `rel` x |median|; quiet until `warmup` losses are known. Flagged losses do not enter the
  window, so one spike does not hide the next.
- `GradNormJump(factor=10.0, window=20, warmup=5)`: the global gradient norm exceeds `factor`
  times the median of the previous `window` finite norms.
- `Predicate(fn, name)`: `fn(figures)` returns True (or a reason string) to fire.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from accuracy.errors import UsageError


@dataclass
class StepFigures:
    """What a trigger sees of one step. `figures` is the collector's dict on recorded steps."""

    step: int
    loss: float
    grad_norm: float = math.nan
    figures: dict[str, Any] | None = field(default=None, repr=False)
    loss_known: bool = True  # False: the driver gave no loss (NaN here means unknown)
    grad_known: bool = True  # False: no parameter had a gradient (NaN here means unknown)


class Trigger:
    """`figures`: the figures the trigger reads (`loss`, `grad_norm`, `module/act_norm`...):
    those go to TensorBoard and the framework's loggers beside the loss."""

    name = "trigger"
    figures: tuple[str, ...] = ()

    def check(self, s: StepFigures) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def restore(self, s: StepFigures) -> None:
        """See a step of the run before a resume, as `check` saw it then (a trigger with a
        history refills it; the others have none)."""


class NonFinite(Trigger):
    """Loss or global gradient norm NaN/Inf."""

    name = "non-finite"
    figures = ("loss", "grad_norm")

    def check(self, s: StepFigures) -> str | None:
        if s.loss_known and not math.isfinite(s.loss):
            return f"loss is {s.loss} at step {s.step}"
        if s.figures is not None and s.grad_known and not math.isfinite(s.grad_norm):
            return f"global gradient norm is {s.grad_norm} at step {s.step}"
        return None


class _Running:
    def __init__(self, window: int, warmup: int) -> None:
        if window < 1 or warmup < 1 or warmup > window:
            raise UsageError(f"need 1 <= warmup <= window, got warmup={warmup} window={window}")
        self.values: deque[float] = deque(maxlen=window)
        self.warmup = warmup

    def ready(self) -> bool:
        return len(self.values) >= self.warmup


class LossSpike(Trigger):
    """Loss far above its running median (robust: median absolute deviation)."""

    name = "loss-spike"
    figures = ("loss",)

    def __init__(self, window: int = 20, warmup: int = 5, mads: float = 6.0,
                 rel: float = 0.5) -> None:
        self._r = _Running(window, warmup)
        self.mads, self.rel = float(mads), float(rel)

    def check(self, s: StepFigures) -> str | None:
        x = s.loss
        if not math.isfinite(x):
            return None  # NonFinite's business
        vals = self._r.values
        if self._r.ready():
            med = statistics.median(vals)
            mad = statistics.median(abs(v - med) for v in vals) * 1.4826
            margin = max(self.mads * mad, self.rel * abs(med))
            if x - med > margin:
                return (f"loss {x:.6g} at step {s.step} is {x - med:.3g} above the running "
                        f"median {med:.6g} of the last {len(vals)} steps (threshold "
                        f"{margin:.3g})")
        vals.append(x)
        return None

    def restore(self, s: StepFigures) -> None:
        self.check(s)


class GradNormJump(Trigger):
    """Global gradient norm far above its running median."""

    name = "grad-norm-jump"
    figures = ("grad_norm",)

    def __init__(self, factor: float = 10.0, window: int = 20, warmup: int = 5) -> None:
        self._r = _Running(window, warmup)
        self.factor = float(factor)

    def check(self, s: StepFigures) -> str | None:
        x = s.grad_norm
        if s.figures is None or not math.isfinite(x):
            return None
        vals = self._r.values
        if self._r.ready():
            med = statistics.median(vals)
            if med > 0 and x > self.factor * med:
                return (f"gradient norm {x:.6g} at step {s.step} is {x / med:.3g}x the running "
                        f"median {med:.6g} (threshold {self.factor:g}x)")
        vals.append(x)
        return None

    def restore(self, s: StepFigures) -> None:
        self.check(s)


class Predicate(Trigger):
    """A user rule: fn(StepFigures) -> bool or a reason string. `figures`: the per-layer
    figures it reads ("module/act_norm", "param/grad_norm"...), sent to the loggers."""

    def __init__(self, fn: Callable[[StepFigures], Any], name: str = "predicate",
                 figures: Iterable[str] = ()) -> None:
        if not callable(fn):
            raise UsageError(f"Predicate needs a callable, got {fn!r}")
        self.fn, self.name, self.figures = fn, name, tuple(figures)

    def check(self, s: StepFigures) -> str | None:
        out = self.fn(s)
        if isinstance(out, str):
            return out or None
        return f"{self.name} fired at step {s.step}" if out else None


def default_triggers() -> list[Trigger]:
    return [NonFinite(), LossSpike(), GradNormJump()]


def resolve(triggers: str | Iterable[Trigger | Callable[..., Any]] | None) -> list[Trigger]:
    """'default', None (no triggers), or a list of triggers / callables (Predicate)."""
    if triggers is None:
        return []
    if isinstance(triggers, str):
        if triggers != "default":
            raise UsageError(f"triggers must be 'default', None or a list, not {triggers!r}")
        return default_triggers()
    out: list[Trigger] = []
    for t in triggers:
        if isinstance(t, Trigger):
            out.append(t)
        elif callable(t):
            out.append(Predicate(t, getattr(t, "__name__", "predicate")))
        else:
            raise UsageError(f"a trigger must be a Trigger or a callable, got {t!r}")
    return out
