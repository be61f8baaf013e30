"""A reference for `torch._scaled_mm` (fp8 GEMM with scales), so its upcast run exists.

replay/ops.py uses it for `aten._scaled_mm.*` unless the user registered their own.

ATen's `_scaled_mm` takes only fp8 operands, so the fp64 run a replay measures errors
against cannot call it: this reference computes `(a @ b) * scale_a * scale_b (+ bias)` in the
widest floating dtype among its tensors (float32 for the same-dtype run, float64 upcast, the
fp8 values being exact in both) and returns it in `out_dtype` unless upcast.
"""

from __future__ import annotations

import torch


def scaled_mm_reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                        scale_b: torch.Tensor, bias: torch.Tensor | None = None,
                        scale_result: torch.Tensor | None = None,
                        out_dtype: torch.dtype | None = None,
                        use_fast_accum: bool = False) -> torch.Tensor:
    """fp32 (or fp64 when upcast) accumulation of the dequantised product."""
    upcast = any(t is not None and t.dtype == torch.float64
                 for t in (a, b, scale_a, scale_b, bias))
    wide = torch.float64 if upcast else torch.float32
    out = (a.to(wide) @ b.to(wide)) * scale_a.to(wide) * scale_b.to(wide)
    if bias is not None:
        out = out + bias.to(wide)
    if scale_result is not None:
        out = out * scale_result.to(wide)
    if upcast:
        return out
    return out.to(out_dtype if out_dtype is not None else a.dtype)
