"""The rows endpoint's fast lane: `GET /api/reports/{id}/rows` answered in front of the router.

Paging a report's rows is what the web UI does most, and a page is a cached body or a slice of a
cached order (reportindex.RowIndex); FastAPI's route matching and dependency solving cost more
per request than that (~1 ms on this project's 2-core machine). This pure ASGI layer parses the
same query parameters by the same rules (Starlette's parser; the last value of a repeated scalar
wins) and calls the same RowIndex.page_json, so its answers are the route's answers. Anything
it does not accept exactly (another path or method, a parameter the route would refuse or
coerce, a read token that does not check out, an unknown report) goes on to the router, which
answers as before, errors included. The route stays declared in routers/reports.py (API docs).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response

from accuracy.server.deps import check_read
from accuracy.server.errors import ApiError
from accuracy.server.reportindex import SORTABLE, RowQuery

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]

_PATH = re.compile(r"^/api/reports/([^/]+)/rows$")
_DIGITS = re.compile(r"^[0-9]{1,9}$")
PHASES = ("forward", "backward", "optimizer")  # routers/reports.row_query's pattern
MAX_LENGTH = {"op": 200, "module": 400, "q": 200}  # and its max_length
MAX_LIMIT = 1000


def parse_rows_query(query_string: bytes) -> tuple[RowQuery, int, int] | None:
    """(query, offset, limit) as the route would build them, or None where the route might
    answer differently (an error, or a value it would coerce)."""
    params = QueryParams(query_string)
    text: dict[str, str | None] = {}
    for name, cap in MAX_LENGTH.items():
        value = params.get(name)
        if value is not None and len(value) > cap:
            return None
        text[name] = value
    phase = params.get("phase")
    sort, order = params.get("sort", "idx"), params.get("order", "asc")
    offset, limit = params.get("offset", "0"), params.get("limit", "50")
    if ((phase is not None and phase not in PHASES) or sort not in SORTABLE
            or order not in ("asc", "desc") or not _DIGITS.match(offset)
            or not _DIGITS.match(limit) or not 1 <= int(limit) <= MAX_LIMIT):
        return None
    verdicts = tuple(v for item in params.getlist("verdict") for v in item.split(",") if v)
    return (RowQuery(verdict=verdicts, phase=phase, op=text["op"], module=text["module"],
                     q=text["q"], sort=sort, order=order), int(offset), int(limit))


class RowsFastLane:
    """ASGI middleware: serves valid row-page requests, passes everything else on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            m = _PATH.match(scope["path"])
            if m is not None and await self._answer(m.group(1), scope, receive, send):
                return
        await self.app(scope, receive, send)

    async def _answer(self, report_id: str, scope: Scope, receive: Callable,
                      send: Callable) -> bool:
        state = scope["app"].state
        if not getattr(state, "rows_fast_lane", False):
            return False
        parsed = parse_rows_query(scope.get("query_string", b""))
        if parsed is None:
            return False
        svc = state.services
        try:
            if svc.protect_reads:
                check_read(Request(scope))
            q, offset, limit = parsed
            body = svc.rows.cached_page(report_id, q, offset, limit)
            if body is None and svc.rows.page_ready(report_id, q):
                # a slice of a known order and one local read: cheaper here than a thread hop
                body = svc.rows.page_json(report_id, q, offset, limit)
            if body is None:
                body = await run_in_threadpool(svc.rows.page_json, report_id, q, offset, limit)
        except ApiError:
            return False  # the route gives the error response
        await Response(body, media_type="application/json")(scope, receive, send)
        return True
