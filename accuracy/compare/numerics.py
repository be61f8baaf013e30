"""What an honest kernel can produce: reduction lengths and expected local error ratios.

A replay's error ratio is the device kernel's error against fp64 divided by a same-dtype
reference kernel's error against fp64. An honest device kernel that computes at a coarser
precision than the tensors' dtype (an fp16 cube unit on fp32 tensors) has an error of about
c1 * u_compute (its inputs' rounding), whatever the reduction length. The reference's error
grows with the reduction length K, but BLAS libraries sum in blocks: about c2 * sqrt(K) * u_dtype
up to a block of B terms, then only logarithmically, g(K) = c2 * sqrt(min(K, B)) *
(1 + c3 * log2(K / B)) for K > B (never below 1). Their ratio is therefore

    expected = max(1, (u_compute / u_dtype) * c1 / max(1, g(K)))

with c1 = 0.8 and c2 = 1/3 fitted on clean runs of the detection benchmark (matmuls and
convolutions with K from 4 to 600, fp16, bf16 and tf32 cube profiles: the measured ratios
sit within a factor 2 of this), and B = 64, c3 = 0.12 fitted on CPU fp32 matmuls with K from
16 to 16384 (the reference's error over u was 1.2, 2.5, 3.5, 4.2, 4.4, 5.1 at K = 16, 64, 256,
1024, 4096, 16384, where sqrt(K)/3 alone would say up to 43: honest long reductions, common in
real models, would have looked 8x worse than they are). An op that computes at its own dtype
has expected 1. See docs/metrics.md.
"""

from __future__ import annotations

import json
import math
from typing import Any

from accuracy.compare.precision import UNIT_ROUNDOFF
from accuracy.numformats import subnormal_spacings

C_INPUT = 0.8
C_REDUCTION = 1.0 / 3.0
BLAS_BLOCK = 64  # terms a BLAS kernel sums in one run before combining partial sums
C_BLOCKS = 0.12  # growth of the reference's error per doubling of K beyond one block
C_SUBNORMAL = 0.3
# Spacing of the subnormal numbers of narrow compute formats: inputs whose magnitude is near
# it lose relative precision (fp16 gradients of 1e-6 keep 4 bits, not 11).
SUBNORMAL_SPACING = {**subnormal_spacings(),  # float16, fp8 e4m3/e5m2, fp4: numformats
                     "float8_e4m3fnuz": 2.0 ** -10, "float8_e5m2fnuz": 2.0 ** -17}


