"""The Report: rows plus a summary naming the first divergence, the culprit and the suspects."""

from __future__ import annotations

import functools
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from accuracy.compare.checks import LOSS_SCALES_DIFFER, OWN_RANDOM
from accuracy.compare.compiled_align import FUSED_AWAY
from accuracy.compare.draws import DRAWS_DIFFER, draws_line, ops_drawn
from accuracy.compare.judge import KERNEL_PREFIX, amplification_is_evidence
from accuracy.compare.row import JUDGED, Row
from accuracy.compare.row import Verdict as V
from accuracy.compare.terminal import NOT_COMPARED, NOT_REPLAYED, format_summary
from accuracy.compare.writers import DEFAULT_FORMATS, WRITERS
from accuracy.compare.writers import FORMATS as ALL_FORMATS
from accuracy.errors import InputNotFoundError, OutputExistsError, UsageError
from accuracy.outputs import folder_could_be_written, writable_folder

FORMATS = DEFAULT_FORMATS  # the compare command's default --formats (xlsx only when asked)


def _score(row: Row) -> float | None:
    """How much an op output exceeds what an honest kernel given its inputs explains: the
    local excess (replay) or else the amplification."""
    for v in (row.local_excess, row.amplification):
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            return float(v)
    return None


def _compact(row: Row | None) -> dict[str, Any] | None:
    return row.as_dict() if row is not None else None


_JUDGED = JUDGED


def analyse(rows: list[Row], cfg: dict[str, Any], meta: dict[str, Any]
            ) -> dict[str, Any]:
    """Counts, first divergence, culprit and ranked suspects from judged rows (judge.py).

    The culprit is the op output judged an error (its own kernel is wrong) that stands out
    most; the first divergence is the earliest op output whose accumulated error against
    golden is an error (where the loss starts to see it), whoever caused it.
    """
    meta = dict(meta)
    drawn: list[Row] = meta.pop("random_draws", None) or []  # judge.judge's random ops
    first_div = culprit = None
    candidates = []
    drawn_at = {id(r) for r in drawn}
    for r in rows:
        if r.kind != "op" or r.io != "output" or (r.verdict not in _JUDGED
                                                   and id(r) not in drawn_at):
            continue
        if first_div is None and r.accumulated_verdict == V.ERROR:
            first_div = r
        if id(r) in drawn_at:
            continue
        score = _score(r)
        if score is None:
            continue
        if r.verdict != V.PASS or score > 1.0:
            candidates.append((score, r))
    severity = {V.ERROR: 0, V.WARNING: 1}
    # Within a verdict, an amplification that honest kernels of the op reach (a division of
    # noise by noise: Adam's update) ranks after the rest whatever its size (130x over a
    # faulty GEMM's 8.6x put the GEMM below a dozen optimizer rows).
    candidates.sort(key=lambda c: (severity.get(c[1].verdict, 2),
                                   c[1].local_excess is None
                                   and not amplification_is_evidence(c[1].op),
                                   -_sort_num(c[0]), c[1].index))
    if candidates and candidates[0][1].verdict == V.ERROR:
        culprit = candidates[0][1]
    n = int(cfg.get("suspects", {}).get("count", 10))
    suspects = [{**_compact(o), "score": s} for s, o in candidates[:n]]  # type: ignore[dict-item]
    counts = Counter(r.verdict for r in rows)
    own = Counter(r.verdict for r in rows if r.kind == "op" and not r.produced_by)
    replayed = any(r.local_excess is not None for r in rows)
    stats_only = bool(rows) and not any(r.rel_euc_dist is not None for r in rows)
    summary: dict[str, Any] = {
        "counts": {v: counts.get(v, 0) for v in V},
        # of the unmatched rows, eager values a compiled run fused into its kernels by design
        "fused_away": sum(1 for r in rows if r.verdict == V.UNMATCHED
                          and r.message == FUSED_AWAY),
        "judged_counts": {v: own.get(v, 0) for v in V},
        "rows": len(rows),
        "verdict": (V.ERROR if counts.get(V.ERROR) else V.WARNING if counts.get(V.WARNING)
                    else V.PASS),
        "culprit": _compact(culprit),
        "first_divergence": _compact(first_div),
        "suspects": suspects,
        "ranking": "local error (replay)" if replayed else (
            "amplification of statistics" if stats_only else "amplification"),
        **meta,
    }
    notes = list(meta.get("notes") or [])
    if not replayed and candidates:
        notes.append("no replay: suspects are ranked by amplification (output deviation beyond "
                     "what the inputs' deviation and the op's rounding explain); replay the "
                     "device dump (`accuracy replay`) and compare with -r to confirm which "
                     "kernel is wrong")
    summary["notes"] = notes
    judged = sum(1 for r in rows if r.verdict in (V.PASS, V.WARNING, V.ERROR))
    mine, paired = coverage(rows)
    summary["coverage"] = {"my_tensors": mine, "compared": paired}
    if not judged:
        summary["nothing_compared"] = True
        summary["warning"] = (f"nothing was compared ({meta.get('ops_my', 0)} ops in my dump, "
                              f"{meta.get('ops_golden', 0)} in golden): did the dumped block run "
                              "the step, or did filters exclude everything?")
    elif mostly_uncompared(summary):
        # said first with what was not seen: a verdict over 6 of 1391 tensors is no verdict
        summary["blind"] = [*(summary.get("blind") or []),
                            f"{NOT_COMPARED}: {mine - paired} of {mine} tensors of my run have no "
                            "golden counterpart (are these dumps of the same model and step?)"]
    lost = uncompared_phases(rows) if judged else {}
    if lost:
        summary["coverage"]["phases_uncompared"] = len(lost)
        summary["blind"] = [*(summary.get("blind") or []), *(
            f"{NOT_COMPARED}: {left} of {n} tensors of my run's {phase} phase have no "
            "golden counterpart (another implementation, e.g. a fused optimizer?)"
            for phase, (n, left) in sorted(lost.items()))]
    kernels, kernels_paired = coverage(rows, kernels=True)
    if kernels and kernels_paired < 0.5 * kernels:
        # the compiled code itself was not compared, whatever the eager rows around it say
        summary["coverage"].update(kernel_outputs=kernels, kernels_compared=kernels_paired)
        summary["blind"] = [*(summary.get("blind") or []),
                            f"{NOT_COMPARED}: {kernels - kernels_paired} of {kernels} outputs of "
                            "compiled kernels have no eager counterpart (their module or source "
                            "line differs from the golden run's: docs/compile.md)"]
    _replay_coverage(summary, meta.get("kernel_replay"))
    draws = draws_line(drawn, rows, replayed)
    if draws:  # the values after them differ by the draws: said before any verdict
        summary["coverage"]["random_ops_differ"] = ops_drawn(drawn)
        key = "notes" if replayed else "blind"
        summary[key] = [*(summary.get(key) or []), draws]
    first = [m for m in meta.get("refusals") or []
             if "incomplete" in m or OWN_RANDOM in m or m.startswith(LOSS_SCALES_DIFFER)]
    if first:  # the reason for missing rows or figures comes before any count of them
        summary["warning"] = " ".join(first + [summary.get("warning", "")]).strip()
    return summary


