"""Errors the API answers with, and handlers that never leak stack traces or server paths."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from accuracy.errors import AccuracyError

log = logging.getLogger(__name__)


class ApiError(AccuracyError):
    """An expected failure with a status code and a message fit for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what} not found")


_PATHLIKE = re.compile(r"(?:[A-Za-z]:)?(?:/[^\s/:'\"]+){2,}/?")
_ADDRESS = re.compile(r"^/[^/]+/\d+(?:/(?:input|output)(?:/\d+)?)?/?$")  # tensor addresses


def scrub(message: str, *paths: str | Path) -> str:
    """Replace server paths in a message (known ones first, then anything path-shaped)."""
    for p in sorted((str(p) for p in paths if p), key=len, reverse=True):
        message = message.replace(p, "<file>")
    return _PATHLIKE.sub(lambda m: m.group(0) if _ADDRESS.match(m.group(0)) else "<path>",
                         message)


def install_handlers(app: FastAPI) -> None:
    """JSON errors of one shape: {"error": message}; a 500 says nothing about the server."""

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": scrub(exc.message)}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": scrub(str(exc.detail))}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def _gone(req: Request, _exc: ClientDisconnect) -> JSONResponse:
        # a client that goes away mid-upload is routine: one line, no traceback
        log.warning("client %s disconnected during %s %s; request dropped",
                    req.client.host if req.client else "?", req.method, req.url.path)
        return JSONResponse({"error": "client disconnected"}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        return JSONResponse({"error": "invalid request", "problems": problems}, status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", req.method, req.url.path)
        return JSONResponse({"error": "internal server error (see the server log)"},
                            status_code=500)
