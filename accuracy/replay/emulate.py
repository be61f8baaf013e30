"""The emulated reference: an op re-run at the compute precision the device used.

A device whose matrix unit rounds fp32 operands to bf16 (or an fp16 autocast op on a bf16
device) differs from an fp64 reference by its inputs' rounding, ~3e-3 in bf16: a 1e-3 kernel
fault hides under it. The emulated reference rounds the op's recorded inputs as the device's
rules say (the `sim` profile's rule for the op: which arguments, which rounding), computes in
fp64 and rounds the result to the output's dtype. An honest device that rounds like that
differs from it only by its accumulation order (and the rare output rounding that order
flips), so a 1e-3 fault is many times the honest residual.

Whether a device really rounds like the emulation is not assumed: replay only measures the
residual (`err_emulated`, with `emulated` naming the rounding); compare judges it against a
documented bound and uses it only where the run's own ops of that compute precision sit
within that bound (docs/metrics.md, "Emulated local error").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from accuracy.device_backend import Rule, get_rounding
from accuracy.patterns import op_matches

log = logging.getLogger(__name__)


@dataclass
class Emulation:
    """The device's rounding rules (first match wins), as the dump's `sim` attributes say."""

    rules: list[Rule] = field(default_factory=list)

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> Emulation | None:
        """The rules of a `sim` dump's profile that round inputs (fp8/MX rules are replayed
        by re-quantisation instead); None when there are none."""
        sim = attrs.get("sim")
        if not isinstance(sim, dict):
            return None
        rules = []
        for r in sim.get("rules") or []:
            if not isinstance(r, dict) or r.get("quant") or not r.get("op"):
                continue
            try:
                rules.append(Rule(str(r["op"]), str(r.get("rounding")),
                                  tuple(str(a) for a in r.get("args") or ()),
                                  r.get("output")))
            except (ValueError, TypeError) as e:  # a rounding this process does not know
                log.warning("replay: rule %s not emulated: %s", r.get("op"), e)
        return cls(rules) if rules else None

    def rule_for(self, op: str) -> Rule | None:
        for rule in self.rules:
            if op_matches(rule.op, op):
                return rule if rule.rounding != "none" else None
        return None


class _Marker:
    def __init__(self, idx: int) -> None:
        self.idx = idx


def rounded_inputs(rec: Any, fn: Any, rule: Rule) -> set[int]:
    """Indices of the recorded inputs the rule rounds (by schema argument name; every
    floating input the op does not write when the rule names none)."""
    args, kwargs = rec.call([_Marker(i) for i in range(len(rec.inputs))])
    wanted = set(rule.args)
    out: set[int] = set()
    for pos, a in enumerate(fn._schema.arguments):
        if wanted and a.name not in wanted:
            continue
        if a.alias_info is not None and a.alias_info.is_write:
            continue
        value = args[pos] if not a.kwarg_only and pos < len(args) else kwargs.get(a.name)
        if isinstance(value, _Marker):
            out.add(value.idx)
    return out


def emulated_outputs(rec: Any, fn: Any, rule: Rule, inputs: list[torch.Tensor],
                     device: torch.device, upcast: str, run: Any) -> list[torch.Tensor]:
    """The op's outputs computed in `upcast` precision on inputs rounded as the device rounds
    them (`run(fn, args, kwargs)` runs the call: replay's `_run`)."""
    from accuracy.replay.rebuild import build_call

    rounding = get_rounding(rule.rounding)
    which = rounded_inputs(rec, fn, rule)
    with torch.no_grad():
        ins = [rounding(t) if i in which and t.is_floating_point() else t
               for i, t in enumerate(inputs)]
        args, kwargs = build_call(rec, ins, device, upcast, mutable=True)
        return run(fn, args, kwargs)


def to_output(high: torch.Tensor, dtype: torch.dtype, rule: Rule) -> torch.Tensor:
    """The emulated output as the device stores it: rounded to its dtype (then by the rule's
    output rounding, if any)."""
    t = high.detach().to("cpu").to(dtype)
    if rule.output and t.is_floating_point():
        t = get_rounding(rule.output)(t)
    return t


def residual(device: torch.Tensor, emulated: torch.Tensor) -> dict[str, float]:
    """Relative L2 distance of the device output from the emulated one, and the relative
    bias: the least-squares scale b with device ~ (1 + b) * emulated (rounding is zero-mean,
    a bias fault is not)."""
    from accuracy.replay.metrics import compare

    rel, _, _ = compare(device, emulated)
    d = device.detach().to(torch.float64).reshape(-1)
    e = emulated.detach().to(torch.float64).reshape(-1)
    ok = torch.isfinite(d) & torch.isfinite(e)
    d, e = d[ok], e[ok]
    den = float((e * e).sum())
    bias = float(((d - e) * e).sum()) / den if den > 0 else 0.0
    return {"err_emulated": rel, "bias_emulated": bias}
