"""Compare every rank at once: one compare() per rank pair, and a merged summary on top.

Ranks pair by the rank recorded in each dump. Each pair is an ordinary single-pair compare
(its own report in `rank<N>/`); the merged summary lines the ranks up by collective epoch (on
one logical clock when they talk point to point: compare/p2p_clock.py) and says which rank
diverged first, each rank's culprit, and which ranks only inherited error
through a collective (those get no culprit: their own kernels did nothing wrong).
"""

from __future__ import annotations

import html
import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from accuracy.aten import is_collective
from accuracy.compare import verdict as V
from accuracy.compare.api import compare
from accuracy.compare.judge import own_evidence
from accuracy.compare.p2p_clock import logical_epochs
from accuracy.compare.report import ALL_FORMATS, Report, check_report_dir
from accuracy.compare.row import Row
from accuracy.compare.terminal import format_ranks
from accuracy.dumpfile import Dump, load_dump
from accuracy.errors import UsageError
from accuracy.ranks import RankFiles, find_rank_files

log = logging.getLogger(__name__)

CLEAN, CULPRIT, INHERITED, DIVERGED = "clean", "culprit", "inherited", "diverged"
_ROW_REF_KEYS = ("culprit", "first_divergence")


def check_pair_ranks(dm: Dump, dg: Dump) -> None:
    """Refuse a single-file compare of two different ranks of multi-rank runs (the numbers
    differ by design: each rank holds its own data shard)."""
    rm, rg = dm.attrs.get("rank", 0), dg.attrs.get("rank", 0)
    wm, wg = dm.attrs.get("world_size", 1), dg.attrs.get("world_size", 1)
    if rm != rg:
        raise UsageError(f"{dm.path} is rank {rm} (of {wm}) but {dg.path} is rank {rg} (of {wg}): "
                         "ranks hold different data. Compare the same rank, or every rank at "
                         "once with -m 'dev/run_{rank}.h5' -g 'gold/run_{rank}.h5' "
                         "(--any-rank compares them anyway)")


def _sides(my: str, golden: str, replay: str | None) -> tuple[RankFiles, RankFiles,
                                                             RankFiles | None]:
    fm, fg = find_rank_files(my), find_rank_files(golden)
    if fm.world_size != fg.world_size:
        raise UsageError(f"world sizes differ: {my} holds a run of {fm.world_size} ranks, "
                         f"{golden} one of {fg.world_size}; compare runs with the same "
                         "parallel layout")
    fr = find_rank_files(replay) if replay else None
    if fr is not None and fr.world_size != fm.world_size:
        raise UsageError(f"{replay} holds replays of a {fr.world_size}-rank run, {my} a "
                         f"{fm.world_size}-rank one")
    return fm, fg, fr


def _epoch(rows_by_seq: dict[int, int], row: dict[str, Any] | None) -> int | None:
    if row is None or row.get("seq_my") is None:
        return None
    e = rows_by_seq.get(row["seq_my"], -1)
    return None if e < 0 else e


def _at(row: dict[str, Any] | None) -> tuple[float, float]:
    if row is None:
        return (math.inf, math.inf)
    e = row.get("epoch")
    return (math.inf if e is None else e, row.get("seq_my") or 0)


def _order(entry: dict[str, Any]) -> tuple[float, float]:
    """Where a rank starts to diverge, by (collective epoch, seq): its first divergence, or
    its culprit when that comes first (a kernel fault whose error is still below the error
    threshold where it is made is where the divergence starts, not where it grows into one)."""
    return min(_at(entry.get("first_divergence")), _at(entry.get("culprit")))


