"""Numerics profiles: data saying which ops a device computes differently, and how.

A profile is a list of rules, each an op pattern (`accuracy.patterns.op_matches`, e.g.
"aten.mm.*" or "aten.mm") plus a named rounding applied to some of the op's inputs and
optionally its outputs. Users define their own and `register_profile` them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accuracy.errors import UsageError
from accuracy.patterns import op_matches

from .rounding import get_rounding

# Matrix ops and the schema arguments that feed the matrix unit. Bias and `self` of addmm are
# left alone: cube/tensor-core units add bias in the accumulator's precision.
MATRIX_OPERANDS: dict[str, tuple[str, ...]] = {
    "aten.mm.*": ("self", "mat2"),
    "aten.bmm.*": ("self", "mat2"),
    "aten.addmm.*": ("mat1", "mat2"),
    "aten.addmm_.*": ("mat1", "mat2"),
    "aten.baddbmm.*": ("batch1", "batch2"),
    "aten.baddbmm_.*": ("batch1", "batch2"),
    "aten.addbmm.*": ("batch1", "batch2"),
    "aten.linear.*": ("input", "weight"),
    "aten.matmul.*": ("self", "other"),
    "aten.convolution.*": ("input", "weight"),
    "aten._convolution.*": ("input", "weight"),
    "aten.convolution_backward.*": ("grad_output", "input", "weight"),
}


@dataclass(frozen=True)
class Quant:
    """Scaled low-precision GEMM operands (fp8, MX): how `sim` quantises them.

    Attributes:
        forward: element format of activations and weights ("e4m3").
        gradient: element format of gradient operands in backward GEMMs ("e5m2").
        block: 0 for one scale per tensor, N for MX blocks of N elements (e8m0 scales) along
            the reduction dimension.
        scaling: "current" (amax of this tensor), "delayed" (max over an amax history of
            `history` past calls of the same GEMM operand, TE's DelayedScaling defaults:
            1024, "max", margin 0) or "block" (MX).
    """

    forward: str = "e4m3"
    gradient: str = "e5m2"
    block: int = 0
    scaling: str = "current"
    history: int = 1024
    margin: int = 0

    def __post_init__(self) -> None:
        from .formats import get_format

        try:
            get_format(self.forward)
            get_format(self.gradient)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if self.scaling not in ("current", "delayed", "block"):
            raise UsageError(f"scaling must be current, delayed or block, not {self.scaling!r}")
        if (self.block > 0) != (self.scaling == "block"):
            raise UsageError("block scaling needs block > 0, and only it")

    def to_dict(self) -> dict[str, Any]:
        return {"forward": self.forward, "gradient": self.gradient, "block": self.block,
                "scaling": self.scaling, "history": self.history, "margin": self.margin}


@dataclass(frozen=True)
class Rule:
    """Round some inputs (and optionally outputs) of the ops matching `op`.

    Attributes:
        op: op pattern as every option takes it ("aten.mm", "aten.mm.*", "aten.*softmax*").
        rounding: name of a registered rounding ("fp16", "bf16", "tf32", "fp8-e4m3"...).
        args: schema argument names to round; empty means every floating tensor input the op
            does not write to. Arguments the op writes to are never touched.
        output: rounding for the op's floating outputs (None: outputs stay as computed).
    """

    op: str
    rounding: str
    args: tuple[str, ...] = ()
    output: str | None = None
    quant: Quant | None = None  # scaled fp8/MX operands instead of `rounding` (see Quant)

    def __post_init__(self) -> None:
        get_rounding(self.rounding)  # fail at definition time, not mid-training
        if self.output is not None:
            get_rounding(self.output)

    def to_dict(self) -> dict[str, Any]:
        d = {"op": self.op, "rounding": self.rounding, "args": list(self.args),
             "output": self.output}
        if self.quant is not None:
            d["quant"] = self.quant.to_dict()
        return d


@dataclass(frozen=True)
class Profile:
    """A named set of rules; the first rule whose pattern matches an op applies to it."""

    name: str
    description: str
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    def rule_for(self, op_name: str) -> Rule | None:
        """The rule for an overload name like "aten.addmm.default", or None."""
        for rule in self.rules:
            if op_matches(rule.op, op_name):
                return rule
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "rules": [r.to_dict() for r in self.rules]}


def matrix_rules(rounding: str, output: str | None = None) -> tuple[Rule, ...]:
    """Rules rounding the matrix operands of every op in MATRIX_OPERANDS."""
    return tuple(Rule(op, rounding, args, output) for op, args in MATRIX_OPERANDS.items())


_PROFILES: dict[str, Profile] = {}


def register_profile(profile: Profile) -> None:
    """Make `sim(profile=name)` find this profile (replaces one of the same name)."""
    _PROFILES[profile.name] = profile


def get_profile(name: str) -> Profile:
    """The profile registered under `name`."""
    try:
        return _PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(_PROFILES))
        raise UsageError(f"unknown profile {name!r}; known: {known}") from None


def profiles() -> list[Profile]:
    """Every registered profile."""
    return list(_PROFILES.values())


register_profile(Profile("exact", "no change: plain CPU numerics, the control"))
register_profile(Profile(
    "fp16-cube",
    "matrix ops (mm, bmm, addmm, baddbmm, linear, convolution and their backward) take "
    "fp16-rounded inputs and accumulate/return in the original dtype, as Ascend cube units do "
    "for fp32 models",
    matrix_rules("fp16"),
))
register_profile(Profile(
    "bf16",
    "matrix ops take bfloat16-rounded inputs and accumulate/return in the original dtype",
    matrix_rules("bf16"),
))
register_profile(Profile(
    "tf32",
    "fp32 matrix-op inputs rounded to 10 mantissa bits (TF32 tensor cores, "
    "allow_tf32=True on Ampere and later)",
    matrix_rules("tf32"),
))
register_profile(Profile(
    "fp8-e4m3",
    "matrix-op inputs quantised to float8 e4m3 with one scale per tensor (amax -> 448), "
    "accumulated in the original dtype, as FP8 training recipes do",
    matrix_rules("fp8-e4m3"),
))


# GEMMs that fp8 training recipes quantise (TE: Linear layers and convolutions; attention's
# batched matmuls stay in high precision), with each operand's reduction axis: MX blocks run
# along it (convolutions: along the channels).
QUANT_OPERANDS: dict[str, tuple[tuple[str, int], ...]] = {
    "aten.mm.*": (("self", -1), ("mat2", 0)),
    "aten.addmm.*": (("mat1", -1), ("mat2", 0)),
    "aten.linear.*": (("input", -1), ("weight", -1)),
    "aten.convolution.*": (("input", 1), ("weight", 1)),
    "aten._convolution.*": (("input", 1), ("weight", 1)),
    "aten.convolution_backward.*": (("grad_output", 1), ("input", 1), ("weight", 1)),
}


def quant_rules(quant: Quant, rounding: str) -> tuple[Rule, ...]:
    """Rules quantising the operands of every GEMM in QUANT_OPERANDS with `quant`.
    `rounding` names the forward format's rounding (the compute precision compare assumes)."""
    return tuple(Rule(op, rounding, tuple(a for a, _ in args), quant=quant)
                 for op, args in QUANT_OPERANDS.items())


