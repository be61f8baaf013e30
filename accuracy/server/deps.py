"""FastAPI dependencies: the app's services, and the token check.

They are `async def` on purpose: they do no I/O, and a sync dependency costs a thread-pool hop
on every request."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from accuracy.server.boundedread import ViewLimits
from accuracy.server.errors import ApiError
from accuracy.server.jobs import JobManager
from accuracy.server.reportindex import RowIndex
from accuracy.server.storage import Storage

TOKEN_COOKIE = "accuracy_token"


@dataclass
class Services:
    storage: Storage
    rows: RowIndex
    jobs: JobManager
    token: str | None
    protect_reads: bool
    views: ViewLimits


async def services(request: Request) -> Services:
    return request.app.state.services


async def get_storage(request: Request) -> Storage:
    return request.app.state.services.storage


async def get_rows(request: Request) -> RowIndex:
    return request.app.state.services.rows


async def get_view_limits(request: Request) -> ViewLimits:
    return request.app.state.services.views


async def get_jobs(request: Request) -> JobManager:
    return request.app.state.services.jobs


def presented_token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-accuracy-token") or request.cookies.get(TOKEN_COOKIE)


def _check(request: Request) -> None:
    token = request.app.state.services.token
    if token is None:
        return
    given = presented_token(request)
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(401, "this endpoint needs the server's API token "
                            "(header 'Authorization: Bearer <token>')")


async def require_write(request: Request) -> None:
    """Write endpoints need the token whenever the server has one."""
    _check(request)


def check_read(request: Request) -> None:
    """Reads need the token too when the server listens beyond loopback (protect_reads)."""
    if request.app.state.services.protect_reads:
        _check(request)


async def require_read(request: Request) -> None:
    check_read(request)
