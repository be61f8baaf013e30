"""Report rows in the index: bulk insert, and filtered, sorted, paged queries.

Reports never change once indexed, so row counts per filter are cached.
"""

from __future__ import annotations

import json
import logging
import threading
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import and_, func, insert, or_, select
from sqlalchemy.sql.elements import ColumnElement

from accuracy.lru import BoundedLRU
from accuracy.patterns import strip_root
from accuracy.server.db import METRIC_COLUMNS, Report, ReportRow, ReportRowData
from accuracy.server.errors import ApiError, not_found
from accuracy.server.jsonsafe import as_float, jsonable
from accuracy.server.storage import Storage, new_id

log = logging.getLogger(__name__)

SORTABLE = ("idx", "op", "phase", "module", "verdict", "dtype_my", *METRIC_COLUMNS)
_BATCH = 5000
PAGE_CACHE_BYTES = 32 * 1024 * 1024
ORDER_CACHE_IDS = 8_000_000  # 64 MB of row orders


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
            ses.execute(insert(ReportRowData), [
                {"report_id": rid, "idx": b["idx"], "data": b.pop("data")} for b in batch])
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
        "module_tail": strip_root(str(r.get("module") or "")),
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
            conds.append(or_(_glob(ReportRow.module, self.module, prefix_dot=True),
                             _glob(ReportRow.module_tail, self.module, prefix_dot=True)))
        if self.q:
            like = f"%{_escape(self.q)}%"
            conds.append(or_(ReportRow.op.like(like, escape="\\"),
                             ReportRow.module.like(like, escape="\\")))
        return and_(*conds)


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _glob(col: Any, pattern: str, *, prefix_dot: bool) -> ColumnElement[bool]:
    """Shell-style glob as SQL LIKE; a plain name also matches what lies under it
    (`aten.mm` -> `aten.mm.default`, `encoder.layers.0` -> `encoder.layers.0.linear1`)."""
    if any(ch in pattern for ch in "*?["):
        like = _escape(pattern).replace("*", "%").replace("?", "_")
        return col.like(like, escape="\\")
    if prefix_dot:  # a range, not LIKE, so an index on the column serves it
        return or_(col == pattern, and_(col >= pattern + ".", col < pattern + "/"))
    return col == pattern