register_profile(Profile(
    "fp8",
    "fp8 GEMMs and convolutions (forward, input and weight gradient) with per-tensor current "
    "scaling: e4m3 activations and weights, e5m2 gradients, fp32 accumulation "
    "(TransformerEngine's Float8CurrentScaling, HYBRID format)",
    quant_rules(Quant("e4m3", "e5m2"), "fp8-e4m3"),
))
register_profile(Profile(
    "fp8-delayed",
    "fp8 GEMMs with delayed scaling: each operand's scale from the max of its amax history "
    "(1024 calls, margin 0; TE's DelayedScaling defaults), e4m3/e5m2 as `fp8`; the first call "
    "of an operand, with no history yet, uses its own amax",
    quant_rules(Quant("e4m3", "e5m2", scaling="delayed"), "fp8-e4m3"),
))
register_profile(Profile(
    "mxfp8",
    "MXFP8 GEMMs: e4m3 elements (e5m2 gradients) with one power-of-two e8m0 scale per 32 "
    "elements along the reduction dimension, fp32 accumulation",
    quant_rules(Quant("e4m3", "e5m2", block=32, scaling="block"), "fp8-e4m3"),
))
register_profile(Profile(
    "mxfp4",
    "MXFP4 GEMMs: e2m1 elements (forward and gradients) with one e8m0 scale per 32 elements "
    "along the reduction dimension, fp32 accumulation",
    quant_rules(Quant("e2m1", "e2m1", block=32, scaling="block"), "fp4-e2m1"),
))
