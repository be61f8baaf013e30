"""The report service: REST API and web UI over runs and reports (`accuracy serve`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accuracy.server.serve import serve as serve

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(data_dir: Any, **kw: Any) -> FastAPI:
    """Imported lazily so `import accuracy.server` works without the server extras."""
    from accuracy.server.app import create_app as _create

    return _create(data_dir, **kw)


__all__ = ["create_app"]