def _replay_coverage(summary: dict[str, Any], kr: dict[str, Any] | None) -> None:
    """With a replay of a compiled run: how many kernel launches it judged, in `coverage`;
    a note naming those it left unjudged, and a BLIND line when they are half or more (their
    outputs get no local verdict: a PASS over them would be a PASS over code nobody re-ran)."""
    if not kr or not kr.get("kernels"):
        return
    n, judged = int(kr["kernels"]), int(kr.get("judged", 0))
    summary["coverage"].update(kernel_launches=n, kernels_replayed=judged)
    if judged >= n:
        return
    why = "; ".join(f"{k} x{v}" for k, v in (kr.get("reasons") or {}).items())
    line = f"{NOT_REPLAYED}: {n - judged} of {n} compiled kernels ({why})"
    if judged < 0.5 * n:
        summary["blind"] = [*(summary.get("blind") or []), line]
    else:
        summary["notes"] = [*summary.get("notes", []), line]


def _unpaired_by_design(r: Row) -> bool:
    """One side only, skipped on purpose: an intermediate of another optimizer
    implementation, whose states are paired instead (compare/optimizer_align.py)."""
    return r.verdict == V.SKIPPED and r.golden_address is None


def coverage(rows: list[Row], kernels: bool = False) -> tuple[int, int]:
    """(tensors of my run, those paired with a golden tensor); with `kernels`, the outputs
    of compiled kernels only. Golden tensors without a counterpart do not count against it:
    a compiled run fuses most eager values away."""
    mine = paired = 0
    for r in rows:
        if r.kind == "op" and r.my_address is not None and not _unpaired_by_design(r) and (
                not kernels or (r.io == "output" and (r.op or "").startswith(KERNEL_PREFIX))):
            mine += 1
            paired += r.golden_address is not None
    return mine, paired


