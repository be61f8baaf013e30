"""Report files: summary.json + rows.json, rows.csv (msprobe column names), rows.xlsx."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accuracy.compare import html
from accuracy.compare.row import Row

log = logging.getLogger(__name__)

# Row key -> CSV header. msprobe's names where the meaning is the same, ours otherwise.
CSV_COLUMNS: dict[str, str] = {
    "rank": "Rank", "epoch": "Epoch",
    "index": "Index", "kind": "Kind", "my_address": "NPU Name", "golden_address": "Bench Name",
    "op": "Op", "phase": "Phase", "module": "Module", "io": "IO",
    "dtype_my": "NPU Dtype", "dtype_golden": "Bench Dtype",
    "shape_my": "NPU Tensor Shape", "shape_golden": "Bench Tensor Shape",
    "cosine": "Cosine", "euc_dist": "EucDist", "rel_euc_dist": "RelEucDist",
    "max_abs_err": "MaxAbsErr", "max_rel_err": "MaxRelativeErr",
    "mean_abs_err": "MeanAbsErr", "rmse": "RMSE", "acc_rel_err": "AccRelErr",
    "mean_rel_err": "MeanRelErr", "kl_div": "KLDiv",
    "one_thousandth_err_ratio": "One Thousandth Err Ratio",
    "five_thousandths_err_ratio": "Five Thousandths Err Ratio",
    "nan_mismatch": "NaN Mismatch", "inf_mismatch": "Inf Mismatch", "bit_exact": "Bit Exact",
    "my_max": "NPU max", "my_min": "NPU min", "my_mean": "NPU mean", "my_l2norm": "NPU l2norm",
    "golden_max": "Bench max", "golden_min": "Bench min", "golden_mean": "Bench mean",
    "golden_l2norm": "Bench l2norm", "max_diff": "Max diff", "min_diff": "Min diff",
    "mean_diff": "Mean diff", "l2norm_diff": "L2norm diff",
    "local_error_ratio": "Local Error Ratio", "amplification": "Amplification",
    "cancellation": "Cancellation",
    "accumulated_verdict": "Accumulated Result", "verdict": "Result",
    "message": "Err_message", "source": "Source",
    "accuracy_reached": "Accuracy Reached or Not", "stack": "NPU_Stack_Info",
    "quant": "Quantization",  # fp8/MX figures per GEMM operand (docs/fp8.md)
}


def with_msprobe_cells(r: dict[str, Any]) -> dict[str, Any]:
    """The row (as a dict) plus msprobe's derived columns: `Accuracy Reached or Not` (Yes
    unless the verdict is error; empty when not judged) and `NPU_Stack_Info` (the dumped
    stack when the row carries one, else the source line)."""
    reached = {"pass": "Yes", "warning": "Yes", "error": "No"}.get(r.get("verdict"), "")
    return {**r, "accuracy_reached": reached, "stack": r.get("stack") or r.get("source")}


def plain(v: Any) -> Any:
    """JSON-safe value: non-finite floats become the strings 'inf', '-inf', 'nan'."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return v


def _plain_row(d: dict[str, Any]) -> dict[str, Any]:
    """`plain` of a row, scalars checked inline (a row is ~70 of them, nearly all scalars)."""
    out = {}
    for k, v in d.items():
        t = type(v)
        if t is float:
            out[k] = v if v - v == 0.0 else plain(v)  # inf - inf and nan - nan are nan
        elif t is str or t is int or v is None:
            out[k] = v
        else:
            out[k] = plain(v)
    return out


# The rows as plain dicts, computed once per Report.write for every writer that wants them.
RowDicts = Callable[[], list[dict[str, Any]]]


def rows_json(dicts: list[dict[str, Any]]) -> str:
    """rows.json's text. Rows are encoded as they are unless a figure is not finite (json
    refuses it here): then every row goes through `plain`, which spells it 'nan' or 'inf'.
    Checking ~70 cells a row in Python first cost as much as encoding them."""
    try:
        return json.dumps(dicts, allow_nan=False, default=str)
    except ValueError:
        return json.dumps([_plain_row(d) for d in dicts], default=str)


def write_json(rows: list[Row], summary: dict[str, Any], out: Path, dicts: RowDicts) -> Path:
    p = out / "summary.json"
    p.write_text(json.dumps(plain(summary), indent=2, default=str))
    (out / "rows.json").write_text(rows_json(dicts()))
    return p


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, list):
        return json.dumps(v)
    return v