def _numel(shape: tuple[int, ...] | list[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def reduction_length(record: Any, out_idx: int = 0) -> int:
    """How many products or terms one output element sums (K of a matmul, C*kh*kw of a
    convolution, the normalised size of a norm, the length of a softmax); 1 for elementwise
    ops. `record` is an OpRecord (op name, input and output shapes)."""
    op = _op_name(record)
    ins = [tuple(t.shape) for t in sorted(record.inputs, key=lambda t: t.idx)]
    outs = {t.idx: tuple(t.shape) for t in record.outputs}
    try:
        if op.startswith(("aten._fused_", "aten._foreach_")):  # elementwise, per parameter
            return 1
        if op in ("aten.mm", "aten.bmm", "aten.matmul", "aten.linear", "aten.dot", "aten.mv"):
            return max(1, ins[0][-1])  # batched and broadcast: per element, the inner dim
        if op == "aten.addbmm":  # also sums over the batch
            return max(1, ins[1][0] * ins[1][-1])
        if op in ("aten.addmm", "aten.addmm_", "aten.baddbmm", "aten.baddbmm_", "aten.addmv"):
            return max(1, ins[1][-1])
        if op in ("aten.convolution", "aten._convolution"):
            return _conv_length(record, ins)
        if op == "aten.convolution_backward":
            return _conv_backward_length(record, ins, out_idx)
        if "scaled_dot_product" in op or op.startswith(("aten._flash_attention",
                                                        "aten._efficient_attention")):
            return _attention_length(op, ins, out_idx)
        if op == "aten.mkldnn_rnn_layer":  # gates sum input features and hidden units
            return max(1, ins[1][-1] + ins[2][-1])
        if op == "aten.mkldnn_rnn_layer_backward":  # (input, w_ih, w_hh, b_ih, b_hh, ...)
            gates = ins[1][0]
            steps = _numel(ins[0][:-1])  # weight gradients sum over time and batch
            return max(1, steps if out_idx in (1, 2, 3, 4) else gates)
        if op == "aten.embedding_dense_backward":  # each row sums the gradient of its tokens
            return max(1, _numel(ins[1]))
        if "softmax" in op:
            return max(1, ins[0][-1]) if ins and ins[0] else 1
        if op in ("aten.native_batch_norm", "aten._native_batch_norm_legit",
                  "aten._native_batch_norm_legit_functional", "aten.native_batch_norm_backward",
                  "aten.cudnn_batch_norm", "aten.batch_norm"):
            x = ins[0] if "backward" not in op else ins[1]
            return max(1, _numel(x) // max(1, x[1] if len(x) > 1 else 1))
        # layer/group/rms norms and their backward (mean/rstd outputs or inputs), sums, means:
        # one output element per reduced group of input elements.
        if ins and outs:
            big = max(_numel(s) for s in ins)
            small = [s for s in (list(outs.values()) + ins) if 0 < _numel(s) < big]
            out = outs.get(out_idx, ())
            if _numel(out) < big:
                return max(1, big // max(1, _numel(out)))
            if "norm" in op and small:
                return max(1, big // max(1, min(_numel(s) for s in small)))
    except (IndexError, TypeError, ZeroDivisionError):
        pass
    return 1


def _op_name(record: Any) -> str:
    """The op without its overload: 'aten.sum' of 'aten.sum.dim_IntList'."""
    return record.op.rsplit(".", 1)[0] if record.op.count(".") > 1 else record.op


def _output_role(args: list[Any], mask_at: int, out_idx: int) -> int | None:
    """Which of (grad_input, grad_weight, grad_bias) output `out_idx` is: outputs are numbered
    among those the output mask (argument `mask_at`) asked for, so a first layer's output 0
    is its weight gradient. None past the last one asked for."""
    mask = _arg(args, mask_at, [True, True, True])
    mask = mask if isinstance(mask, list) else [True, True, True]
    roles = [i for i in range(3) if i >= len(mask) or mask[i]]
    return roles[out_idx] if out_idx < len(roles) else None


def _args(record: Any) -> list[Any]:
    """The recorded call's positional arguments (tensors as markers), torch-free."""
    try:
        args = json.loads(record.args_json).get("args", [])
    except (AttributeError, TypeError, ValueError):
        return []
    return args if isinstance(args, list) else []


def _arg(args: list[Any], pos: int, default: Any) -> Any:
    return args[pos] if pos < len(args) and args[pos] is not None else default


def _conv_length(record: Any, ins: list[tuple[int, ...]]) -> int:
    """Terms per output element of a (grouped, depthwise, transposed) convolution:
    C_in/groups * kh * kw."""
    args = _args(record)
    w, transposed, groups = ins[1], bool(_arg(args, 6, False)), int(_arg(args, 8, 1) or 1)
    if transposed:  # weight (C_in, C_out/groups, k...)
        return max(1, w[0] // max(1, groups) * _numel(w[2:]))
    return max(1, _numel(w[1:]))  # weight (C_out, C_in/groups, k...)


def _conv_backward_length(record: Any, ins: list[tuple[int, ...]], out_idx: int) -> int:
    """grad_input sums over the output channels of its group and the kernel window;
    grad_weight and grad_bias over batch and space. Outputs are numbered among those the
    output mask asked for (a first layer has no grad_input)."""
    args = _args(record)
    go, x, w = ins[0], ins[1], ins[2]
    transposed, groups = bool(_arg(args, 7, False)), int(_arg(args, 9, 1) or 1)
    role = _output_role(args, 10, out_idx)
    role = out_idx if role is None else role
    if role == 0:
        if transposed:  # weight (C_in, C_out/groups, k...)
            return max(1, w[1] * _numel(w[2:]))
        return max(1, w[0] // max(1, groups) * _numel(w[2:]))
    src = x if transposed and role == 1 else go
    return max(1, src[0] * _numel(src[2:]))


# Outputs that sum the elements of input 0 over some of its dimensions: the op, the position of
# its output mask argument, and the output roles (0 grad_input, 1 grad_weight, 2 grad_bias)
# that are such sums. A bias gradient sums the output gradient over batch and space; a norm's
# weight gradient sums it times the normalised input (of unit root mean square), taken as it.
_SUMS_OF_INPUT0: dict[str, tuple[int | None, tuple[int, ...]]] = {
    "aten.sum": (None, (0,)), "aten.mean": (None, (0,)),
    "aten.convolution_backward": (10, (2,)),
    "aten.native_batch_norm_backward": (9, (1, 2)),
    "aten.native_layer_norm_backward": (7, (1, 2)),
    "aten.native_group_norm_backward": (9, (1, 2)),
    # a norm's mean output: the mean of input 0 over what it normalises (a residual stream's
    # rows cancel to 1/1000 of their size)
    "aten.native_layer_norm": (None, (1,)), "aten.native_batch_norm": (None, (1,)),
    "aten.native_group_norm": (None, (1,)),
}
# Those of them that are means (the sum over K terms divided by K).
_MEANS = frozenset({"aten.mean", "aten.native_layer_norm", "aten.native_batch_norm",
                    "aten.native_group_norm"})


def cancellation(record: Any, out_idx: int) -> float | None:
    """How many times the terms of a sum-like output exceed the sum itself, as far as the
    statistics tell: sqrt(K) * ||terms|| / ||sum|| (Cauchy-Schwarz: at least the true ratio
    sum|x| / |sum x| taken over the output, and about 1 for terms of one sign). Every honest
    error of a sum, its own rounding and what its inputs' deviation becomes, is relative to
    sum|x|, so against the sum it grows by this factor. A conv bias before a BatchNorm has a
    true gradient of 0: its terms cancel to fp32 noise, 1e6x below their size, and a bf16 run's
    honest gradient differs from golden by 900x. None for other outputs or without
    statistics."""
    op = _op_name(record)
    spec = _SUMS_OF_INPUT0.get(op)
    if spec is None:
        return None
    mask_at, roles = spec
    role = out_idx if mask_at is None else _output_role(_args(record), mask_at, out_idx)
    if role not in roles:
        return None
    x = next((t for t in record.inputs if t.idx == 0), None)
    out = next((t for t in record.outputs if t.idx == out_idx), None)
    if x is None or out is None or out.numel <= 0 or x.numel <= out.numel:
        return None
    lx, lo = x.stats.get("l2"), out.stats.get("l2")
    if lx is None or lo is None or not (math.isfinite(lx) and math.isfinite(lo)):
        return None
    k = x.numel // out.numel
    total = lo * (k if op in _MEANS else 1)  # a mean is its sum over k
    if total <= 0:
        return math.inf if lx > 0 else 1.0
    return max(1.0, math.sqrt(k) * lx / total)


def _attention_length(op: str, ins: list[tuple[int, ...]], out_idx: int) -> int:
    """Scaled dot-product attention: scores sum over the head dim E, the output over the key
    length; in backward, grad_q over keys and grad_k / grad_v over queries."""
    if "backward" in op:  # (grad_out, query, key, value, ...)
        q, k = ins[1], ins[2]
        length = k[-2] if out_idx == 0 else q[-2]
        return max(1, length, q[-1])
    q, k = ins[0], ins[1]
    return max(1, k[-2], q[-1]) if out_idx == 0 else max(1, k[-2])


def input_rms(record: Any) -> float | None:
    """Smallest root-mean-square among the op's floating inputs (from their statistics)."""
    vals = []
    for t in record.inputs:
        l2 = t.stats.get("l2")
        if l2 is not None and t.numel > 1 and t.dtype.startswith(("float", "bfloat")):
            vals.append(float(l2) / math.sqrt(t.numel))
    return min(vals) if vals else None


def input_rounding(compute: str, rms: float | None) -> float:
    """Relative error of rounding values of root-mean-square `rms` to `compute`: the unit
    roundoff, more where the values reach the format's subnormal range."""
    err = UNIT_ROUNDOFF[compute] * C_INPUT
    sub = SUBNORMAL_SPACING.get(compute)
    if sub and rms is not None and rms > 0:
        err += C_SUBNORMAL * sub / rms
    return err


def reference_growth(k: int) -> float:
    """How a same-dtype reference kernel's relative error grows with the reduction length K,
    in units of the dtype's unit roundoff: sqrt-like within a BLAS block, then blocked
    summation makes it logarithmic (see the module docstring)."""
    k = max(int(k), 1)
    growth = C_REDUCTION * math.sqrt(min(k, BLAS_BLOCK))
    if k > BLAS_BLOCK:
        growth *= 1.0 + C_BLOCKS * math.log2(k / BLAS_BLOCK)
    return max(1.0, growth)


def expected_ratio(compute: str | None, dtype: str | None, k: int,
                   input_rms: float | None = None,
                   reference_error: float | None = None) -> float:
    """The local error ratio an honest kernel gives at this compute precision, dtype and
    reduction length (see the module docstring). `input_rms`: the smallest root-mean-square
    of the inputs the kernel rounds (subnormal range). `reference_error`: the replay's
    measured error of the same-dtype reference; where it is below the model's (a sum that a
    few terms dominate is nearly exact, whatever K), the measured one is the reference's."""
    if compute is None or dtype not in UNIT_ROUNDOFF or compute not in UNIT_ROUNDOFF:
        return 1.0
    if UNIT_ROUNDOFF[compute] <= UNIT_ROUNDOFF[dtype]:
        return 1.0
    dev = input_rounding(compute, input_rms)
    ref = UNIT_ROUNDOFF[dtype] * reference_growth(k)
    if reference_error is not None and math.isfinite(reference_error):
        ref = min(ref, max(reference_error, UNIT_ROUNDOFF[dtype]))  # the ratio's own floor
    return max(1.0, dev / ref)


def own_error(compute: str | None, dtype: str | None) -> float:
    """Relative error an honest kernel adds by itself (used without a replay): its inputs'
    rounding at the compute precision plus its output's rounding in its dtype."""
    u_out = UNIT_ROUNDOFF.get(dtype or "", 2.0 ** -24)
    u_in = UNIT_ROUNDOFF.get(compute or "", 0.0) * C_INPUT
    return u_in + u_out


# -- emulated reference (accuracy/replay/emulate.py) -----------------------------------------
# An honest kernel that rounds its inputs as the emulation does differs from the emulated
# reference (rounded inputs, fp64, rounded to the output dtype) by its accumulation order only:
# a = u_acc * reference_growth(K), with u_acc the fp32 accumulator GEMMs use for fp32, fp16
# and bf16 outputs, plus the output roundings that error flips (one ulp, 2 * u_out, with
# probability ~ a / u_out: sqrt(2 * u_out * a) in relative L2). EMULATED_SLACK covers the
# constants (clean sim runs measure 0 to 0.47 of the bound, medians 0 to 0.11). Whether a
# device really rounds like the emulation is judged, not assumed (judge.py `_use_emulated`,
# `[replay] emulation_match`).
EMULATED_SLACK = 4.0


def emulated_bound(dtype: str | None, k: int) -> float:
    """Relative L2 residual an honest kernel can leave against the emulated reference."""
    u_out = UNIT_ROUNDOFF.get(dtype or "", 2.0 ** -24)
    u_acc = min(u_out, UNIT_ROUNDOFF["float32"])
    a = u_acc * reference_growth(k)
    return EMULATED_SLACK * (a + math.sqrt(2.0 * u_out * a))