class RowIndex:
    """Queries over indexed report rows, with a cache of counts per filter."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._counts: BoundedLRU[tuple, int] = BoundedLRU(4096)
        self._pages: BoundedLRU[tuple, str] = BoundedLRU(max_cost=PAGE_CACHE_BYTES, cost=len)
        self._orders: BoundedLRU[tuple, array] = BoundedLRU(
            max_cost=ORDER_CACHE_IDS, cost=len, keep_oversized=True)
        self._series: BoundedLRU[tuple, dict[str, list]] = BoundedLRU(32)
        self._lock = threading.Lock()

    def cached_page(self, report_id: str, q: RowQuery, offset: int, limit: int) -> str | None:
        with self._lock:
            return self._pages.get((report_id, q, offset, limit))

    def page_json(self, report_id: str, q: RowQuery, offset: int, limit: int) -> str:
        """The rows endpoint's body; pages of an indexed report never change, so the most
        recent ones (up to PAGE_CACHE_BYTES) are answered from memory."""
        key = (report_id, q, offset, limit)
        with self._lock:
            body = self._pages.get(key)
            if body is not None:
                return body
        items = self.page_raw(report_id, q, offset, limit)
        total = self.count(report_id, q)
        body = (f'{{"total":{total},"offset":{offset},"limit":{limit},"items":['
                + ",".join(items) + "]}")
        with self._lock:
            if key not in self._pages:
                self._pages.put(key, body)
        return body

    def count(self, report_id: str, q: RowQuery) -> int:
        return self._count(report_id, q, (), q.where(report_id))

    def _count(self, report_id: str, q: RowQuery, extra: tuple,
               where: ColumnElement[bool]) -> int:
        key = (report_id, q.verdict, q.phase, q.op, q.module, q.q, *extra)
        with self._lock:
            hit = self._counts.get(key)
            if hit is not None:
                return hit
        with self.storage.engine.connect() as con:
            n = int(con.execute(select(func.count()).select_from(ReportRow)
                                .where(where)).scalar_one())
        with self._lock:
            self._counts.put(key, n)
        return n

    def forget(self, report_id: str) -> None:
        with self._lock:
            for cache in (self._counts, self._pages, self._orders):
                cache.discard_where(lambda k: k[0] == report_id)
            self._series.discard_where(lambda k: k[1] == report_id)

    def page(self, report_id: str, q: RowQuery, offset: int, limit: int
             ) -> list[dict[str, Any]]:
        """One page of rows as dicts (see page_ids for the order)."""
        return [json.loads(d) for d in self.page_raw(report_id, q, offset, limit)]

    def page_raw(self, report_id: str, q: RowQuery, offset: int, limit: int) -> list[str]:
        """One page of rows as their stored JSON text (the API passes it through unparsed)."""
        return self._raw(report_id, self.page_ids(report_id, q, offset, limit))

    def page_ids(self, report_id: str, q: RowQuery, offset: int, limit: int) -> list[int]:
        """The idx of one page of rows, sliced from the query's whole order (see order)."""
        return self.order(report_id, q)[offset:offset + limit].tolist()

    def order(self, report_id: str, q: RowQuery) -> array:
        """Every matching idx in display order, computed once per filter and sort.

        Reports never change once indexed, so keeping the order (4 bytes a row) makes any page,
        however deep, a slice plus a primary-key read. Sorting by a metric lists the rows that
        have it first (index order, ties by idx in the same direction), then the rest by idx.
        """
        if q.sort not in SORTABLE:
            raise ApiError(400, f"cannot sort by {q.sort!r}; choose one of {', '.join(SORTABLE)}")
        key = (report_id, q)
        with self._lock:
            ids = self._orders.get(key)
            if ids is not None:
                return ids
        col = getattr(ReportRow, q.sort)
        desc = q.order == "desc"
        order = [col.desc(), ReportRow.idx.desc()] if desc else [col.asc(), ReportRow.idx.asc()]
        where = q.where(report_id)
        if q.sort not in METRIC_COLUMNS:
            ids = self._ids(where, order)
        else:
            ids = self._ids(and_(where, col.is_not(None)), order)
            ids.extend(self._ids(and_(where, col.is_(None)), [ReportRow.idx]))
        with self._lock:
            if key not in self._orders:
                self._orders.put(key, ids)
        return ids

    def _ids(self, where: ColumnElement[bool], order: list) -> array:
        stmt = select(ReportRow.idx).where(where).order_by(*order)
        with self.storage.engine.connect() as con:
            return array("q", con.execute(stmt).scalars())

    def _raw(self, report_id: str, ids: list[int]) -> list[str]:
        if not ids:
            return []
        stmt = select(ReportRowData.idx, ReportRowData.data).where(
            ReportRowData.report_id == report_id, ReportRowData.idx.in_(ids))
        with self.storage.engine.connect() as con:
            found = dict(con.execute(stmt).all())
        return [found[i] for i in ids if i in found]

    def row(self, report_id: str, idx: int) -> dict[str, Any]:
        # an idx beyond SQLite's 64-bit INTEGER cannot be stored, and binding it would raise
        rows = self._raw(report_id, [idx]) if -2**63 <= idx < 2**63 else []
        if not rows:
            raise not_found(f"row {idx} of report {report_id!r}")
        return json.loads(rows[0])

    def series(self, report_id: str, metric: str, max_points: int) -> dict[str, list]:
        """Metric per row along execution order; buckets keep each bucket's worst row.
        Cached: every visit of a report page asks for the same chart."""
        key = ("series", report_id, metric, max_points)
        with self._lock:
            hit = self._series.get(key)
            if hit is not None:
                return hit
        out = self._series_uncached(report_id, metric, max_points)
        with self._lock:
            self._series.put(key, out)
        return out

    def _series_uncached(self, report_id: str, metric: str, max_points: int
                         ) -> dict[str, list]:
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
