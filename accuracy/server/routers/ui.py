"""The web UI: server-rendered pages (Jinja2); charts and table paging call the JSON API."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from accuracy.server.db import Job
from accuracy.server.deps import TOKEN_COOKIE, Services, presented_token, services
from accuracy.server.errors import ApiError
from accuracy.server.reportindex import RowQuery
from accuracy.server.routers.reports import _tensor
from accuracy.server.schemas import run_rank

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).resolve().parent.parent / "templates")
templates.env.filters["num"] = lambda v: (f"{v:.6g}" if isinstance(v, float) else
                                          ("" if v is None else str(v)))
templates.env.globals["run_rank"] = run_rank  # the rank column of the runs list
templates.env.filters["tojson_safe"] = lambda v: json.dumps(v).replace("</", "<\\/")


def _authorized(request: Request, svc: Services) -> bool:
    if not svc.protect_reads or svc.token is None:
        return True
    given = request.query_params.get("token") or presented_token(request)
    return bool(given) and hmac.compare_digest(given.encode(), svc.token.encode())


def _login(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"title": "token needed"},
                                      status_code=401)


def _page(request: Request, svc: Services, name: str, ctx: dict[str, Any]) -> Response:
    if not _authorized(request, svc):
        return _login(request)
    resp = templates.TemplateResponse(request, name, ctx)
    given = request.query_params.get("token")
    if given and svc.token and hmac.compare_digest(given.encode(), svc.token.encode()):
        resp.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
    return resp


@router.get("/", response_class=HTMLResponse)
def home(request: Request, svc: Services = Depends(services)) -> Response:
    """Runs, reports and jobs."""
    if not _authorized(request, svc):  # before any lookup: nothing is read for a stranger
        return _login(request)
    with svc.storage.Session() as ses:
        jobs = list(ses.scalars(select(Job).order_by(Job.created.desc()).limit(50)))
    return _page(request, svc, "runs.html", {
        "title": "runs", "runs": svc.storage.runs(), "reports": svc.storage.reports(),
        "jobs": jobs, "auth": svc.token is not None,
    })


@router.get("/ui/runs")
def runs_redirect() -> RedirectResponse:
    return RedirectResponse("/", status_code=307)


@router.get("/ui/reports/{report_id}", response_class=HTMLResponse)
def report_page(request: Request, report_id: str, svc: Services = Depends(services)
                ) -> Response:
    """Divergence chart, culprit card and the first page of the table."""
    if not _authorized(request, svc):  # before the lookup: a stranger learns no report ids
        return _login(request)
    try:
        rep = svc.storage.report(report_id)
    except ApiError:
        return templates.TemplateResponse(request, "error.html", {
            "title": "not found", "message": "no such report"}, status_code=404)
    summary = json.loads(rep.summary)
    q = RowQuery()
    first = svc.rows.page(report_id, q, 0, 50)
    return _page(request, svc, "report.html", {
        "title": rep.name, "report": rep, "summary": summary, "rows": first,
        "total": rep.n_rows, "culprit": summary.get("culprit"),
        "counts": summary.get("counts") or {},
        "first_divergence": summary.get("first_divergence"),
        "suspects": (summary.get("suspects") or [])[:10],
    })


@router.get("/ui/reports/{report_id}/rows/{idx}", response_class=HTMLResponse)
def op_page(request: Request, report_id: str, idx: int, svc: Services = Depends(services)
            ) -> Response:
    """One op: metrics, both tensors' statistics, overlaid histograms and the error heat map."""
    if not _authorized(request, svc):
        return _login(request)
    try:
        rep = svc.storage.report(report_id)
        row = svc.rows.row(report_id, idx)
    except ApiError:
        return templates.TemplateResponse(request, "error.html", {
            "title": "not found", "message": "no such report row"}, status_code=404)
    my = _tensor(svc.storage, rep.my_run_id, row.get("my_address"))
    golden = _tensor(svc.storage, rep.golden_run_id, row.get("golden_address"))
    replay = _tensor(svc.storage, rep.replay_run_id, row.get("my_address"))
    heat = bool(my and golden and my.has_data and golden.has_data
                and my.shape == golden.shape and len(my.shape) >= 2)
    return _page(request, svc, "op.html", {
        "title": f"{row.get('op')} #{idx}", "report": rep, "row": row, "idx": idx,
        "my": my, "golden": golden, "replay": replay, "heatmap": heat,
        "tensors": bool(my and golden and my.has_data and golden.has_data),
        "stat_keys": ["min", "max", "mean", "l2", "nan_count", "inf_count", "checksum"],
    })
