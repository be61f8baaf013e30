"""Reports: summary, rows (filter, sort, page), one row with both tensors, charts, export."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from accuracy.server import exports
from accuracy.server.boundedread import TensorSource, ViewLimits, heatmap_of, histogram_of
from accuracy.server.db import Report
from accuracy.server.deps import (
    get_rows,
    get_storage,
    get_view_limits,
    require_read,
    require_write,
)
from accuracy.server.errors import ApiError
from accuracy.server.reportindex import RowIndex, RowQuery, index_report
from accuracy.server.routers._common import tensor_at
from accuracy.server.schemas import (
    HeatmapOut,
    HistogramOut,
    Page,
    ReportDetail,
    ReportOut,
    ReportRegisterIn,
    RowDetail,
    SeriesOut,
    TensorOut,
)
from accuracy.server.storage import Storage, clean_label

router = APIRouter(prefix="/api/reports", tags=["reports"])


async def row_query(
    verdict: list[str] = Query([], description="pass, warning, error, unmatched; repeatable"),
    phase: str | None = Query(None, pattern="^(forward|backward|optimizer)$"),
    op: str | None = Query(None, max_length=200, description="op name or glob"),
    module: str | None = Query(None, max_length=400, description="module path or glob"),
    q: str | None = Query(None, max_length=200, description="text in op or module"),
    sort: str = Query("idx", description="idx, op, phase, module, verdict or a metric"),
    order: str = Query("asc", pattern="^(asc|desc)$"),
) -> RowQuery:
    verdicts = tuple(v for item in verdict for v in item.split(",") if v)
    return RowQuery(verdict=verdicts, phase=phase, op=op, module=module, q=q, sort=sort,
                    order=order)


@router.get("", response_model=list[ReportOut], dependencies=[Depends(require_read)])
def list_reports(storage: Storage = Depends(get_storage)) -> list[ReportOut]:
    return [ReportOut.of(r) for r in storage.reports()]


@router.post("/register", response_model=ReportDetail, status_code=201,
             dependencies=[Depends(require_write)])
def register_report(body: ReportRegisterIn, storage: Storage = Depends(get_storage),
                    rows: RowIndex = Depends(get_rows)) -> ReportDetail:
    """Index a report directory written by `accuracy compare -o DIR` (inside an allowed root)."""
    try:
        from accuracy.compare import load_report
    except ImportError:
        raise ApiError(503, "the compare engine (accuracy.compare) is not installed") from None
    d = storage.allowed_path(body.path, kind="dir")
    for rid in (body.my_run_id, body.golden_run_id):
        if rid:
            storage.run(rid)
    try:
        data = load_report(d)
    except (OSError, ValueError, KeyError) as e:
        raise ApiError(422, f"not a readable report directory ({type(e).__name__})") from None
    rep = index_report(storage, data.get("summary", {}), list(data.get("rows", [])),
                       name=clean_label(body.name, d.name), report_dir=str(d),
                       my_run_id=body.my_run_id, golden_run_id=body.golden_run_id,
                       rows_index=rows)
    return ReportDetail.of(rep)


@router.get("/{report_id}", response_model=ReportDetail, dependencies=[Depends(require_read)])
def get_report(report_id: str, storage: Storage = Depends(get_storage)) -> ReportDetail:
    return ReportDetail.of(storage.report(report_id))


@router.delete("/{report_id}", status_code=204, dependencies=[Depends(require_write)])
def delete_report(report_id: str, storage: Storage = Depends(get_storage),
                  rows: RowIndex = Depends(get_rows)) -> Response:
    storage.delete_report(report_id)
    rows.forget(report_id)
    return Response(status_code=204)


@router.get("/{report_id}/rows", response_model=Page[dict[str, Any]],
            dependencies=[Depends(require_read)])
async def list_rows(report_id: str, query: RowQuery = Depends(row_query),
              offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=1000),
              rows: RowIndex = Depends(get_rows)) -> Response:
    """Rows in the chosen order; filters and sorts run on the report's columns in memory
    (reportindex.ReportColumns), and the page's rows are read by primary key.

    Rows are stored as JSON and passed through as stored, without a parse and re-encode."""
    body = rows.cached_page(report_id, query, offset, limit)
    if body is None:  # may read the database (and 404s an unknown report): off the event loop
        body = await run_in_threadpool(rows.page_json, report_id, query, offset, limit)
    return Response(body, media_type="application/json")


def _tensor(storage: Storage, run_id: str | None, address: Any) -> TensorOut | None:
    if not run_id or not address:
        return None
    try:
        return TensorOut.of(tensor_at(storage.dump(run_id), str(address)))
    except ApiError:
        return None


@router.get("/{report_id}/rows/{idx}", response_model=RowDetail,
            dependencies=[Depends(require_read)])
def get_row(report_id: str, idx: int, storage: Storage = Depends(get_storage),
            rows: RowIndex = Depends(get_rows)) -> RowDetail:
    """One row with the device, golden (and replay) tensors' statistics side by side."""
    rep = storage.report(report_id)
    row = rows.row(report_id, idx)
    return RowDetail(
        row=row,
        my=_tensor(storage, rep.my_run_id, row.get("my_address")),
        golden=_tensor(storage, rep.golden_run_id, row.get("golden_address")),
        replay=_tensor(storage, rep.replay_run_id, row.get("my_address")),
    )


