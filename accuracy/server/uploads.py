"""Streaming uploads: the body goes to a temp file under the data dir, chunk by chunk, and
stops at the size cap. Nothing is spooled elsewhere and the client's file name is never a path.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from accuracy.server.errors import ApiError

_FIELD_CAP = 1024


def _too_big(cap: int) -> ApiError:
    return ApiError(413, f"upload is larger than this server's limit of {cap} bytes")


def _check_length(request: Request, cap: int, slack: int = 0) -> None:
    length = request.headers.get("content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError:
            raise ApiError(400, "invalid Content-Length") from None
        if n > cap + slack:
            raise _too_big(cap)


async def receive_raw(request: Request, dest: Path, cap: int) -> int:
    """The request body is the file (curl --data-binary @dump.h5)."""
    _check_length(request, cap)
    n = 0
    with open(dest, "wb") as f:
        async for chunk in request.stream():
            n += len(chunk)
            if n > cap:
                raise _too_big(cap)
            f.write(chunk)
    if n == 0:
        raise ApiError(400, "empty upload")
    return n


async def receive_multipart(request: Request, dest: Path, cap: int
                            ) -> tuple[int, str | None, dict[str, str]]:
    """A multipart form (curl -F file=@dump.h5 -F name=...): the first file part is streamed to
    dest; small text fields are returned. Returns (bytes, client file name, fields)."""
    _check_length(request, cap, slack=64 * 1024)
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise ApiError(400, "multipart upload without a boundary")

    state: dict = {"headers": {}, "field": b"", "value": b"", "kind": None, "name": None,
                   "buf": bytearray(), "filename": None, "written": 0, "seen_file": False}
    fields: dict[str, str] = {}
    out = open(dest, "wb")  # noqa: SIM115 - closed in finally

    def on_part_begin() -> None:
        state.update(headers={}, kind=None, name=None, buf=bytearray())

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["field"].lower()] = state["value"]
        state["field"], state["value"] = b"", b""

    def on_headers_finished() -> None:
        _, disp = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = disp.get(b"name", b"").decode("utf-8", "replace")
        filename = disp.get(b"filename")
        state["name"] = name
        if filename is not None and not state["seen_file"]:
            state["kind"] = "file"
            state["seen_file"] = True
            state["filename"] = filename.decode("utf-8", "replace")
        elif filename is not None:
            raise ApiError(400, "upload one file per request")
        else:
            state["kind"] = "field"

    def on_part_data(data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if state["kind"] == "file":
            state["written"] += len(chunk)
            if state["written"] > cap:
                raise _too_big(cap)
            out.write(chunk)
        else:
            state["buf"] += chunk
            if len(state["buf"]) > _FIELD_CAP:
                raise ApiError(400, "form field too long")

    def on_part_end() -> None:
        if state["kind"] == "field" and state["name"]:
            fields[state["name"]] = state["buf"].decode("utf-8", "replace")

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field,
        "on_header_value": on_header_value, "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished, "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    })
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except (ApiError, HTTPException, ClientDisconnect):  # too large, stalled, or gone
        raise
    except Exception:  # noqa: BLE001 - any parser failure is the client's malformed body
        raise ApiError(400, "malformed multipart body") from None
    finally:
        out.close()
    if not state["seen_file"]:
        raise ApiError(400, "multipart upload has no file part (use -F file=@dump.h5)")
    if state["written"] == 0:
        raise ApiError(400, "empty upload")
    return state["written"], state["filename"], fields
