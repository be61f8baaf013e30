"""Proof by substitution: does running the culprit op(s) on the reference close the gap?

`prove(step, culprits=..., golden=...)` runs the device step four ways: the golden step (or
its given loss and gradients), the device step as is, the device step with the culprit calls
substituted by the reference (`accuracy.live.substitute`), and the device step with as many
randomly chosen non-culprit calls substituted (the control, seeded). Each arm's distance to
the golden loss and gradients, against the device's, says how much of the gap it closes:
"substituting aten.gelu.default in encoder.layers.2 closes 98% of the loss gap; the control
closes 1%" is evidence a kernel team accepts. See docs/live.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from accuracy.errors import UsageError
from accuracy.jsonsafe import jsonable
from accuracy.live.select import CallSelection
from accuracy.live.substitute import Call, Substitute
from accuracy.replay.ops import is_movement

log = logging.getLogger(__name__)
StepResult = Any  # loss, or (loss, grads): grads a Module, {name: tensor} or tensors
CLOSES_AT_LEAST, CONTROL_AT_MOST = 0.9, 0.1


@dataclass(frozen=True)
class Culprit:
    """An op pattern, optionally limited to a module pattern (`aten.gelu@encoder.layers.2`)."""

    op: str
    module: str | None = None

    @classmethod
    def parse(cls, spec: str | Mapping[str, Any] | Culprit) -> Culprit:
        if isinstance(spec, Culprit):
            return spec
        if isinstance(spec, Mapping):
            if not spec.get("op"):
                raise UsageError(f"a culprit needs an op: {dict(spec)!r}")
            return cls(str(spec["op"]), spec.get("module") or None)
        op, _, module = str(spec).partition("@")
        if not op.strip():
            raise UsageError(f"culprit {spec!r}: write OP or OP@MODULE, e.g. "
                             "aten.gelu.default@encoder.layers.2")
        return cls(op.strip(), module.strip() or None)

    def label(self) -> str:
        return self.op + (f" in {self.module}" if self.module else "")

    def matches(self, call: Call) -> bool:
        sel = CallSelection.build(self.op, self.module)
        return sel.wants(call.seq, call.op, call.module, call.phase)


@dataclass
class Arm:
    """One run of the step: its loss, its distance to golden, and the share of the gap closed."""

    name: str
    loss: float
    calls: list[dict[str, Any]] = field(default_factory=list)
    loss_gap: float | None = None
    grad_gap: float | None = None
    loss_closed: float | None = None
    grad_closed: float | None = None


@dataclass
class Proof:
    """The three device runs against golden, and the sentence that sums them up."""

    culprits: list[str]
    golden_loss: float
    device: Arm
    culprit: Arm
    control: Arm
    seed: int
    on: str
    dtype: str | None
    sentence: str = ""
    convincing: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))

    def format(self, page: str | os.PathLike[str] | None = None) -> str:
        """The sentence and its notes (and where the written report's page is)."""
        return "\n".join([self.sentence, *(f"  note: {n}" for n in self.notes),
                          *([f"report: {page}"] if page else [])])

    def write(self, report_dir: str | os.PathLike[str]) -> Path:
        """proof.json and proof.html (Jinja2, autoescaped) in `report_dir`; returns the page."""
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "proof.json").write_text(json.dumps(self.to_dict(), indent=1))
        from accuracy.live.html import render_proof
        page = out / "proof.html"
        page.write_text(render_proof(self.to_dict()))
        return page


def _grads(obj: Any) -> list[torch.Tensor]:
    if obj is None:
        return []
    if isinstance(obj, torch.nn.Module):
        items = [p.grad for _, p in obj.named_parameters()]
    elif isinstance(obj, Mapping):
        items = [obj[k] for k in sorted(obj)]
    elif isinstance(obj, torch.Tensor):
        items = [obj]
    else:
        items = list(obj)
    out = []
    with torch._C._DisableTorchDispatch():
        for g in items:
            out.append(torch.zeros(0, dtype=torch.float64) if g is None
                       else g.detach().to("cpu", torch.float64).reshape(-1).clone())
    return out


def step_outcome(result: StepResult) -> tuple[float, list[torch.Tensor]]:
    """(loss, gradients) of what a step returned: a loss, or (loss, grads) as a Module, a
    {name: tensor} or tensors."""
    if isinstance(result, tuple | list) and len(result) == 2:
        loss, grads = result
    else:
        loss, grads = result, None
    with torch._C._DisableTorchDispatch():
        value = float(loss.detach().to("cpu", torch.float64)) if isinstance(
            loss, torch.Tensor) else float(loss)
    return value, _grads(grads)


def grad_distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    """The Euclidean distance between two lists of gradients (None when either is missing)."""
    if not a or not b:
        return None
    if len(a) != len(b) or any(x.numel() != y.numel() for x, y in zip(a, b, strict=True)):
        raise UsageError("the step's gradients differ in count or size from the golden ones; "
                         "return the same parameters' gradients from both steps")
    return math.sqrt(sum(float((x - y).pow(2).sum()) for x, y in zip(a, b, strict=True)))


def _closed(gap: float | None, base: float | None) -> float | None:
    if gap is None or base is None or base == 0 or not math.isfinite(base):
        return None
    return 1.0 - gap / base


def _run(step: Callable[[], StepResult], context: Callable[[], Any] | None,
         sub: Substitute) -> tuple[float, list[torch.Tensor]]:
    ctx = context() if context is not None else contextlib.nullcontext()
    with ctx, sub:
        return step_outcome(step())