def _first_deviation(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first op output judged warning or error (divergence, even below error level)."""
    return next((r for r in rows if r["kind"] == "op" and r["io"] == "output"
                 and (r.get("accumulated_verdict") or r["verdict"]) in (V.WARNING, V.ERROR)),
                None)


def _collective_before(rows: list[dict[str, Any]], seq: int | None) -> dict[str, Any] | None:
    """The last collective this rank ran at or before `seq` (the way error came in)."""
    if seq is None:
        return None
    found = None
    for r in rows:
        if r["kind"] == "op" and r.get("seq_my") is not None and r["seq_my"] <= seq \
                and is_collective(r.get("op") or ""):
            found = r
    return found


def _inherited(entry: dict[str, Any], row: dict[str, Any], origin: dict[str, Any]
               ) -> dict[str, Any]:
    via = row if is_collective(row.get("op") or "") else _collective_before(
        entry["_rows"], row.get("seq_my"))
    return {"via": via["op"] if via else "a collective (not recorded)",
            "epoch": via.get("epoch") if via else None, "seq": via.get("seq_my") if via else None,
            "from_rank": origin["rank"]}


def _epoch_of(row: dict[str, Any]) -> float:
    return row.get("epoch") if row.get("epoch") is not None else math.inf


def _deviating_collective(rows: list[dict[str, Any]], epoch: float) -> dict[str, Any] | None:
    """The first recorded collective at or after collective `epoch` whose output deviates
    from golden (warning or error): where another rank's error came into this one."""
    for r in rows:
        if r["kind"] == "op" and r["io"] == "output" and is_collective(r.get("op") or "") \
                and _epoch_of(r) >= epoch \
                and (r.get("accumulated_verdict") or r["verdict"]) in (V.WARNING, V.ERROR):
            return r
    return None


def _own_noise(entry: dict[str, Any]) -> bool:
    """No tensor of this rank was judged warning or worse on evidence of its own work
    (judge.own_evidence): its accumulated error, if any, is what its precision explains (a
    gradient that is zero in exact arithmetic holds rounding noise on both sides, and Adam's
    update divides it by its own root mean square), or what a receive brought in, not a
    divergence of its own. A rank whose random ops drew other numbers diverged by its draws,
    however its tensors were judged (draws.py)."""
    if entry["culprit"] is not None or entry.get("random_ops_differ"):
        return False
    if entry["verdict"] == V.PASS:
        return True
    flagged = [r for r in entry["_rows"] if r["verdict"] in (V.WARNING, V.ERROR)]
    return bool(flagged) and not any(own_evidence(r) for r in flagged)


def _diverged(entry: dict[str, Any]) -> bool:
    """A rank that may be where divergence starts: a culprit, or an accumulated error beside
    a tensor judged warning or worse."""
    return entry["culprit"] is not None or (entry["first_divergence"] is not None
                                            and not _own_noise(entry))


def _brought_in(entry: dict[str, Any]) -> bool:
    """Whether a rank's divergence starts at a collective or a receive whose own check found
    nothing wrong (none without a replay), with no deviation of its own work before it: what
    it brought in, not what the rank made. (A rank whose own matmul deviated under the error
    threshold just before the all-reduce where the error shows made it; seq numbers of two
    ranks are not comparable, so this, not their order, tells the two apart.)"""
    first = min((x for x in (entry["culprit"], entry["first_divergence"]) if x), key=_at,
                default=None)
    if first is None or not is_collective(first.get("op") or "") \
            or first.get("local_verdict") == V.ERROR:
        return False
    at = first.get("seq_my")
    return at is None or not any(own_evidence(r) for r in entry["_rows"]
                                 if r.seq_my is not None and r.seq_my < at)


def _start(entry: dict[str, Any]) -> tuple[tuple[float, float], tuple[float, float]]:
    """Where a rank starts to diverge (`_order`), ties broken by its first deviation: two
    ranks meeting an error at the same collective are told apart by which one brought a
    deviation to it (seq numbers of different ranks are not otherwise comparable)."""
    return _order(entry), _at(entry.get("first_deviation"))


def _label(entry: dict[str, Any], origin: dict[str, Any] | None, has_replay: bool) -> None:
    """Decide whether this rank's culprit is its own, or error inherited via a collective.

    A rank with no culprit inherited when a collective at or after the origin's epoch brought
    a deviation in (or its accumulated error starts after the origin's, and the last
    collective before it, if recorded, is not older than the origin's epoch); it diverged
    when its own accumulated error comes first; it is clean when it only deviates within its
    precision and nothing came in."""
    cul = entry["culprit"]
    if cul is None:
        div = entry.get("first_divergence")
        other = origin is not None and origin is not entry
        start = _order(origin)[0] if other else math.inf
        via = _deviating_collective(entry["_rows"], start) if other else None
        carrier = _collective_before(entry["_rows"], div.get("seq_my")) if div else None
        if div is not None and other and is_collective(div.get("op") or "") \
                and (via is not None or entry["verdict"] != V.PASS):
            # the error itself arrived through this collective or receive (an earlier one
            # may deviate within precision only, as every receive of a bf16 pipeline does);
            # a receive that brought an error in is judged a warning, never the rank's own
            entry["label"] = INHERITED
            entry["inherited"] = _inherited(entry, div, origin)
        elif via is not None and (div is None or _own_noise(entry) or _at(via) <= _at(div)):
            entry["label"] = INHERITED
            entry["inherited"] = _inherited(entry, via, origin)
        elif div is None or _own_noise(entry):
            entry["label"] = CLEAN
        elif other and (is_collective(div.get("op") or "") or (
                _order({"first_divergence": div}) > _order(origin)
                and (carrier is None or _epoch_of(carrier) >= start))):
            entry["label"] = INHERITED
            entry["inherited"] = _inherited(entry, div, origin)
        else:
            entry["label"] = DIVERGED
        return
    own_kernel = cul.get("local_verdict") == V.ERROR
    through = cul["op"] if is_collective(cul.get("op") or "") else None
    later = (origin is not None and origin is not entry
             and _order(entry) > _order(origin) and (entry["first_divergence"] or {}).get(
                 "epoch") not in (None, (origin["first_divergence"] or {}).get("epoch")))
    if not own_kernel and (through or (later and not has_replay)):
        entry["label"] = INHERITED
        entry["inherited"] = _inherited(entry, cul, origin or entry)
        entry["culprit"] = None
        return
    entry["label"] = CULPRIT


def _brief(row: dict[str, Any] | None, rank: int, offset: int, epochs: dict[int, int]
           ) -> dict[str, Any] | None:
    if row is None:
        return None
    out = row.as_dict() if isinstance(row, Row) else dict(row)
    out["rank"] = rank
    out["epoch"] = _epoch(epochs, row)
    out["rank_index"] = row["index"]
    out["index"] = row["index"] + offset
    return out


def merge(reports: dict[int, Report], epochs: dict[int, dict[int, int]], meta: dict[str, Any]
          ) -> Report:
    """One Report over all ranks: rows tagged with their rank and epoch, and a summary with a
    per-rank section and the merged verdicts."""
    rows: list[Row] = []
    entries: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    suspects: list[dict[str, Any]] = []
    for rank in sorted(reports):
        rep, offset, ep = reports[rank], len(rows), epochs[rank]
        start = len(rows)
        for r in rep.rows:  # tagged in the rank's own report too (its rank<N>/rows.csv)
            r.rank, r.epoch = rank, _epoch(ep, r)
            rows.append(replace(r, rank_index=r.index, index=r.index + offset))
        s = rep.summary
        for k, v in s["counts"].items():
            counts[k] = counts.get(k, 0) + v
        entry = {"rank": rank, "my": s["my"], "golden": s["golden"], "replay": s.get("replay"),
                 "verdict": s["verdict"], "counts": s["counts"], "rows": s["rows"],
                 "warning": s.get("warning"),
                 "random_ops_differ": (s.get("coverage") or {}).get("random_ops_differ", 0)}
        for k in _ROW_REF_KEYS:
            entry[k] = _brief(s.get(k), rank, offset, ep)
        entry["first_deviation"] = _brief(_first_deviation(rep.rows), rank, offset, ep)
        entry["_rows"] = rows[start:]
        suspects += [b for x in s.get("suspects", []) if (b := _brief(x, rank, offset, ep))]
        entries.append(entry)
    # Diverged: a culprit or an accumulated error. Deviations within a rank's precision
    # (warnings, or accumulated error where every tensor passed) alone name no rank: a clean
    # low-precision run has no "first" rank.
    diverged = [e for e in entries if _diverged(e)]
    # a rank whose divergence starts with what a collective or a receive brought in did not
    # start it, when another rank diverged by its own ops (a pipeline stage's fault below the
    # error threshold becomes an error only after the next stage's forward receive)
    own = [e for e in diverged if not _brought_in(e)]
    origin = min(own or diverged, key=_start) if diverged else None
    has_replay = meta.get("replay") is not None
    for e in entries:
        _label(e, origin, has_replay)
    for e in entries:
        del e["_rows"]
    culprits = [e for e in entries if e["culprit"] is not None]
    first = min(culprits, key=lambda e: _order({"first_divergence": e["culprit"]})
                ) if culprits else None
    suspects.sort(key=lambda x: (x["verdict"] != V.ERROR, -_num(x.get("score")), x["index"]))
    summary: dict[str, Any] = {
        **meta,
        "multirank": True,
        "counts": counts,
        "rows": len(rows),
        "verdict": (V.ERROR if counts.get(V.ERROR) else V.WARNING if counts.get(V.WARNING)
                    else V.PASS),
        "first_rank": origin["rank"] if origin else None,
        "culprit": first["culprit"] if first else None,
        "first_divergence": origin["first_divergence"] if origin else None,
        "suspects": suspects[:10],
        "ranks": entries,
    }
    warnings = [f"rank {e['rank']}: {e['warning']}" for e in entries if e.get("warning")]
    if meta.get("unpaired"):
        warnings.append(f"ranks only on one side, not compared: {meta['unpaired']}")
    if warnings:
        summary["warning"] = "; ".join(warnings)
    summary["blind"] = [f"rank {r}: {b}" for r, rep in sorted(reports.items())
                        for b in rep.summary.get("blind") or []]
    coverage: dict[str, int] = {}  # summed over ranks: what was compared, for the exit code
    for rep in reports.values():
        for k, v in (rep.summary.get("coverage") or {}).items():
            coverage[k] = coverage.get(k, 0) + int(v)
    summary["coverage"] = coverage
    if reports and all(rep.summary.get("nothing_compared") for rep in reports.values()):
        summary["nothing_compared"] = True
    return Report(rows, summary)


def _num(x: Any) -> float:
    return -math.inf if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


class MultiRankReport:
    """The merged Report plus each rank's own; `write()` puts the merged files at the top of
    the folder and each rank's full report in `rank<N>/`."""

    def __init__(self, merged: Report, per_rank: dict[int, Report]) -> None:
        self.merged = merged
        self.per_rank = per_rank

    @property
    def summary(self) -> dict[str, Any]:
        return self.merged.summary

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.merged.rows

    def exit_code(self, fail_on: str | None) -> int:
        return self.merged.exit_code(fail_on)

    def format(self, top: int = 5) -> str:
        """The merged summary as terminal text, one line per rank (`top` is unused: a
        rank's own suspects are in its report)."""
        return format_ranks(self.summary)

    def write(self, out_dir: str | os.PathLike[str], formats: tuple[str, ...] = ALL_FORMATS,
              *, overwrite: bool = True) -> dict[str, Path]:
        out = check_report_dir(out_dir, overwrite)
        paths: dict[str, Path] = {}
        for rank, rep in self.per_rank.items():
            rep.write(out / f"rank{rank}", formats)
        top = tuple(f for f in formats if f in ("json", "csv"))
        paths.update(self.merged.write(out, top))
        if "html" in formats:
            p = out / "index.html"
            p.write_text(render_html(self.summary), encoding="utf-8")
            paths["html"] = p
        return paths


def compare_ranks(my: str | os.PathLike[str], golden: str | os.PathLike[str],
                  replay: str | os.PathLike[str] | None = None, **kw: Any) -> MultiRankReport:
    """Compare each rank of `my` with the same rank of `golden` (patterns with `{rank}` or
    folders), with that rank's replay if given; keywords go to compare()."""
    t0 = time.perf_counter()
    fm, fg, fr = _sides(str(my), str(golden), str(replay) if replay else None)
    ranks = sorted(set(fm.files) & set(fg.files))
    if not ranks:
        raise UsageError(f"no rank is in both {my} (ranks {fm.ranks}) and {golden} "
                         f"(ranks {fg.ranks})")
    unpaired = sorted(set(fm.files) ^ set(fg.files))
    reports: dict[int, Report] = {}
    epochs: dict[int, dict[int, int]] = {}
    comm: dict[int, dict[int, tuple[int, dict[str, Any]]]] = {}
    nbytes = 0
    for rank in ranks:
        with load_dump(fm.files[rank]) as dm:
            rp = fr.files.get(rank) if fr is not None else None
            reports[rank] = compare(dm, fg.files[rank], rp, **kw)
            epochs[rank], comm[rank] = _epochs(dm)
        nbytes += reports[rank].summary.get("bytes_compared", 0)
    epochs = logical_epochs(comm, epochs)  # pipeline stages: a receive after its send
    seconds = time.perf_counter() - t0
    meta = {"my": str(my), "golden": str(golden), "replay": str(replay) if replay else None,
            "world_size": fm.world_size, "ranks_compared": ranks, "unpaired": unpaired,
            "bytes_compared": nbytes, "seconds": seconds,
            "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None}
    log.info("compared %d ranks in %.2f s", len(ranks), seconds)
    return MultiRankReport(merge(reports, epochs, meta), reports)


def _epochs(d: Dump) -> tuple[dict[int, int], dict[int, tuple[int, dict[str, Any]]]]:
    """seq -> epoch of every row, and epoch -> (seq, note) of each communication op."""
    comm = {r.epoch: (r.seq, note) for r in d.records
            if isinstance(note := r.extra.get("collective"), dict)
            and note.get("kind") not in (None, "wait")}
    return {r.seq: r.epoch for r in d.records}, comm


# -- the merged page -------------------------------------------------------------------------

def _op_line(r: dict[str, Any] | None, many: bool = True) -> str:
    """An op row on the page; its collective epoch only where ranks are lined up by it (in a
    one-rank run every op is at epoch 0, which read as a training epoch)."""
    if r is None:
        return "none"
    epoch = f"collective epoch {html.escape(str(r.get('epoch')))}, " if many else ""
    return (f"<code>{html.escape(str(r.get('op')))}</code> ({html.escape(str(r.get('phase')))}"
            f") in <code>{html.escape(str(r.get('module') or '-'))}</code>, {epoch}"
            f"seq {html.escape(str(r.get('seq_my')))}: "
            f"{html.escape(str(r.get('message') or ''))}")


def render_html(s: dict[str, Any]) -> str:
    """index.html of a multi-rank report: merged verdict, then one line per rank."""
    many = (s.get("world_size") or 1) > 1
    lines = []
    for e in s["ranks"]:
        if e["label"] == INHERITED:
            what = (f"inherited error via <code>{html.escape(str(e['inherited']['via']))}"
                    f"</code> (collective epoch {html.escape(str(e['inherited']['epoch']))}) "
                    f"from rank {html.escape(str(e['inherited']['from_rank']))}; no culprit of "
                    "its own")
        elif e["label"] == CULPRIT:
            what = "culprit: " + _op_line(e["culprit"], many)
        else:
            what = html.escape(e["label"])
        lines.append(
            f"<tr class=\"{html.escape(e['verdict'])}\"><td>{e['rank']}</td>"
            f"<td>{html.escape(e['verdict'])}</td><td>{html.escape(e['label'])}</td>"
            f"<td>{what}</td><td>{_op_line(e['first_divergence'], many)}</td>"
            f"<td><a href=\"rank{e['rank']}/index.html\">report</a></td></tr>")
    warn = f"<p class=\"box\">{html.escape(s['warning'])}</p>" if s.get("warning") else ""
    warn = "".join(f"<p class=\"box\"><b>Not seen:</b> {html.escape(str(b))}</p>"
                   for b in s.get("blind") or []) + warn
    first = s.get("first_rank")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>accuracy multi-rank report</title>
<style>body{{font:14px system-ui,sans-serif;margin:20px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ddd;padding:3px 6px;font-size:13px}} tr.error{{background:#fbe3e1}}
tr.warning{{background:#fdf4d8}} .box{{border:1px solid #ccc;padding:8px;background:#fafafa}}
</style></head><body>
<h1>accuracy compare, {len(s['ranks'])} ranks (world size {s.get('world_size')}):
{html.escape(str(s.get('my')))} vs {html.escape(str(s.get('golden')))}</h1>{warn}
<p>Verdict: <b>{html.escape(s['verdict'])}</b>. Rank that diverged first (by collective epoch,
then seq): <b>{'none' if first is None else first}</b>.</p>
<p class="box">Culprit: {('rank ' + str(s['culprit']['rank']) + ': ') if s.get('culprit') else ''}
{_op_line(s.get('culprit'), many)}</p>
<h2>Ranks</h2><table><thead><tr><th>rank</th><th>verdict</th><th>label</th><th>culprit</th>
<th>first divergence</th><th>full report</th></tr></thead><tbody>{''.join(lines)}</tbody>
</table><p>All ranks' rows: <a href="rows.csv">rows.csv</a> (Rank column),
<a href="summary.json">summary.json</a>.</p></body></html>
"""

