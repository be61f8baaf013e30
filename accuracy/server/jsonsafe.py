"""JSON-safe values: dumps hold nan and inf, which strict JSON cannot carry."""

from __future__ import annotations

import math
from typing import Any

from accuracy.jsonsafe import jsonable

__all__ = ["as_float", "jsonable"]


def as_float(value: Any) -> float | None:
    """A finite float for an index column, or None (nan, inf, strings and missing values)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