def _eligible(call: Call) -> bool:
    """A call the control may substitute: it computes floating values the reference can redo."""
    return (call.floating and not call.reason and not is_movement(call.op)
            and call.op not in {"aten.detach.default", "aten.lift_fresh.default"})


def prove(step: Callable[[], StepResult], *, culprits: Iterable[str | Mapping[str, Any] | Culprit]
          | str, golden: Callable[[], StepResult] | StepResult,
          context: Callable[[], Any] | None = None, on: str = "cpu",
          dtype: str | None = None, seed: int = 0,
          report: str | os.PathLike[str] | None = None) -> Proof:
    """Run `step` as is, with the culprits substituted, and with a random control; measure.

    step(): one device step from a fresh, seeded state, returning the loss or (loss, grads)
    (grads: the model, a {name: grad} dict or a list of tensors). golden: the same on the
    golden side (a callable run without `context`), or its (loss, grads) result. context(): a
    fresh context manager that puts the step on the device (e.g. `lambda: sim(...)`), entered
    outside the substitution. culprits: "OP" or "OP@MODULE" patterns. report: a folder for
    proof.json and proof.html.
    """
    specs = [Culprit.parse(c) for c in ([culprits] if isinstance(culprits, str | Mapping)
                                        else culprits)]
    if not specs:
        raise UsageError("prove needs at least one culprit (OP or OP@MODULE)")
    g_loss, g_grads = step_outcome(golden() if callable(golden) else golden)
    survey = Substitute(calls=[], record=True)
    d_loss, d_grads = _run(step, context, survey)
    calls = survey.calls_seen
    hit = [c for c in calls if any(s.matches(c) for s in specs)]
    if not hit:
        raise UsageError("no op call of the step matches the culprit(s) "
                         + ", ".join(s.label() for s in specs)
                         + "; check the op name and module path (accuracy ls dump.h5)")
    hit_seqs = {c.seq for c in hit}
    pool = [c for c in calls if c.seq not in hit_seqs and _eligible(c)]
    rng = random.Random(seed)
    control = sorted(rng.sample(pool, min(len(hit), len(pool))), key=lambda c: c.seq)
    notes = []
    if len(control) < len(hit):
        notes.append(f"only {len(control)} non-culprit calls could serve as control")

    def arm(name: str, seqs: list[int], loss: float | None = None,
            grads: list[torch.Tensor] | None = None) -> Arm:
        sub = Substitute(calls=seqs, on=on, dtype=dtype)
        if loss is None:
            loss, grads = _run(step, context, sub)
            moved = {c.seq for c in sub.substituted}
            for c in sub.skipped:
                notes.append(f"{name}: {c.op} (call {c.seq}) kept on the device: {c.reason}")
        else:
            moved = set()
        by_seq = {c.seq: c for c in calls}
        a = Arm(name, loss, [dict(seq=s, op=by_seq[s].op, module=by_seq[s].module,
                                  phase=by_seq[s].phase, substituted=s in moved)
                             for s in seqs if s in by_seq])
        a.loss_gap = abs(loss - g_loss)
        a.grad_gap = grad_distance(grads or [], g_grads)
        return a

    dev = arm("device", [], d_loss, d_grads)
    cul = arm("culprit", sorted(hit_seqs))
    ctl = arm("control", [c.seq for c in control])
    proof = Proof([s.label() for s in specs], g_loss, dev, cul, ctl, seed, on, dtype,
                  notes=notes)
    return conclude(proof, lambda p: _sentence(p, specs, len(hit)), report)


def conclude(proof: Proof, sentence: Callable[[Proof], str],
             report: str | os.PathLike[str] | None) -> Proof:
    """The ending every proof shares (`prove`, `prove_high_precision`): each arm's share of
    the device's gap closed, the sentence, whether it convinces (the culprit closes at least
    CLOSES_AT_LEAST of the loss gap, the control at most CONTROL_AT_MOST), the no-gap note,
    the log line and the report folder."""
    dev, cul, ctl = proof.device, proof.culprit, proof.control
    for a in (dev, cul, ctl):
        a.loss_closed = _closed(a.loss_gap, dev.loss_gap)
        a.grad_closed = _closed(a.grad_gap, dev.grad_gap)
    proof.sentence = sentence(proof)
    proof.convincing = (cul.loss_closed is not None and cul.loss_closed >= CLOSES_AT_LEAST
                        and ctl.loss_closed is not None
                        and ctl.loss_closed <= CONTROL_AT_MOST)
    if dev.loss_gap == 0:
        proof.notes.append("the device loss equals the golden loss: there is no gap to close")
    log.info("%s", proof.sentence)
    if report is not None:
        proof.write(report)
    return proof


def percent(v: float | None) -> str:
    """A share as the proof's sentences say it ("98%", "n/a")."""
    if v is None:
        return "n/a"
    pct = 100 * v
    return f"{0.0 if abs(pct) < 0.5 else pct:.0f}%"  # no "-0%"


def _sentence(p: Proof, specs: list[Culprit], n: int) -> str:
    what = " and ".join(f"{s.op}" + (f" in {s.module}" if s.module else "") for s in specs)
    grads = (f" and {percent(p.culprit.grad_closed)} of the gradient gap"
             if p.culprit.grad_closed is not None else "")
    cgrads = (f" and {percent(p.control.grad_closed)}" if p.control.grad_closed is not None
              else "")
    return (f"Substituting {what} ({n} call{'s' if n != 1 else ''}) closes "
            f"{percent(p.culprit.loss_closed)} of the loss gap{grads}; the control "
            f"({len(p.control.calls)} random call{'s' if len(p.control.calls) != 1 else ''}, "
            f"seed {p.seed}) closes {percent(p.control.loss_closed)}{cgrads}.")
