"""The precision each op is expected to compute at on the device ("compute precision").

An fp32 model on a device whose matrix unit rounds its inputs to fp16 (an Ascend cube unit),
to TF32 (NVIDIA by default for convolutions) or to bf16 is not broken: its matmuls are as good
as fp16-input kernels can be. Judging them against fp32 makes every matmul an "error" and
hides the real culprit. So verdicts use the op's compute precision where it is known:

- from the user's config, `[compute_precision]` with op patterns mapped to a dtype name
  (`"aten.*mm*" = "tf32"`), for real devices whose precision modes the user knows;
- from a `sim` dump's own profile, whose rules say which ops round their inputs and how.

Where an op's compute precision is coarser than its dtype, the accumulated thresholds are
those of the coarser dtype, and the replay's error-ratio thresholds are multiplied by the ratio
of unit roundoffs (fp16 vs fp32: 2^13), since the fp32 reference is that much more precise
than a good fp16-input kernel.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from accuracy.errors import UsageError
from accuracy.numformats import unit_roundoffs
from accuracy.patterns import op_matches

# float32, tf32, float16, bfloat16, fp8 e4m3/e5m2 and fp4 e2m1 from the one formats table
UNIT_ROUNDOFF = {
    "float64": 2.0 ** -53, "complex128": 2.0 ** -53, "complex64": 2.0 ** -24,
    **unit_roundoffs(),
    "float8_e4m3fnuz": 2.0 ** -4, "float8_e5m2fnuz": 2.0 ** -3,
}
# sim rounding rule names -> the dtype whose precision they give.
_ROUNDING_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "tf32": "tf32",
                   "fp8-e4m3": "float8_e4m3fn", "fp8-e5m2": "float8_e5m2",
                   "fp4-e2m1": "float4_e2m1"}
# Thresholds sections have no tf32 entry: TF32 keeps fp16's 10 mantissa bits.
_SECTION = {"tf32": "float16"}


class ComputePrecision:
    """Op name -> the dtype name its device kernel is expected to compute at (or None)."""

    def __init__(self, rules: list[tuple[str, str]]) -> None:
        unknown = sorted({d for _, d in rules if d not in UNIT_ROUNDOFF})
        if unknown:
            raise UsageError(
                f"[compute_precision]: unknown dtype {unknown}; use one of "
                f"{sorted(UNIT_ROUNDOFF)}"
            )
        self.rules = rules
        self.for_op = lru_cache(maxsize=None)(self._for_op)

    @classmethod
    def from_sources(cls, cfg: dict[str, Any], my_attrs: dict[str, Any]) -> ComputePrecision:
        """User rules first (they win), then the rules of the device dump's sim profile."""
        rules = [(str(k), str(v)) for k, v in (cfg.get("compute_precision") or {}).items()]
        sim = my_attrs.get("sim")
        if isinstance(sim, dict):
            for rule in sim.get("rules") or []:
                dtype = _ROUNDING_DTYPE.get(str(rule.get("rounding")))
                if dtype and rule.get("op"):
                    rules.append((str(rule["op"]), dtype))
        return cls(rules)

    def _for_op(self, op: str | None) -> str | None:
        if not op:
            return None
        for pattern, dtype in self.rules:
            if op_matches(pattern, op):
                return dtype
        return None

    def coarser(self, op: str | None, dtype: str | None) -> str | None:
        """The compute precision of `op` if it is coarser than `dtype`, else None."""
        eff = self.for_op(op)
        if eff is None or dtype is None:
            return None
        if UNIT_ROUNDOFF[eff] > UNIT_ROUNDOFF.get(dtype, 0.0):
            return eff
        return None

    @staticmethod
    def ratio_scale(eff: str | None, dtype: str | None) -> float:
        if eff is None or dtype not in UNIT_ROUNDOFF:
            return 1.0
        return UNIT_ROUNDOFF[eff] / UNIT_ROUNDOFF[dtype]

    @staticmethod
    def section(eff: str) -> str:
        return _SECTION.get(eff, eff)
