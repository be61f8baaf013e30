"""A spawn target for tests that start several servers' schema set-up at once: kept apart from
the test modules so each child imports SQLAlchemy and the index only (no torch, no FastAPI)."""

from __future__ import annotations

from typing import Any


def start_engine(url: str, barrier: Any, results: Any) -> None:
    """Wait for the others, create (or migrate) the schema, report 'ok' or the error line."""
    from accuracy.server.db import make_engine

    barrier.wait(60)
    try:
        make_engine(url).dispose()
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - reported to the test
        results.put(f"{type(e).__name__}: {str(e).splitlines()[0]}")
