"""Report rows in the index: bulk insert, and filtered, sorted, paged queries.

Reports never change once indexed, so row counts per filter are cached.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, insert, or_, select
from sqlalchemy.sql.elements import ColumnElement

from accuracy.server.db import METRIC_COLUMNS, Report, ReportRow
from accuracy.server.errors import ApiError, not_found
from accuracy.server.jsonsafe import as_float, jsonable
from accuracy.server.storage import Storage, new_id

log = logging.getLogger(__name__)

SORTABLE = ("idx", "op", "phase", "module", "verdict", "dtype_my", *METRIC_COLUMNS)
VERDICTS = ("pass", "warning", "error", "unmatched", "skipped")
_BATCH = 5000


def index_report(
    storage: Storage,
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    *,
    name: str,
    report_dir: str | None = None,
    my_run_id: str | None = None,
    golden_run_id: str | None = None,
    replay_run_id: str | None = None,
    report_id: str | None = None,
) -> Report:
    """Store a report's summary and rows; returns the new Report."""
    rid = report_id or new_id()
    rep = Report(id=rid, name=name, dir=report_dir, my_run_id=my_run_id,
                 golden_run_id=golden_run_id, replay_run_id=replay_run_id, n_rows=len(rows),
                 summary=json.dumps(jsonable(_without_paths(summary))))
    with storage.Session.begin() as ses:
        ses.add(rep)
        ses.flush()
        for start in range(0, len(rows), _BATCH):
            batch = [_row_values(rid, i, r) for i, r in enumerate(rows[start:start + _BATCH],
                                                                  start)]
            ses.execute(insert(ReportRow), batch)
    log.info("indexed report %s (%s, %d rows)", rid, name, len(rows))
    return rep


def _without_paths(summary: dict[str, Any]) -> dict[str, Any]:
    """The compare summary names the dump files; clients see their base names only."""
    out = dict(summary)
    for k in ("my", "golden", "replay", "out_dir"):
        if isinstance(out.get(k), str):
            out[k] = Path(out[k]).name
    return out


def _row_values(rid: str, pos: int, r: dict[str, Any]) -> dict[str, Any]:
    idx = r.get("index", pos)
    try:
        idx = int(idx)
    except (TypeError, ValueError):
        idx = pos
    out = {
        "report_id": rid, "idx": idx, "op": str(r.get("op") or ""),
        "phase": str(r.get("phase") or ""), "module": str(r.get("module") or ""),
        "verdict": str(r.get("verdict") or ""), "dtype_my": str(r.get("dtype_my") or ""),
        "data": json.dumps(jsonable(r)),
    }
    for c in METRIC_COLUMNS:
        out[c] = as_float(r.get(c))
    return out


@dataclass(frozen=True)
class RowQuery:
    """Filters and order for a report's rows (all optional)."""

    verdict: tuple[str, ...] = ()
    phase: str | None = None
    op: str | None = None
    module: str | None = None
    q: str | None = None
    sort: str = "idx"
    order: str = "asc"

    def where(self, report_id: str) -> ColumnElement[bool]:
        conds: list[ColumnElement[bool]] = [ReportRow.report_id == report_id]
        if self.verdict:
            conds.append(ReportRow.verdict.in_(self.verdict))
        if self.phase:
            conds.append(ReportRow.phase == self.phase)
        if self.op:
            conds.append(_glob(ReportRow.op, self.op, prefix_dot=True))
        if self.module:
            conds.append(_glob(ReportRow.module, self.module, prefix_dot=False))
        if self.q:
            like = f"%{_escape(self.q)}%"
            conds.append(or_(ReportRow.op.like(like, escape="\\"),
                             ReportRow.module.like(like, escape="\\")))
        return and_(*conds)


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _glob(col: Any, pattern: str, *, prefix_dot: bool) -> ColumnElement[bool]:
    """Shell-style glob as SQL LIKE; a plain name also matches its overloads / submodules."""
    like = _escape(pattern).replace("*", "%").replace("?", "_")
    if any(ch in pattern for ch in "*?"):
        if not prefix_dot:
            return or_(col.like(like, escape="\\"), col.like(f"%.{like}", escape="\\"))
        return col.like(like, escape="\\")
    if prefix_dot:
        return or_(col == pattern, col.like(f"{like}.%", escape="\\"))
    return or_(col == pattern, col.like(f"{like}.%", escape="\\"),
               col.like(f"%.{like}", escape="\\"), col.like(f"%.{like}.%", escape="\\"))


