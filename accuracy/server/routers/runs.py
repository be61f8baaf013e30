"""Runs: upload or register a dump, list, inspect, delete."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from accuracy.server.deps import get_storage, require_read, require_write
from accuracy.server.errors import ApiError
from accuracy.server.schemas import RegisterIn, RunDetail, RunOut
from accuracy.server.storage import Storage, clean_label
from accuracy.server.uploads import receive_multipart, receive_raw

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.get("", response_model=list[RunOut], dependencies=[Depends(require_read)])
def list_runs(storage: Storage = Depends(get_storage)) -> list[RunOut]:
    return [RunOut.of(r) for r in storage.runs()]


@router.post("", response_model=RunDetail, status_code=201,
             dependencies=[Depends(require_write)],
             openapi_extra={"requestBody": {"content": {
                 "multipart/form-data": {"schema": {"type": "object", "properties": {
                     "file": {"type": "string", "format": "binary"},
                     "name": {"type": "string"}}}},
                 "application/octet-stream": {"schema": {"type": "string",
                                                         "format": "binary"}}}}})
async def upload_run(request: Request, name: str | None = Query(None, max_length=200),
                     storage: Storage = Depends(get_storage)) -> RunDetail:
    """Upload a dump, streamed to disk under the size cap, then validated and indexed.

    Send a multipart form (field `file`, optional `name`) or the raw file as the body with
    `?name=`. The name is a label only; the file is stored under a generated id.
    """
    tmp = storage.tmp_path()
    try:
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("multipart/form-data"):
            _, filename, fields = await receive_multipart(request, tmp, storage.max_upload_bytes)
            label = clean_label(name or fields.get("name") or filename, "upload.h5")
            if filename:
                clean_label(filename, "upload.h5")  # refuse '../x.h5' even when name is set
        else:
            await receive_raw(request, tmp, storage.max_upload_bytes)
            label = clean_label(name, "upload.h5")
        run = await run_in_threadpool(storage.add_uploaded, tmp, label)
    finally:
        tmp.unlink(missing_ok=True)
    return RunDetail.of(run)


@router.post("/register", response_model=RunDetail, status_code=201,
             dependencies=[Depends(require_write)])
def register_run(body: RegisterIn, storage: Storage = Depends(get_storage)) -> RunDetail:
    """Index a dump already on the server, inside one of its allowed roots (opened read-only)."""
    return RunDetail.of(storage.register(body.path, body.name))


@router.get("/{run_id}", response_model=RunDetail, dependencies=[Depends(require_read)])
def get_run(run_id: str, storage: Storage = Depends(get_storage)) -> RunDetail:
    return RunDetail.of(storage.run(run_id))


@router.delete("/{run_id}", status_code=204, dependencies=[Depends(require_write)])
def delete_run(run_id: str, storage: Storage = Depends(get_storage)) -> Response:
    """Forget a run; an uploaded dump's file is deleted, a registered one is left alone."""
    if not run_id.isalnum():
        raise ApiError(400, "invalid run id")
    storage.delete_run(run_id)
    return Response(status_code=204)
