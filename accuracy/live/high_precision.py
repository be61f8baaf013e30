"""Prove that one layer's fp8 GEMMs move the loss: run them in high precision, live.

`prove_high_precision(step, golden=..., profile="fp8", modules=[...])` runs the step under
`sim`'s fp8/MX profile as is, then with the GEMMs of the chosen modules unquantised
(`sim(high_precision=...)`), then with as many randomly chosen other quantised modules
unquantised (the control, seeded), and says how much of the loss and gradient gap to golden
each closes, as `prove` does for substituted kernels. `over={"underflow_pct": 5}` chooses the
modules instead: those whose GEMM operands crossed the threshold in the device run (TE's
"switch to high precision when underflows% or MSE crosses a threshold").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

from accuracy.device_backend.simulator import any_module_matches, sim
from accuracy.errors import UsageError
from accuracy.live.prove import (
    Arm,
    Proof,
    StepResult,
    conclude,
    grad_distance,
    percent,
    step_outcome,
)


def _run(step: Callable[[], StepResult], profile: str, faults: Iterable[Any],
         high: list[str]) -> tuple[float, list, dict[str, dict[str, float]]]:
    mode = sim(profile=profile, faults=list(faults), high_precision=high)
    with mode:
        mode.quantizer.survey = True  # the figures that choose and explain the culprits
        loss, grads = step_outcome(step())
    return loss, grads, mode.quantizer.modules


def _choose(seen: dict[str, dict[str, float]], modules: Iterable[str] | None,
            over: dict[str, float] | None) -> list[str]:
    if modules is not None:
        pats = list(modules)
        return sorted(m for m in seen if any(any_module_matches(p, [m]) for p in pats))
    return sorted(m for m, figs in seen.items()
                  if any(figs.get(k, 0.0) > v for k, v in (over or {}).items()))


def prove_high_precision(step: Callable[[], StepResult], *,
                         golden: Callable[[], StepResult] | StepResult,
                         profile: str = "fp8", modules: Iterable[str] | None = None,
                         over: dict[str, float] | None = None, faults: Iterable[Any] = (),
                         seed: int = 0, report: str | None = None) -> Proof:
    """Device run, culprit modules' GEMMs in high precision, a random control; measure.

    step(): one step from a fresh seeded state returning the loss or (loss, grads), as for
    `prove`. modules: module patterns whose quantised GEMMs switch; or over: figure ->
    threshold ("underflow_pct", "overflow_pct", "mse", "rel_error") choosing them.
    """
    if (modules is None) == (over is None):
        raise UsageError("give modules=[patterns] or over={figure: threshold}, one of them")
    faults = list(faults)
    g_loss, g_grads = step_outcome(golden() if callable(golden) else golden)
    d_loss, d_grads, seen = _run(step, profile, faults, [])
    if not seen:
        raise UsageError(f"profile {profile!r} quantised no GEMM in this step; use an fp8 or "
                         "MX profile (fp8, fp8-delayed, mxfp8, mxfp4)")
    chosen = _choose(seen, modules, over)
    if not chosen:
        raise UsageError("no quantised GEMM's module matches " + (
            f"{list(modules or [])}" if modules is not None else f"the thresholds {over}")
            + f"; quantised modules: {', '.join(sorted(seen)) or '(none)'}")
    pool = [m for m in sorted(seen) if m not in chosen]
    rng = random.Random(seed)
    control = sorted(rng.sample(pool, min(len(chosen), len(pool))))
    notes = [] if len(control) == len(chosen) else [
        f"only {len(control)} other quantised modules could serve as control"]

    def arm(name: str, mods: list[str], result: tuple[float, list] | None = None) -> Arm:
        loss, grads = result if result is not None else _run(step, profile, faults, mods)[:2]
        a = Arm(name, loss, [{"module": m, "gemm_calls": int(seen[m]["calls"]),
                              **{k: v for k, v in seen[m].items() if k != "calls"}}
                             for m in mods])
        a.loss_gap = abs(loss - g_loss)
        a.grad_gap = grad_distance(grads or [], g_grads)
        return a

    dev = arm("device", [], (d_loss, d_grads))
    cul = arm("culprit", chosen)
    ctl = arm("control", control)
    proof = Proof([f"fp8 GEMMs in {m}" for m in chosen], g_loss, dev, cul, ctl, seed,
                  "high precision", profile, notes=notes)

    def sentence(p: Proof) -> str:
        grads = (f" and {percent(p.culprit.grad_closed)} of the gradient gap"
                 if p.culprit.grad_closed is not None else "")
        return (f"Running the {profile} GEMMs of {', '.join(chosen)} in high precision closes "
                f"{percent(p.culprit.loss_closed)} of the loss gap{grads}; the control "
                f"({len(control)} random other quantised module{'s' if len(control) != 1 else ''}"
                f", seed {seed}) closes {percent(p.control.loss_closed)}.")

    return conclude(proof, sentence, report)