def uncompared_phases(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """Phases of my run (forward, backward, optimizer) fewer than half of whose tensors
    paired with a golden tensor: (tensors, not paired). A fused optimizer against a plain one
    leaves the update unseen, however much of the rest was compared."""
    mine: dict[str, int] = {}
    paired: dict[str, int] = {}
    for r in rows:
        if r.kind == "op" and r.my_address is not None and r.phase and not _unpaired_by_design(r):
            mine[r.phase] = mine.get(r.phase, 0) + 1
            paired[r.phase] = paired.get(r.phase, 0) + (r.golden_address is not None)
    return {p: (n, n - paired[p]) for p, n in mine.items() if paired[p] < 0.5 * n}


def mostly_uncompared(summary: dict[str, Any]) -> bool:
    """Fewer than half of my run's tensors, or of its compiled kernels' outputs, had a
    golden counterpart, or a whole phase had none, or (with a replay) fewer than half of its
    kernel launches were judged by replay, or (without one) random draws differ: the verdict
    covers too little of the run to pass a pipeline."""
    c = summary.get("coverage") or {}
    mine, kernels = c.get("my_tensors", 0), c.get("kernel_outputs", 0)
    launches = c.get("kernel_launches", 0)
    return (bool(mine) and c.get("compared", 0) < 0.5 * mine) or (
        bool(kernels) and c.get("kernels_compared", 0) < 0.5 * kernels) or (
        bool(launches) and c.get("kernels_replayed", 0) < 0.5 * launches) or bool(
        c.get("phases_uncompared", 0)) or any(
        f"{DRAWS_DIFFER}:" in b for b in summary.get("blind") or [])


def _sort_num(x: float | None) -> float:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return -math.inf
    return float(x)


class Report:
    """Rows (one per compared tensor) and a summary; `write()` renders the report files."""

    def __init__(self, rows: list[Row] | list[dict[str, Any]], summary: dict[str, Any]
                 ) -> None:
        self.rows: list[Row] = [r if isinstance(r, Row) else Row.from_dict(r) for r in rows]
        self.summary = summary

    @property
    def culprit(self) -> dict[str, Any] | None:
        return self.summary.get("culprit")

    @property
    def suspects(self) -> list[dict[str, Any]]:
        return self.summary.get("suspects", [])

    def exit_code(self, fail_on: str | None) -> int:
        """Non-zero for CI when a row reaches `fail_on` ('error' or 'warning'), or when
        nothing, or less than half of my run, was compared (an empty dump or another model's
        dump must not pass a pipeline)."""
        c = self.summary["counts"]
        if fail_on and not (c.get(V.PASS) or c.get(V.WARNING) or c.get(V.ERROR)):
            return 1
        if fail_on and mostly_uncompared(self.summary):
            return 1
        if fail_on == "error" and c.get(V.ERROR):
            return 1
        if fail_on == "warning" and (c.get(V.ERROR) or c.get(V.WARNING)):
            return 1
        return 0

    def write(self, out_dir: str | os.PathLike[str], formats: tuple[str, ...] = ALL_FORMATS,
              *, overwrite: bool = True) -> dict[str, Path]:
        """Write the selected formats (default: all of them) into out_dir; returns
        {format: path}. With overwrite=False a folder already holding a report is refused
        (check_report_dir)."""
        out = check_report_dir(out_dir, overwrite)
        check_formats(formats)
        paths: dict[str, Path] = {}
        dicts = functools.cache(lambda: [r.as_dict() for r in self.rows])  # once for all
        for f in formats:
            p = WRITERS[f](self.rows, self.summary, out, dicts)
            if p is not None:
                paths[f] = p
        return paths

    def format(self, top: int = 5) -> str:
        """The summary as terminal text (what `accuracy compare` prints)."""
        return format_summary(self.summary, top)

    def __repr__(self) -> str:
        return f"Report(rows={len(self.rows)}, counts={self.summary['counts']})"


def check_formats(formats: tuple[str, ...]) -> None:
    """Refuse a report format we cannot write (UsageError naming the ones we can)."""
    bad = set(formats) - set(ALL_FORMATS)
    if bad:
        raise UsageError(f"unknown report formats {sorted(bad)}; choose from {ALL_FORMATS}")


def check_report_dir(out_dir: str | os.PathLike[str], overwrite: bool, *,
                     create: bool = True) -> Path:
    """`out_dir`, created (unless `create` is False: a check before the compare runs), if a
    report may be written there: never over a file, over an earlier report only with
    overwrite, and only where files can be written (else an OutputExistsError or
    OutputNotWritableError saying what to do)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"-o {out} is a file, not a report folder; name a folder "
                                "(--overwrite replaces a report there, never another file)")
    if (out / "summary.json").exists() and not overwrite:
        raise OutputExistsError(f"{out} already holds a report; pass --overwrite or choose "
                                "another -o folder")
    if not create:
        return folder_could_be_written(out, "-o")
    return writable_folder(out, "-o")


def load_report(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Summary and rows read back from a written report's JSON (for the web server)."""
    p = Path(out_dir) / "summary.json"
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise InputNotFoundError(f"{p}: no report here ({e.strerror})") from None
    except ValueError as e:
        raise UsageError(f"{p}: damaged report JSON: {e}") from None
    rows_path = Path(out_dir) / "rows.json"
    try:
        rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
    except ValueError as e:
        raise UsageError(f"{rows_path}: damaged report JSON: {e}") from None
    return {"summary": data, "rows": rows}
