"""The Report: rows plus a summary naming the first divergence, the culprit and the suspects."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from accuracy.compare import verdict as V
from accuracy.compare.engine import eps_of

FORMATS = ("json", "csv", "html", "xlsx")


class Row(dict):
    """One compared tensor pair (a dict of stable keys, see docs/metrics.md)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


def _ops(rows: list[dict[str, Any]]) -> list[tuple[list[dict], list[dict]]]:
    """Op-level rows grouped per matched op, in execution order: (input rows, output rows)."""
    groups: dict[tuple, tuple[list[dict], list[dict]]] = {}
    for r in rows:
        if r["kind"] != "op" or r["seq_my"] is None or r["seq_golden"] is None:
            continue
        g = groups.setdefault((r["seq_my"], r["seq_golden"]), ([], []))
        g[0 if r["io"] == "input" else 1].append(r)
    return list(groups.values())


def _amplification(ins: list[dict], out: dict) -> float | None:
    red = out.get("rel_euc_dist")
    if red is None:
        return None
    floor = eps_of(out.get("dtype_my") or "float32")
    red_in = max([r["rel_euc_dist"] for r in ins if r.get("rel_euc_dist") is not None]
                 + [0.0])
    if math.isinf(red):
        return math.inf
    return red / max(red_in, floor)


def _compact(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return dict(row) if row is not None else None


def analyse(rows: list[dict[str, Any]], cfg: dict[str, Any], meta: dict[str, Any]
            ) -> dict[str, Any]:
    """Fill amplification; build counts, first divergence, culprit and ranked suspects."""
    first_div = culprit = None
    candidates = []
    for ins, outs in _ops(rows):
        in_bad = any(r["verdict"] == V.ERROR for r in ins)
        for o in outs:
            o["amplification"] = _amplification(ins, o)
            if o["verdict"] not in (V.WARNING, V.ERROR):
                continue
            local_bad = o.get("local_verdict") == V.ERROR
            if o["verdict"] == V.ERROR and first_div is None:
                first_div = o
            # The culprit's output is visibly wrong against golden (accumulated error), and
            # either its inputs were still fine or its own kernel is bad (local error). A
            # local-only error that stays within tolerance downstream is a suspect, not it.
            acc_bad = o.get("accumulated_verdict") == V.ERROR
            if culprit is None and acc_bad and (local_bad or not in_bad):
                culprit = o
            score = o["local_error_ratio"] if o.get("local_error_ratio") is not None \
                else o["amplification"]
            if score is not None:
                candidates.append((score, o))
    if culprit is None:
        culprit = first_div
    # errors before warnings, then by local error ratio (replay) or amplification
    candidates.sort(key=lambda c: (c[1]["verdict"] != V.ERROR, -_sort_num(c[0]),
                                   c[1]["index"]))
    n = int(cfg.get("suspects", {}).get("count", 10))
    suspects = [{**_compact(o), "score": s} for s, o in candidates[:n]]  # type: ignore[dict-item]
    counts = Counter(r["verdict"] for r in rows)
    summary: dict[str, Any] = {
        "counts": {v: counts.get(v, 0) for v in V.VERDICTS},
        "rows": len(rows),
        "verdict": (V.ERROR if counts.get(V.ERROR) else V.WARNING if counts.get(V.WARNING)
                    else V.PASS),
        "culprit": _compact(culprit),
        "first_divergence": _compact(first_div),
        "suspects": suspects,
        **meta,
    }
    matched = sum(1 for r in rows if r["verdict"] != V.UNMATCHED)
    judged = sum(1 for r in rows if r["verdict"] in (V.PASS, V.WARNING, V.ERROR))
    if not judged:
        summary["warning"] = (f"nothing was compared ({meta.get('ops_my', 0)} ops in my dump, "
                              f"{meta.get('ops_golden', 0)} in golden): did the dumped block run "
                              "the step, or did filters exclude everything?")
    elif rows and matched / len(rows) < 0.5:
        summary["warning"] = (f"only {matched} of {len(rows)} rows matched: are these dumps of "
                              "the same model and step?")
    return summary


def _sort_num(x: float | None) -> float:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return -math.inf
    return float(x)


class Report:
    """Rows (one per compared tensor) and a summary; `write()` renders the report files."""

    def __init__(self, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        self.rows = [r if isinstance(r, Row) else Row(r) for r in rows]
        self.summary = summary

    @property
    def culprit(self) -> dict[str, Any] | None:
        return self.summary.get("culprit")

    @property
    def suspects(self) -> list[dict[str, Any]]:
        return self.summary.get("suspects", [])

    def exit_code(self, fail_on: str | None) -> int:
        """Non-zero for CI when a row reaches `fail_on` ('error' or 'warning'), or when
        nothing at all was compared (an empty dump must not pass a pipeline)."""
        c = self.summary["counts"]
        if fail_on and not (c.get(V.PASS) or c.get(V.WARNING) or c.get(V.ERROR)):
            return 1
        if fail_on == "error" and c.get(V.ERROR):
            return 1
        if fail_on == "warning" and (c.get(V.ERROR) or c.get(V.WARNING)):
            return 1
        return 0

    def write(self, out_dir: str | os.PathLike[str], formats: tuple[str, ...] = FORMATS
              ) -> dict[str, Path]:
        """Write the selected formats into out_dir; returns {format: path}."""
        from accuracy.compare import writers

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        bad = set(formats) - set(FORMATS)
        if bad:
            raise ValueError(f"unknown report formats {sorted(bad)}; choose from {FORMATS}")
        paths: dict[str, Path] = {}
        for f in formats:
            p = getattr(writers, f"write_{f}")(self, out)
            if p is not None:
                paths[f] = p
        return paths

    def __repr__(self) -> str:
        return f"Report(rows={len(self.rows)}, counts={self.summary['counts']})"


def load_report(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Summary and rows read back from a written report's JSON (for the web server)."""
    p = Path(out_dir) / "summary.json"
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise FileNotFoundError(f"{p}: no report here ({e.strerror})") from None
    except ValueError as e:
        raise ValueError(f"{p}: damaged report JSON: {e}") from None
    rows_path = Path(out_dir) / "rows.json"
    try:
        rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
    except ValueError as e:
        raise ValueError(f"{rows_path}: damaged report JSON: {e}") from None
    return {"summary": data, "rows": rows}