# A text cell starting with one of these is run as a formula by spreadsheet programs
# (OWASP "CSV injection"): op, module and source names come from dump files.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v: Any) -> Any:
    """A CSV cell: text that a spreadsheet would run as a formula gets a leading quote.

    Numbers are written as numbers (negative ones included); only text is prefixed. The
    server's CSV export writes its cells through this too (one escaping for every CSV).
    """
    v = _cell(v)
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        return "'" + v
    return v


_csv_cell = csv_cell  # the older private name
_NUMBERS = frozenset((int, float))

# Every string is a text cell: no formulas (a module named "=HYPERLINK(...)" stays text),
# no numbers or links guessed from text. Shared with the server's XLSX export.
XLSX_OPTIONS: dict[str, bool] = {"nan_inf_to_errors": True, "strings_to_formulas": False,
                                 "strings_to_numbers": False, "strings_to_urls": False}


def xlsx_workbook(target: Any) -> Any:
    """A safe xlsxwriter Workbook on a path or a binary stream (streams are built in memory)."""
    import xlsxwriter

    opts = dict(XLSX_OPTIONS, in_memory=not isinstance(target, str | Path))
    return xlsxwriter.Workbook(str(target) if isinstance(target, Path) else target, opts)


def _csv_cells(values: Any) -> list[Any]:
    """csv_cell of each value; numbers and empty cells, most of a row, skip the call."""
    return [v if type(v) in _NUMBERS else "" if v is None else csv_cell(v) for v in values]


def write_csv(rows: list[Row], summary: dict[str, Any], out: Path, dicts: RowDicts) -> Path:
    p = out / "rows.csv"
    extra = [k for k in (rows[0].keys() if rows else ()) if k not in CSV_COLUMNS]
    cols = list(CSV_COLUMNS) + extra
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([CSV_COLUMNS.get(k, k) for k in cols])
        w.writerows(_csv_cells(map(with_msprobe_cells(d).get, cols)) for d in dicts())
    return p


def write_xlsx(rows: list[Row], summary: dict[str, Any], out: Path, dicts: RowDicts
               ) -> Path | None:
    """rows.xlsx with rows coloured by verdict; skipped (with a log line) without xlsxwriter."""
    try:
        import xlsxwriter
    except ImportError:
        log.warning("rows.xlsx not written: install the 'excel' extra (xlsxwriter)")
        return None
    del xlsxwriter  # only probed for: xlsx_workbook opens it
    p = out / "rows.xlsx"
    wb = xlsx_workbook(p)
    try:
        fmts = {"error": wb.add_format({"bg_color": "#F8C9C4"}),
                "warning": wb.add_format({"bg_color": "#FCE9B2"}),
                "unmatched": wb.add_format({"bg_color": "#DDDDDD"})}
        bold = wb.add_format({"bold": True})
        ws = wb.add_worksheet("rows")
        cols = list(CSV_COLUMNS)
        ws.write_row(0, 0, [CSV_COLUMNS[k] for k in cols], bold)
        ws.freeze_panes(1, 0)
        for i, r in enumerate(map(with_msprobe_cells, dicts()), start=1):
            ws.write_row(i, 0, [_cell(r.get(k)) for k in cols], fmts.get(r["verdict"]))
        ws.autofilter(0, 0, len(rows), len(cols) - 1)
        s = wb.add_worksheet("summary")
        line = 0
        for k, v in summary.items():
            if isinstance(v, dict | list):
                v = json.dumps(plain(v), default=str)[:30000]
            s.write_row(line, 0, [k, _cell(v)])
            line += 1
    finally:
        wb.close()
    return p


def write_html(rows: list[Row], summary: dict[str, Any], out: Path, dicts: RowDicts) -> Path:
    del dicts  # the page reads the Row objects
    p = out / "index.html"
    p.write_text(html.render(rows, summary), encoding="utf-8")
    return p


def warm() -> None:
    """Import and compile what writing a report needs (Jinja2 and the HTML template, ~40 ms)
    ahead of time: compare calls it while its worker processes run and this one waits."""
    html.template()


# Report format -> its writer of a report's rows and summary (returns the file written, or
# None when it can't be written). The report module calls them: nothing here imports it.
WRITERS: dict[str, Callable[[list[Row], dict[str, Any], Path, RowDicts], Path | None]] = {
    "json": write_json, "csv": write_csv, "html": write_html, "xlsx": write_xlsx}
FORMATS = tuple(WRITERS)
# What `accuracy compare` writes unless --formats asks for more: rows.xlsx holds the CSV's
# columns and costs more than the whole compare of a large step (xlsxwriter, cell by cell).
DEFAULT_FORMATS = ("json", "csv", "html")
