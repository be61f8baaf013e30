"""JSON-safe values: dumps, reports and monitor files hold nan and inf, which strict JSON
cannot carry. Torch-free: the server, the live check and the monitor's page share it (the
server's index columns read numbers through `as_float`)."""

from __future__ import annotations

import json
import math
from typing import Any

from accuracy.errors import AccuracyError

# Deeper than anything we build (a report row is ~6 deep); a container holding itself reaches
# it too, so a cycle is refused here rather than by a RecursionError.
MAX_DEPTH = 100


class NestingError(AccuracyError, ValueError):
    """A value nested deeper than MAX_DEPTH, or holding itself."""


def jsonable(value: Any, _depth: int = 0) -> Any:
    """Non-finite floats become the strings "nan", "inf", "-inf"; containers are walked, at
    most MAX_DEPTH deep (NestingError beyond)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (dict, list, tuple)):
        if _depth >= MAX_DEPTH:
            raise NestingError(f"a value nested deeper than {MAX_DEPTH} levels (or holding "
                               "itself) cannot be written as JSON")
        if isinstance(value, dict):
            return {str(k): jsonable(v, _depth + 1) for k, v in value.items()}
        return [jsonable(v, _depth + 1) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return jsonable(value.item(), _depth + 1)
        except (TypeError, ValueError):
            return str(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def as_float(value: Any) -> float | None:
    """A finite float for an index column, or None (nan, inf, strings and missing values)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def loads_bounded(text: str, what: str, max_depth: int, max_chars: int) -> Any:
    """`json.loads` of untrusted text: longer than `max_chars` or not JSON is a ValueError,
    nested deeper than `max_depth` a NestingError, each naming `what`.

    Python's JSON parser recurses: 100k nested brackets raise RecursionError, and shallower
    text still overflows the recursive code that walks the result. Text with few brackets is
    passed straight through (one `str.count` each); the rest is measured after parsing.
    """
    if len(text) > max_chars:
        raise ValueError(f"{what}: JSON text of {len(text)} characters (limit {max_chars})")
    if text.count("[") + text.count("{") <= max_depth:
        try:
            return json.loads(text)
        except ValueError as e:
            raise ValueError(f"{what}: invalid JSON ({e})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise NestingError(f"{what}: JSON nested deeper than {max_depth} levels") from None
    except ValueError as e:
        raise ValueError(f"{what}: invalid JSON ({e})") from None
    _check_depth(value, what, max_depth)
    return value


def _check_depth(value: Any, what: str, max_depth: int) -> None:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        if d > max_depth:
            raise NestingError(f"{what}: JSON nested deeper than {max_depth} levels")
        stack.extend((x, d + 1) for x in v if isinstance(x, list | dict))
