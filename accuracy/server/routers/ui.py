"""The web UI: server-rendered pages (Jinja2); charts and table paging call the JSON API."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from starlette.concurrency import run_in_threadpool

from accuracy.server.db import Report, Run
from accuracy.server.deps import TOKEN_COOKIE, Services, presented_token, services
from accuracy.server.errors import ApiError
from accuracy.server.reportindex import RowQuery
from accuracy.server.routers.reports import _tensor
from accuracy.server.schemas import run_rank
from accuracy.server.uichart import chart_series

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).resolve().parent.parent / "templates")
templates.env.filters["num"] = lambda v: (f"{v:.6g}" if isinstance(v, float) else
                                          ("" if v is None else str(v)))
templates.env.globals["run_rank"] = run_rank  # the rank column of the runs list
# cosine near 1 needs 8 digits to show how far from 1 it is (6 print 0.9999999 as "1")
templates.env.filters["cosine"] = lambda v: f"{v:.8g}" if isinstance(v, float) else (v or "")
templates.env.filters["num3"] = lambda v: f"{v:.3g}" if isinstance(v, float | int) else ""
# op and module names break after their dots first (aten.mm.<wbr>default), so the ops table
# fits the window (app.css: td.name)
templates.env.filters["dotbreak"] = lambda v: Markup(".<wbr>").join(
    escape(part) for part in str(v or "").split("."))
templates.env.filters["shortsrc"] = lambda v: Path(str(v)).name if v else ""  # file.py:line


def bound_note(row: dict[str, Any]) -> str:
    """What a local error ratio is measured against: the honest kernel's bound at the op's
    compute precision (a pass at ratio 2075 is under a bound of 2733 for fp16, K=64)."""
    ratio, bound = row.get("local_error_ratio"), row.get("local_bound")
    if not isinstance(bound, float | int):
        return ""
    at = f" at {row['compute_precision']}" if row.get("compute_precision") else ""
    k = f", K={row['reduction_length']}" if row.get("reduction_length") else ""
    r = f"{ratio:.4g}" if isinstance(ratio, float | int) else "?"
    return f"local error ratio {r}; an honest kernel reaches {bound:.4g}{at}{k}"


templates.env.filters["boundnote"] = bound_note
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
    jobs = svc.storage.jobs(limit=50)
    runs = svc.storage.runs()
    my, golden = compare_defaults(runs)
    briefs = report_briefs(svc.storage.reports(), runs)
    return _page(request, svc, "runs.html", {
        "title": "runs", "runs": runs, "reports": briefs,
        "last_report": last_report_of_runs(briefs),
        "jobs": jobs, "auth": svc.token is not None,
        "default_my": my, "default_golden": golden,
    })


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def report_briefs(reports: list[Report], runs: list[Run]) -> list[dict[str, Any]]:
    """What the reports list shows of each report (newest first): its verdict, its culprit and
    the two runs it compared, named as the runs list names them (or by the dump files the
    report names when those runs are not indexed here). A summary is the report's own file:
    only strings and ints are taken from it."""
    names = {r.id: r.name for r in runs}
    briefs = []
    for rep in reports:
        try:
            summary = json.loads(rep.summary or "{}")
        except ValueError:
            summary = {}
        summary = summary if isinstance(summary, dict) else {}
        culprit = summary.get("culprit") if isinstance(summary.get("culprit"), dict) else {}
        index = culprit.get("index")

        briefs.append({
            "id": rep.id, "name": rep.name, "n_rows": rep.n_rows, "created": rep.created,
            "verdict": _text(summary.get("verdict")) or "unknown",
            "recorded_only": bool(summary.get("blind")),
            "culprit": ({"op": _text(culprit.get("op")) or "?",
                         "module": _text(culprit.get("module")) or "",
                         "index": index if isinstance(index, int) else None}
                        if culprit else None),
            "my": _side(names, rep.my_run_id, summary.get("my")),
            "golden": _side(names, rep.golden_run_id, summary.get("golden")),
            "run_ids": (rep.my_run_id, rep.golden_run_id),
        })
    return briefs


def _side(names: dict[str, str], run_id: str | None, path: Any) -> str:
    """A compared run by its name in the runs list, else by the dump file the report names."""
    path = _text(path)
    return names.get(run_id or "") or (Path(path).name if path else "?")


def last_report_of_runs(briefs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """run id -> the newest report that compared it (on either side): the runs list shows
    its verdict and culprit."""
    last: dict[str, dict[str, Any]] = {}
    for brief in briefs:  # newest first
        for run_id in brief["run_ids"]:
            if run_id:
                last.setdefault(run_id, brief)
    return last


def is_reference(run: Run) -> bool:
    """A run recorded on the CPU without a `sim` profile: the golden side of a compare."""
    return (run.backend or "").lower() in ("", "cpu") and not run.profile


def compare_defaults(runs: list[Run]) -> tuple[str | None, str | None]:
    """The compare form's preselected (device, golden) run ids, from each run's recorded
    backend and profile: a device run (sim, cuda, npu...) on the device side and a CPU run on
    the golden side, whatever order they were uploaded in; the newest of each kind."""
    if len(runs) < 2:
        return None, None
    devices = [r for r in runs if not is_reference(r)]
    references = [r for r in runs if is_reference(r)]
    my = (devices or runs)[0]
    golden = next((r for r in references if r.id != my.id), None)
    if golden is None:
        golden = next(r for r in runs if r.id != my.id)
    return my.id, golden.id


@router.get("/docs", response_class=HTMLResponse)
def api_docs(request: Request) -> Response:
    """Swagger UI from the package's own copy (static/vendor/swagger-ui): no CDN, so the API
    docs render offline."""
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title=f"{request.app.title} - API docs",
        swagger_js_url="/static/vendor/swagger-ui/swagger-ui-bundle.js",
        swagger_css_url="/static/vendor/swagger-ui/swagger-ui.css",
        swagger_favicon_url="/static/vendor/swagger-ui/favicon-32x32.png")


@router.get("/ui/reports/{report_id}/chart")
async def report_chart(request: Request, report_id: str,
                       max_points: int = Query(8000, ge=10, le=200_000),
                       svc: Services = Depends(services)) -> Response:
    """The offline report's chart data: log relative Euclidean distance of each op output
    along execution order, with the culprit (see uichart.py)."""
    if not _authorized(request, svc):
        return JSONResponse({"error": "token needed"}, status_code=401)
    try:
        body = await run_in_threadpool(chart_series, svc.storage, report_id, max_points)
    except ApiError:
        return JSONResponse({"error": "no such report"}, status_code=404)
    return JSONResponse(body)


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