class RowIndex:
    """Queries over indexed report rows, with a cache of counts per filter."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._counts: OrderedDict[tuple, int] = OrderedDict()
        self._lock = threading.Lock()

    def count(self, report_id: str, q: RowQuery) -> int:
        key = (report_id, q.verdict, q.phase, q.op, q.module, q.q)
        with self._lock:
            if key in self._counts:
                self._counts.move_to_end(key)
                return self._counts[key]
        with self.storage.engine.connect() as con:
            n = int(con.execute(select(func.count()).select_from(ReportRow)
                                .where(q.where(report_id))).scalar_one())
        with self._lock:
            self._counts[key] = n
            while len(self._counts) > 4096:
                self._counts.popitem(last=False)
        return n

    def forget(self, report_id: str) -> None:
        with self._lock:
            for k in [k for k in self._counts if k[0] == report_id]:
                del self._counts[k]

    def page(self, report_id: str, q: RowQuery, offset: int, limit: int
             ) -> list[dict[str, Any]]:
        if q.sort not in SORTABLE:
            raise ApiError(400, f"cannot sort by {q.sort!r}; choose one of {', '.join(SORTABLE)}")
        col = getattr(ReportRow, q.sort)
        key = col.desc() if q.order == "desc" else col.asc()
        stmt = select(ReportRow.data).where(q.where(report_id))
        if q.sort in METRIC_COLUMNS:  # rows without the metric go last either way
            stmt = stmt.order_by(col.is_(None), key, ReportRow.idx)
        else:
            stmt = stmt.order_by(key, ReportRow.idx)
        stmt = stmt.offset(offset).limit(limit)
        with self.storage.engine.connect() as con:
            return [json.loads(d) for d in con.execute(stmt).scalars()]

    def row(self, report_id: str, idx: int) -> dict[str, Any]:
        with self.storage.engine.connect() as con:
            data = con.execute(select(ReportRow.data).where(
                ReportRow.report_id == report_id, ReportRow.idx == idx)).scalar_one_or_none()
        if data is None:
            raise not_found(f"row {idx} of report {report_id!r}")
        return json.loads(data)

    def series(self, report_id: str, metric: str, max_points: int) -> dict[str, list]:
        """Metric per row along execution order; buckets keep each bucket's worst row."""
        if metric not in METRIC_COLUMNS:
            raise ApiError(400, f"unknown metric {metric!r}; choose one of "
                                f"{', '.join(METRIC_COLUMNS)}")
        col = getattr(ReportRow, metric)
        stmt = (select(ReportRow.idx, col, ReportRow.verdict, ReportRow.phase, ReportRow.op)
                .where(ReportRow.report_id == report_id).order_by(ReportRow.idx))
        with self.storage.engine.connect() as con:
            rows = con.execute(stmt).all()
        lower_is_worse = metric == "cosine"
        step = max(1, -(-len(rows) // max(1, max_points)))
        out: dict[str, list] = {"idx": [], "value": [], "verdict": [], "phase": [], "op": []}
        rank = {"error": 3, "warning": 2, "unmatched": 1}
        for start in range(0, len(rows), step):
            bucket = rows[start:start + step]
            if step == 1:
                pick = bucket[0]
            else:
                def badness(r: Any) -> tuple[int, float]:
                    v = r[1]
                    if v is None:
                        return (rank.get(r[2], 0), float("-inf"))
                    return (rank.get(r[2], 0), -v if lower_is_worse else v)
                pick = max(bucket, key=badness)
            for k, v in zip(("idx", "value", "verdict", "phase", "op"), pick, strict=True):
                out[k].append(v)
        out["bucket"] = [step]
        return out
