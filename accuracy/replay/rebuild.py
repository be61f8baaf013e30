"""Rebuild a recorded call on the reference backend: inputs from the dump, devices remapped,
optionally upcast. Kept apart from the engine so load mode and tests can reuse it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accuracy.dumpfile import OpRecord, TensorRecord, schema
from accuracy.errors import AccuracyError

UPCASTS = ("fp64", "fp32", "none")


class Unreplayable(AccuracyError):
    """The op cannot be replayed; the message is the reason shown to the user."""


def upcast_dtype(dtype: torch.dtype, upcast: str) -> torch.dtype:
    """The dtype the high-precision reference uses for a tensor or dtype argument."""
    if upcast == "none":
        return dtype
    if dtype.is_complex:
        return torch.complex128 if upcast == "fp64" or dtype == torch.complex128 else (
            torch.complex64)
    if dtype.is_floating_point:
        if upcast == "fp64" or dtype == torch.float64:
            return torch.float64
        return torch.float32
    return dtype


def restore_strides(value: torch.Tensor, t: TensorRecord, device: torch.device) -> torch.Tensor:
    """`value` (the contiguous recorded tensor) on `device` with `t`'s strides where plain."""
    stride = tuple(t.stride)
    if stride and len(stride) == value.dim() and stride != tuple(value.stride()) \
            and _non_overlapping(t.shape, stride):
        out = torch.empty_strided(t.shape, stride, dtype=value.dtype, device=device)
        out.copy_(value)
        return out
    return value.to(device)


def _non_overlapping(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    dims = sorted((s, n) for s, n in zip(stride, shape, strict=True) if n > 1)
    span = 1
    for s, n in dims:
        if s < span:
            return False
        span = s * n
    return True


def uninitialised_inputs(rec: OpRecord) -> set[int]:
    """Inputs the dumper saw as uninitialised memory (a buffer an op or collective fills
    later): not data, so the reference gets a zero-filled stand-in of their shape."""
    io = rec.extra.get(schema.EXTRA_UNINITIALIZED_IO)
    return set(io.get("input") or ()) if isinstance(io, dict) else set()


def stand_in(t: TensorRecord, device: torch.device) -> torch.Tensor:
    """A zero-filled tensor in place of uninitialised memory (`t`'s shape, dtype, strides)."""
    from accuracy.dumpfile.dtypes import torch_dtype

    stride = tuple(t.stride)
    dtype = torch_dtype(t.dtype)
    if stride and len(stride) == len(t.shape) and _non_overlapping(t.shape, stride):
        return torch.empty_strided(t.shape, stride, dtype=dtype, device=device).zero_()
    return torch.zeros(t.shape, dtype=dtype, device=device)


def check_inputs(rec: OpRecord, compiled_ok: bool = False) -> None:
    """Raise Unreplayable for ops whose call cannot be rebuilt faithfully; `compiled_ok`: a
    kernel row, whose call is its reference's ops (replay/kernels.py), not recorded args."""
    extra = rec.extra
    if extra.get(schema.EXTRA_COMPILED) and not compiled_ok:
        raise Unreplayable(f"compiled kernel ({extra.get('compiled')}): no replay for it")
    if extra.get(schema.EXTRA_UNINITIALIZED):
        raise Unreplayable("uninitialised factory: its output is whatever memory held")
    not_data = uninitialised_inputs(rec)
    missing = [t for t in rec.inputs if not t.has_data and t.idx not in not_data]
    if missing:
        where = ", ".join(t.address for t in missing[:3])
        if all(t.stats.get("nan_count", 0) < 0 for t in missing):
            raise Unreplayable(f"input not in the dump (statistics mode, filtered, or "
                               f"uninitialised memory): {where}")
        raise Unreplayable(f"input not in the dump (statistics mode or filtered): {where}")
    if not compiled_ok and len(rec.inputs) != rec.args_json.count('"__tensor__"'):
        raise Unreplayable("inputs were not recorded (data_mode without 'input')")


def _map(obj: Any, device: torch.device, dtype_map: Any) -> Any:
    if isinstance(obj, list | tuple):
        return type(obj)(_map(x, device, dtype_map) for x in obj)
    if isinstance(obj, dict):
        return {k: _map(v, device, dtype_map) for k, v in obj.items()}
    if isinstance(obj, torch.device):
        return device
    if isinstance(obj, torch.dtype):
        return dtype_map(obj)
    return obj


def build_call(rec: OpRecord, inputs: list[torch.Tensor], device: torch.device,
               upcast: str, mutable: bool = True,
               convert: Callable[[int, torch.Tensor, torch.dtype], torch.Tensor] | None = None,
               ) -> tuple[list[Any], dict[str, Any]]:
    """(args, kwargs) for one run, upcast when `upcast` != "none".

    A `mutable` op gets fresh copies, so the two runs start from the same inputs (strides are
    preserved); other ops share `inputs` where the dtype does not change, and get their upcast
    copies from `convert(i, tensor, dtype)` when given (a cache; never for mutable ops).
    """
    if convert is None or mutable:
        tensors = [t.to(upcast_dtype(t.dtype, upcast), copy=mutable) for t in inputs]
    else:
        tensors = [convert(i, t, upcast_dtype(t.dtype, upcast)) for i, t in enumerate(inputs)]
    args, kwargs = rec.call(tensors)

    def dt(d: torch.dtype) -> torch.dtype:
        return upcast_dtype(d, upcast)

    return _map(args, device, dt), _map(kwargs, device, dt)
