"""One reduction per tensor that tells finite from not, and how close values are to a dtype's max.

Without a saturation check the probe is a sum (accumulated in float32 for 16-bit floats): it is
finite exactly when every element is finite, unless the sum itself overflows, which `exact_state`
rules out on the rare non-finite result. With a saturation check it is `aminmax`, which also
gives the largest magnitude. Either way it runs on the tensor's own device and returns a 0-d
tensor, so nothing waits for the device unless the caller asks for the value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from accuracy.dumpfile.dtypes import torch_dtype

FINITE, SATURATED, NONFINITE = 0, 1, 2
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Saturation:
    """Flag values with |x| >= fraction * max of a target dtype (float16 / bfloat16).

    A wider tensor (float32) over a target's max would overflow when cast to it; a tensor in
    the target dtype itself is flagged when within `fraction` of its own max.
    """

    dtypes: tuple[torch.dtype, ...] = field(default=_HALF)
    fraction: float = 1.0

    @classmethod
    def build(cls, spec: object) -> Saturation | None:
        """None, a fraction (0, 1], a dtype or its name, a list of those dtypes, or a Saturation."""
        if spec is None or spec is False:
            return None
        if isinstance(spec, Saturation):
            return spec
        if spec is True:
            return cls()
        if isinstance(spec, float | int):
            if not 0 < float(spec) <= 1:
                raise ValueError(f"saturation fraction must be in (0, 1], not {spec}")
            return cls(fraction=float(spec))
        items = [spec] if isinstance(spec, str | torch.dtype) else list(spec)  # type: ignore
        wanted = tuple(torch_dtype(d) if isinstance(d, str) else d for d in items)
        for d in wanted:
            if not isinstance(d, torch.dtype) or not d.is_floating_point:
                raise ValueError(f"saturation dtype must be a floating dtype, not {d!r}")
        return cls(dtypes=wanted)

    def targets(self, dtype: torch.dtype) -> Iterable[tuple[torch.dtype, float]]:
        """(target dtype, threshold) pairs that apply to a tensor of `dtype`."""
        if not dtype.is_floating_point:
            return
        own = torch.finfo(dtype).max
        for d in self.dtypes:
            dmax = torch.finfo(d).max
            if dmax <= own:
                yield d, self.fraction * dmax

    def describe(self) -> dict[str, object]:
        return {"dtypes": [str(d).removeprefix("torch.") for d in self.dtypes],
                "fraction": self.fraction}


def plain(t: torch.Tensor) -> bool:
    """Not a wrapper subclass (DTensor, an fp8 tensor): one whose own bytes can be read with
    dispatch disabled. A wrapper has no storage and reading it so crashes the process; the
    ops on its inner tensors are dispatched, and judged, one level down."""
    return type(t) is torch.Tensor or not is_traceable_wrapper_subclass(t)


def checkable(t: torch.Tensor) -> bool:
    """Only non-empty strided floating (or complex) plain tensors can hold inf or nan."""
    return (t.layout == torch.strided and t.numel() > 0
            and (t.is_floating_point() or t.is_complex()) and plain(t))


def _values(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t) if t.is_complex() else t


def probe(t: torch.Tensor, saturation: Saturation | None) -> torch.Tensor:
    """One fused reduction: a sum (plain check) or (min, max) pair (saturation check)."""
    x = _values(t)
    if x.dtype.itemsize == 1:  # float8: few kernels accept it
        x = x.float()
    if saturation is not None:
        mn, mx = torch.aminmax(x)
        return torch.maximum(mx, -mn).float()  # nan propagates
    if x.dtype in _HALF:
        return torch.sum(x, dtype=torch.float32)
    return torch.sum(x)


def state(value: float, dtype: torch.dtype, saturation: Saturation | None) -> int:
    """FINITE / SATURATED / NONFINITE from a probe value (NONFINITE may need `exact_state`)."""
    if not math.isfinite(value):
        return NONFINITE
    if saturation is not None:
        for _d, thr in saturation.targets(dtype):
            if abs(value) >= thr:
                return SATURATED
    return FINITE


def exact_state(t: torch.Tensor, saturation: Saturation | None) -> int:
    """The state from the tensor itself: rules out a sum that overflowed on finite data."""
    x = _values(t)
    if not bool(torch.isfinite(x).all()):
        return NONFINITE
    if saturation is None:
        return FINITE
    return state(float(x.abs().max()), t.dtype, saturation)


def counts(t: torch.Tensor) -> dict[str, float | int]:
    """nan/inf counts and the largest finite magnitude, for the message and the summary."""
    x = _values(t)
    fin = torch.isfinite(x)
    finite_vals = x[fin]
    return {
        "nan": int(torch.isnan(x).sum()),
        "inf": int(torch.isinf(x).sum()),
        "numel": x.numel(),
        "max_abs_finite": float(finite_vals.abs().max()) if finite_vals.numel() else math.nan,
    }
