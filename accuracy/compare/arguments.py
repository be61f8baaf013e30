"""Arguments differ: two paired ops called with different non-tensor arguments.

A replay re-runs an op with the device's own arguments, so when the device run passed another
scalar (a scale, an eps, an alpha) than the golden run, the op's local error is zero while its
output diverges: the kernel is right, the call is not. That divergence must not read PASS: the
row says "arguments differ" with both values and is judged at its accumulated verdict.

Compared: numbers and booleans in the recorded call (`dumpfile/argcodec.py`'s JSON), by
position. Not compared: tensors (they have rows of their own), devices and dtypes (a device
run differs there by design; dtypes have their own message), and arguments recorded only by
their repr (process groups, generators).
"""

from __future__ import annotations

import math
from typing import Any

from accuracy.dumpfile import OpRecord
from accuracy.dumpfile.validate import parse_json

_SKIPPED_TAGS = ("__tensor__", "__device__", "__dtype__", "__repr__", "__generator__",
                 "__memory_format__", "__layout__")
MAX_SHOWN = 3


def _scalar(v: Any) -> Any:
    """A comparable scalar (floats by value, non-finite included), or None when skipped."""
    if isinstance(v, bool | int | float):
        return v
    if isinstance(v, dict) and len(v) == 1:
        (k, x), = v.items()
        if k == "__float__":
            try:
                return float(x)
            except (TypeError, ValueError):
                return None
        if k == "__complex__" and isinstance(x, list) and len(x) == 2:
            return complex(float(x[0]), float(x[1]))
    return None


def _walk(a: Any, b: Any, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and len(a) == 1 and next(iter(a)) in _SKIPPED_TAGS:
        return
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _walk(x, y, f"{where}[{i}]", out)
        return
    if isinstance(a, dict) and isinstance(b, dict) and not (len(a) == 1 and next(iter(a))
                                                            .startswith("__")):
        for k in sorted(set(a) & set(b)):
            _walk(a[k], b[k], f"{where}.{k}" if where else k, out)
        return
    x, y = _scalar(a), _scalar(b)
    if x is None or y is None or type(x) is bool and type(y) is not bool:
        return
    same = x == y or (isinstance(x, float) and isinstance(y, float)
                      and math.isnan(x) and math.isnan(y))
    if not same:
        out.append(f"{where} my {x!r}, golden {y!r}")


def differences(my: OpRecord, golden: OpRecord) -> list[str]:
    """'where my X, golden Y' for each scalar argument that differs ([] when none, or when
    either call's JSON cannot be read)."""
    if my.args_json == golden.args_json:
        return []
    try:
        a = parse_json(my.args_json, "my op's arguments")
        b = parse_json(golden.args_json, "golden op's arguments")
    except ValueError:
        return []
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return []
    out: list[str] = []
    _walk(a.get("args"), b.get("args"), "args", out)
    _walk(a.get("kwargs"), b.get("kwargs"), "kwargs", out)
    return out


PREFIX = "arguments differ: "


def message(diffs: list[str]) -> str:
    shown = "; ".join(diffs[:MAX_SHOWN])
    more = f" (+{len(diffs) - MAX_SHOWN} more)" if len(diffs) > MAX_SHOWN else ""
    return f"{PREFIX}{shown}{more}: the call differs from golden, not the kernel"