def _pair(storage: Storage, rep: Report, row: dict[str, Any], limits: ViewLimits
          ) -> tuple[TensorSource, TensorSource]:
    if not rep.my_run_id or not rep.golden_run_id:
        raise ApiError(409, "this report is not linked to its runs, so tensors are unavailable")
    if not row.get("my_address") or not row.get("golden_address"):
        raise ApiError(409, "this row has no matched pair of tensors")
    dm, dg = storage.dump(rep.my_run_id), storage.dump(rep.golden_run_id)
    return (TensorSource(dm, tensor_at(dm, str(row["my_address"])), limits),
            TensorSource(dg, tensor_at(dg, str(row["golden_address"])), limits))


@router.get("/{report_id}/rows/{idx}/histogram", response_model=HistogramOut,
            dependencies=[Depends(require_read)])
def row_histogram(report_id: str, idx: int, bins: int = Query(64, ge=1, le=1024),
                  storage: Storage = Depends(get_storage), rows: RowIndex = Depends(get_rows),
                  limits: ViewLimits = Depends(get_view_limits)) -> HistogramOut:
    """Both tensors over the same bin edges, to overlay them."""
    rep = storage.report(report_id)
    row = rows.row(report_id, idx)
    my, golden = _pair(storage, rep, row, limits)
    return HistogramOut(**histogram_of([my, golden], bins), labels=["my", "golden"])


@router.get("/{report_id}/rows/{idx}/heatmap", response_model=HeatmapOut,
            dependencies=[Depends(require_read)])
def row_heatmap(report_id: str, idx: int, max_cells: int = Query(64, ge=2, le=256),
                storage: Storage = Depends(get_storage), rows: RowIndex = Depends(get_rows),
                limits: ViewLimits = Depends(get_view_limits)) -> HeatmapOut:
    """|my - golden| on a grid, for tensors of 2 or more dimensions."""
    rep = storage.report(report_id)
    my, golden = _pair(storage, rep, rows.row(report_id, idx), limits)
    return HeatmapOut(**heatmap_of(my, golden, max_cells))


@router.get("/{report_id}/series", response_model=SeriesOut,
            dependencies=[Depends(require_read)])
def series(report_id: str, metric: str = "cosine",
           max_points: int = Query(5000, ge=10, le=200_000),
           storage: Storage = Depends(get_storage), rows: RowIndex = Depends(get_rows)
           ) -> SeriesOut:
    """The divergence chart's data: a metric per op along execution order."""
    storage.report(report_id)
    s = rows.series(report_id, metric, max_points)
    return SeriesOut(metric=metric, bucket=s["bucket"][0], idx=s["idx"], value=s["value"],
                     verdict=s["verdict"], phase=s["phase"], op=s["op"])


@router.get("/{report_id}/export", dependencies=[Depends(require_read)],
            responses={200: {"content": {"text/csv": {}, "application/json": {},
                                         "application/vnd.openxmlformats-officedocument"
                                         ".spreadsheetml.sheet": {}}}})
def export(report_id: str, format: str = Query("csv", pattern="^(csv|json|xlsx)$"),  # noqa: A002
           query: RowQuery = Depends(row_query), storage: Storage = Depends(get_storage),
           rows: RowIndex = Depends(get_rows)) -> Response:
    """The rows (filters apply) as a download."""
    rep = storage.report(report_id)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", rep.name)[:80] or "report"
    disp = {"Content-Disposition": f'attachment; filename="{stem}.{format}"'}
    rows.page(report_id, query, 0, 1)  # validate the sort key before streaming
    if format == "csv":
        return StreamingResponse(exports.csv_stream(rows, report_id, query),
                                 media_type="text/csv", headers=disp)
    if format == "json":
        return StreamingResponse(
            exports.json_stream(rows, report_id, query, json.loads(rep.summary)),
            media_type="application/json", headers=disp)
    return Response(exports.xlsx_bytes(rows, report_id, query), headers=disp,
                    media_type="application/vnd.openxmlformats-officedocument."
                               "spreadsheetml.sheet")
