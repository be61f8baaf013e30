"""JSON-safe values: dumps, reports and monitor files hold nan and inf, which strict JSON
cannot carry. Torch-free: the server, the live check and the monitor's page share it."""

from __future__ import annotations

import math
from typing import Any


def jsonable(value: Any) -> Any:
    """Non-finite floats become the strings "nan", "inf", "-inf"; containers are walked."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            return str(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)
