"""Encode an op's non-tensor arguments as JSON, with placeholders for tensors.

The encoding keeps enough to rebuild the call later (replay): dtypes, devices, memory formats,
layouts, non-finite floats and complex numbers all survive the round trip.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Callable, Sequence
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import torch

from accuracy.dumpfile import dtypes
from accuracy.dumpfile.validate import parse_json
from accuracy.errors import AccuracyError

# The memory formats and layouts a call argument may name, by their text (also the values a
# compiled graph's constants may hold: compiled/graphform.py).
MEMORY_FORMATS = {
    str(m): m
    for m in (
        torch.contiguous_format,
        torch.channels_last,
        torch.channels_last_3d,
        torch.preserve_format,
    )
}
LAYOUTS = {str(x): x for x in (torch.strided, torch.sparse_coo, torch._mkldnn)}


def _encode(obj: Any, tensor_index: Callable[[torch.Tensor], int]) -> Any:
    if isinstance(obj, torch.Tensor):
        return {"__tensor__": tensor_index(obj)}
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, list | tuple):
        return [_encode(x, tensor_index) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _encode(v, tensor_index) for k, v in obj.items()}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"__device__": str(obj)}
    if isinstance(obj, torch.memory_format):
        return {"__memory_format__": str(obj)}
    if isinstance(obj, torch.layout):
        return {"__layout__": str(obj)}
    if isinstance(obj, complex):
        return {"__complex__": [obj.real, obj.imag]}
    if isinstance(obj, torch.SymInt | torch.SymFloat | torch.SymBool):
        return _encode(obj.node.hint if hasattr(obj.node, "hint") else int(obj), tensor_index)
    if isinstance(obj, torch.Generator):
        return {"__generator__": None}
    return {"__repr__": repr(obj)}


def encode_call(
    args: Sequence[Any], kwargs: dict[str, Any],
    tensor_index: Callable[[torch.Tensor], int] | None = None,
) -> str:
    """JSON for one call; `tensor_index` gives each tensor its input placeholder number (None:
    the tensors are numbered in the order they appear, args before kwargs)."""
    fast = _encode_natively(args, kwargs, tensor_index)
    if fast is not None:
        return fast
    index = tensor_index if tensor_index is not None else _in_order()
    return _COMPACT.encode(
        {"args": _encode(list(args), index), "kwargs": _encode(kwargs, index)})


def _in_order() -> Callable[[torch.Tensor], int]:
    counter = itertools.count()
    return lambda _t: next(counter)


def _encode_natively(args: Sequence[Any], kwargs: dict[str, Any],
                     tensor_index: Callable[[torch.Tensor], int] | None) -> str | None:
    """The same text as `_encode`'s walk, from json's C encoder (it runs per op: the walk in
    Python cost ~11 us an op, a fifth of the recorder's time). Lists, tuples, str, int, bool,
    None and finite floats are what both write alike; every other object reaches `default`,
    which is `_encode` itself, in the walk's order. None where the two could differ, left
    to the walk: a non-finite float (json refuses it here; `_encode` tags it), or a dict
    among the arguments (json spells a `True` or `None` key its own way; no ATen schema
    takes a dict, and kwargs' keys are checked)."""
    for k in kwargs:
        if type(k) is not str:
            return None
    for a in args:
        if isinstance(a, dict):
            return None
    _NATIVE_STATE.index = tensor_index if tensor_index is not None else _in_order()
    try:
        return _native_encode({"args": args, "kwargs": kwargs})
    except (ValueError, TypeError):
        return None


_NATIVE_STATE = threading.local()  # the numbering of the call being encoded, per thread


def _native_default(obj: Any) -> Any:
    index = _NATIVE_STATE.index
    if type(obj) is torch.Tensor:
        return {"__tensor__": index(obj)}
    return _encode(obj, index)


_NATIVE = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_native_default)


def _one_shot(enc: json.JSONEncoder) -> Callable[[Any], str]:
    """`enc.encode`, less the per-call setup: json builds its C encoder anew at every
    `encode` (a few µs, per op here); this builds it once from `enc`'s own settings (no
    circular-reference check: call arguments hold no cycles). Without the C encoder
    (another Python), `enc.encode` itself."""
    if c_make_encoder is None or enc.indent is not None:
        return enc.encode
    encode = c_make_encoder(None, enc.default,
                            encode_basestring_ascii if enc.ensure_ascii else encode_basestring,
                            enc.indent, enc.key_separator, enc.item_separator, enc.sort_keys,
                            enc.skipkeys, enc.allow_nan)
    def one_shot(obj: Any) -> str:
        return "".join(encode(obj, 0))

    probe = {"args": [1, 2.5, "a", None, True, [3]], "kwargs": {"k": (4,)}}
    try:  # the C encoder's arguments are CPython's own: another version, another list
        if one_shot(probe) == enc.encode(probe):
            return one_shot
    except (TypeError, ValueError):
        pass
    return enc.encode


_native_encode = _one_shot(_NATIVE)

# json.dumps with any non-default option builds a new encoder per call; this runs per op
_COMPACT = json.JSONEncoder(separators=(",", ":"))


class UnrebuildableArgument(AccuracyError, ValueError):
    """An argument was recorded only by its repr and cannot be rebuilt."""


def _tagged(key: str, val: Any, tensors: Sequence[Any]) -> Any:
    if key == "__tensor__":
        if not isinstance(val, int) or isinstance(val, bool) or not 0 <= val < len(tensors):
            raise ValueError(f"tensor placeholder {val!r} out of range ({len(tensors)} inputs)")
        return tensors[val]
    if key == "__float__":
        return float(val)
    if key == "__dtype__":
        if not isinstance(val, str):
            raise ValueError(f"unknown dtype {val!r}")
        return dtypes.torch_dtype(val)
    if key == "__device__":
        return _device(val)
    if key == "__memory_format__":
        return MEMORY_FORMATS[val]
    if key == "__layout__":
        return LAYOUTS[val]
    if key == "__complex__":
        return complex(float(val[0]), float(val[1]))
    if key == "__generator__":
        return None
    if key == "__repr__":
        raise UnrebuildableArgument(f"argument recorded only as {val!r}")
    return _NOT_TAGGED


_NOT_TAGGED = object()


def _device(text: Any) -> torch.device:
    """A recorded device; one whose type this process does not know (`npu:0` recorded where
    torch_npu was imported, read where it is not) is an out-of-tree backend, which PyTorch
    knows only as PrivateUse1: decoded as `privateuseone:<index>`, so the call rebuilds and
    replay puts its reference device in its place."""
    if not isinstance(text, str):
        raise TypeError(f"device {text!r} is not a string")
    try:
        return torch.device(text)
    except RuntimeError:
        kind, _, index = text.partition(":")
        if not kind.isidentifier() or not (index == "" or index.isdigit()) or len(index) > 6:
            raise
        return torch.device("privateuseone", int(index) if index else None)


def _decode(obj: Any, tensors: Sequence[Any]) -> Any:
    if isinstance(obj, list):
        return [_decode(x, tensors) for x in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (key, val), = obj.items()
        try:
            out = _tagged(key, val, tensors)
        except (KeyError, TypeError, IndexError, RuntimeError) as e:
            raise ValueError(f"bad recorded argument {key}={val!r} ({e})") from None
        if out is not _NOT_TAGGED:
            return out
    return {k: _decode(v, tensors) for k, v in obj.items()}


def decode_call(encoded: str, tensors: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Rebuild (args, kwargs), putting `tensors[i]` where placeholder i was recorded.

    The text comes from a file: its nesting is bounded and anything malformed is a ValueError.
    """
    data = parse_json(encoded, "recorded call arguments")
    if not isinstance(data, dict) or not isinstance(data.get("args"), list) or not isinstance(
            data.get("kwargs"), dict):
        raise ValueError("recorded call arguments are not {\"args\": [...], \"kwargs\": {...}}")
    return _decode(data["args"], tensors), _decode(data["kwargs"], tensors)
