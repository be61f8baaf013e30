"""The report page's default chart: the offline report's (compare/html.py), served as data.

Log relative Euclidean distance of each op output along execution order, the culprit marked.
That metric is not one of the index's narrow columns (db.METRIC_COLUMNS), so it is read once
per report from the stored rows and cached: reports never change once indexed.

A row judged "rounding noise, not judged" (every value below the dtype's zero floor, such as
layer norm's mean output on a normalised input, ~1e-8) has a meaningless relative distance
(1.4 for 5e-8 of noise); it is sent as not judged, so the page draws it apart (grey, at the
floor) instead of as a passing op far above the others.
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Any

from sqlalchemy import select

from accuracy.compare import NOT_JUDGED, Verdict, not_judged
from accuracy.lru import BoundedLRU
from accuracy.server.db import ReportRow, ReportRowData
from accuracy.server.storage import Storage

FLOOR, CEILING = 1e-12, 10.0  # compare/html.py draws log10 distance in [-12, 1]
_CACHE: BoundedLRU[tuple[int, str, int], dict[str, Any]] = BoundedLRU(16)
_LOCK = threading.Lock()


# What the chart needs from each stored row (json.dumps' default layout, written by
# reportindex): whether it is an op output, its distance and its message, found with
# str.find instead of parsing all ~70 keys (json.loads took ~150 us a row here, 15 s per
# 100,000 rows). A key inside a string value is escaped (\"kind\") and never matches; a row
# in another layout is parsed whole.
_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _value_at(data: str, key: str) -> tuple[int, str] | None:
    """(position, raw text) of a top-level key's value: the first occurrence of the key."""
    i = data.find(f'"{key}": ')
    if i < 0:
        return None
    j = i + len(key) + 4
    if data.startswith('"', j):
        m = _STR.match(data, j)
        return (j, m.group(0)) if m else None
    ends = [e for e in (data.find(",", j), data.find("}", j)) if e >= 0]
    return j, data[j:min(ends)] if ends else data[j:]


def _point(data: str) -> tuple[bool, float | None, str]:
    """(an op's output, its rel_euc_dist, its message) from a stored row's text."""
    kind, io = _value_at(data, "kind"), _value_at(data, "io")
    if kind is None or io is None:
        r = json.loads(data)
        return (r.get("kind") == "op" and r.get("io") == "output",
                _distance(r.get("rel_euc_dist")), str(r.get("message") or ""))
    if kind[1] != '"op"' or io[1] != '"output"':
        return False, None, ""
    red = _value_at(data, "rel_euc_dist")
    msg = _value_at(data, "message")
    return True, _distance(red[1]) if red else None, json.loads(msg[1]) if msg and \
        msg[1].startswith('"') else ""


def _distance(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def chart_series(storage: Storage, report_id: str, max_points: int) -> dict[str, Any]:
    """idx, rel_euc_dist, verdict ('not judged' where the compare did not judge), phase and op
    of each op output in execution order (bucketed to `max_points`, each bucket's worst kept),
    and the culprit row. Raises ApiError (404) for an unknown report."""
    rep = storage.report(report_id)
    key = (id(storage), report_id, max_points)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    points: list[tuple[int, float | None, str, str, str]] = []
    stmt = (select(ReportRow.idx, ReportRow.verdict, ReportRow.phase, ReportRow.op,
                   ReportRowData.data)
            .join(ReportRowData, (ReportRowData.report_id == ReportRow.report_id)
                  & (ReportRowData.idx == ReportRow.idx))
            .where(ReportRow.report_id == report_id).order_by(ReportRow.idx))
    with storage.engine.connect() as con:
        for idx, verdict, phase, op, data in con.execute(stmt):
            if verdict == "skipped":
                continue
            output, red, message = _point(data)
            if not output:
                continue
            points.append((int(idx), red, NOT_JUDGED if not_judged(message) else verdict,
                           phase or "", op or ""))
    step = max(1, -(-len(points) // max_points))
    if step > 1:
        points = [max(points[i:i + step], key=_badness) for i in range(0, len(points), step)]
    summary = json.loads(rep.summary or "{}")
    culprit = summary.get("culprit") if isinstance(summary, dict) else None
    out = {
        "metric": "rel_euc_dist", "floor": FLOOR, "ceiling": CEILING, "bucket": step,
        "idx": [p[0] for p in points], "value": [p[1] for p in points],
        "verdict": [p[2] for p in points], "phase": [p[3] for p in points],
        "op": [p[4] for p in points],
        "culprit": ({"index": culprit.get("index"), "op": culprit.get("op")}
                    if isinstance(culprit, dict) else None),
    }
    with _LOCK:
        _CACHE.put(key, out)
    return out


def _badness(p: tuple[int, float | None, str, str, str]) -> tuple[int, float]:
    rank = Verdict.rank_of(p[2]) if p[2] != NOT_JUDGED else -1
    return rank, p[1] if p[1] is not None else float("-inf")
