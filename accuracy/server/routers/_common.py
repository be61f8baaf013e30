"""Helpers more than one router uses, so routers never import each other."""

from __future__ import annotations

from accuracy.dumpfile import Dump, TensorRecord
from accuracy.server.errors import ApiError


def tensor_at(d: Dump, address: str) -> TensorRecord:
    """The tensor at `address` in a run, or a 404 naming it."""
    try:
        return d.tensor_record(address)
    except (KeyError, ValueError):
        raise ApiError(404, f"no tensor at {address!r} in this run") from None
