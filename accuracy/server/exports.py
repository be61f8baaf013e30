"""Report rows as CSV, JSON or XLSX, straight from the index (so filters apply to exports)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from accuracy.compare import csv_cell, xlsx_workbook
from accuracy.server.reportindex import RowIndex, RowQuery

_PAGE = 2000
XLSX_MAX_ROWS = 1_048_575
FIRST_COLUMNS = ("index", "op", "phase", "module", "verdict", "message", "my_address",
                 "golden_address", "dtype_my", "dtype_golden", "shape_my", "shape_golden")


def iter_rows(rows: RowIndex, report_id: str, q: RowQuery) -> Iterator[dict[str, Any]]:
    offset = 0
    while True:
        page = rows.page(report_id, q, offset, _PAGE)
        yield from page
        if len(page) < _PAGE:
            return
        offset += _PAGE


def columns(first: dict[str, Any] | None) -> list[str]:
    keys = list(first or {})
    return [c for c in FIRST_COLUMNS if c in keys] + [c for c in keys if c not in FIRST_COLUMNS]


def _cell(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def _csv_row(r: dict[str, Any]) -> dict[str, Any]:
    """One CSV row with the CLI report's escaping (formula-like text gets a leading quote)."""
    return {k: csv_cell(_cell(v)) for k, v in r.items()}


def csv_stream(rows: RowIndex, report_id: str, q: RowQuery) -> Iterator[str]:
    it = iter_rows(rows, report_id, q)
    first = next(it, None)
    cols = columns(first)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    if first is not None:
        w.writerow(_csv_row(first))
    for n, r in enumerate(it):
        w.writerow(_csv_row(r))
        if n % 500 == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def json_stream(rows: RowIndex, report_id: str, q: RowQuery, summary: dict[str, Any]
                ) -> Iterator[str]:
    yield '{"summary": ' + json.dumps(summary) + ', "rows": ['
    for n, r in enumerate(iter_rows(rows, report_id, q)):
        yield ("," if n else "") + json.dumps(r)
    yield "]}"


def xlsx_bytes(rows: RowIndex, report_id: str, q: RowQuery) -> bytes:
    out = io.BytesIO()
    wb = xlsx_workbook(out)  # the CLI report's options: every string is a text cell
    ws = wb.add_worksheet("rows")
    bold = wb.add_format({"bold": True})
    fills = {v: wb.add_format({"bg_color": c}) for v, c in
             (("error", "#f8d0d0"), ("warning", "#fbecc4"))}
    it = iter_rows(rows, report_id, q)
    first = next(it, None)
    cols = columns(first)
    ws.write_row(0, 0, cols, bold)
    ws.freeze_panes(1, 0)
    vcol = cols.index("verdict") if "verdict" in cols else None
    for n, r in enumerate([first, *it] if first is not None else []):
        if n >= XLSX_MAX_ROWS:
            break
        for c, k in enumerate(cols):
            v = r.get(k)
            ws.write(n + 1, c, _cell(v) if not isinstance(v, str) or k != "verdict" else v)
        if vcol is not None and r.get("verdict") in fills:
            ws.write(n + 1, vcol, r["verdict"], fills[r["verdict"]])
    wb.close()
    return out.getvalue()
