"""Monitor series in the web UI: a list of `*.monitor.h5` files under the allowed roots, and
each drawn as the page `accuracy monitor plot` writes (figures per layer over steps, a layer x
step heat map). Names in a file are untrusted: the page carries them as escaped JSON and draws
them with textContent / canvas text only."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

import os
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from accuracy.server.deps import Services, services
from accuracy.server.errors import ApiError
from accuracy.server.routers.ui import _authorized, _login, _page

router = APIRouter(include_in_schema=False)

MAX_LISTED = 500
MAX_FILE_BYTES = 256 << 20  # larger series: `accuracy monitor plot` (it bins steps the same way)


def _find(roots: list[Path]) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            found += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".monitor.h5")]
            if len(found) >= MAX_LISTED:
                return found[:MAX_LISTED]
    return found


@router.get("/monitor", response_class=HTMLResponse)
def monitor_list(request: Request, svc: Services = Depends(services)) -> Response:
    """Monitor files under the server's allowed roots."""
    if not _authorized(request, svc):
        return _login(request)
    files = [str(p) for p in _find(svc.storage.allowed_roots)]
    return _page(request, svc, "monitor.html", {"title": "monitor", "files": files,
                                                "limit": MAX_LISTED})


@router.get("/monitor/view", response_class=HTMLResponse)
def monitor_view(request: Request, path: str = Query(..., max_length=4096),
                 svc: Services = Depends(services)) -> Response:
    """One series drawn (self-contained page)."""
    if not _authorized(request, svc):
        return _login(request)
    from accuracy.errors import AccuracyError
    from accuracy.server.isolated import monitor_page

    p = svc.storage.allowed_path(path)
    if p.stat().st_size > MAX_FILE_BYTES:
        raise ApiError(413, f"the series is over {MAX_FILE_BYTES >> 20} MiB: draw it with "
                            "`accuracy monitor plot FILE -o plot.html`")
    try:  # in a child with a time limit: HDF5 can loop forever on damaged metadata
        page = monitor_page(p)
    except AccuracyError as exc:
        raise ApiError(400, " ".join(str(exc).split())) from None
    return HTMLResponse(page)
