"""A report's summary as terminal text (`Report.format`, `MultiRankReport.format`).

Kept apart from the report files' writers: this is what `accuracy compare` prints, and what a
notebook user gets from `print(report.format())`.
"""

from __future__ import annotations

from typing import Any

from accuracy.compare.draws import DRAWS_DIFFER
from accuracy.dumpfile.compiled import HOP_NOT_RECORDED, NOT_RECORDED
from accuracy.termtext import shown


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))


def _where(r: dict[str, Any]) -> str:
    return (f"seq {r['seq_my']} {shown(r['op'] or '')} [{r['phase']}] in "
            f"{shown(r['module'] or '-')} at {shown(r['source'] or '?')}\n      "
            f"{shown(str(r['my_address']))}  vs  {shown(str(r['golden_address']))}")


NOT_COMPARED = "not compared"  # a BLIND line: most of my run had no golden counterpart
NOT_REPLAYED = "not judged by replay"  # a BLIND line: most compiled kernels not re-run


def verdict_text(s: dict[str, Any]) -> str:
    """The overall verdict, qualified when compiled regions were not seen as compiled, tensor
    subclasses not seen into, or most of my run not compared: a PASS over code the compare
    never saw is never printed bare."""
    if s.get("nothing_compared"):
        return "NOTHING COMPARED (no verdict)"  # an empty dump passes nothing
    blind = s.get("blind") or []
    if not blind:
        return s["verdict"].upper()
    subclasses = sum(1 for b in blind if "tensor subclass" in b)
    failed = sum(1 for b in blind if NOT_RECORDED in b)
    hops = sum(1 for b in blind if HOP_NOT_RECORDED in b)
    uncompared = [b for b in blind if f"{NOT_COMPARED}:" in b]  # "rank 1: not compared: ..."
    unreplayed = [b for b in blind if f"{NOT_REPLAYED}:" in b]
    draws = sum(1 for b in blind if f"{DRAWS_DIFFER}:" in b)
    n = len(blind) - subclasses - failed - hops - len(uncompared) - len(unreplayed) - draws
    parts = [f"{n} compiled region(s) not seen as compiled"] if n else []
    if hops:
        parts.append(f"{hops} higher-order op(s) run without their ops recorded")
    if subclasses:
        parts.append(f"{subclasses} tensor subclass(es) not seen into")
    if failed:
        parts.append("ops the dumper failed on not recorded")
    c = s.get("coverage") or {}
    if uncompared and c.get("my_tensors", 0) > 2 * c.get("compared", 0):
        parts.append(f"{c.get('my_tensors', 0) - c.get('compared', 0)} of "
                     f"{c.get('my_tensors', 0)} tensors of my run not compared")
    if c.get("phases_uncompared"):
        parts.append(f"{c['phases_uncompared']} phase(s) of my run not compared")
    if uncompared and c.get("kernel_outputs"):
        parts.append(f"{c['kernel_outputs'] - c.get('kernels_compared', 0)} of "
                     f"{c['kernel_outputs']} compiled kernel outputs not compared")
    if draws:
        parts.append(f"random draws differ at {c.get('random_ops_differ', '?')} op(s), "
                     "numerics after them not judged")
    if unreplayed and c.get("kernel_launches"):
        parts.append(f"{c['kernel_launches'] - c.get('kernels_replayed', 0)} of "
                     f"{c['kernel_launches']} compiled kernels not judged by replay")
    return f"{s['verdict'].upper()} over what was recorded only: {', '.join(parts)} (BLIND above)"


FUSED = "fused away"


def count_parts(s: dict[str, Any]) -> list[tuple[str, int]]:
    """A summary's row counts as shown: the unmatched rows that are eager values a compiled
    run fused into its kernels by design counted apart, as "fused away", after the others
    ("unmatched 541" worried a reader when 521 of them were fused away)."""
    fused = int(s.get("fused_away") or 0)
    out: list[tuple[str, int]] = []
    for k, v in s["counts"].items():
        if k == "unmatched" and fused:
            out += [(k, v - fused), (FUSED, fused)]
        else:
            out.append((k, v))
    return out


def format_summary(s: dict[str, Any], top: int = 5) -> str:
    """A compare's summary: what the dumps did not see first, then counts, speed, the culprit
    and the `top` suspects."""
    out = [f"compared {s['my']} (my) with {s['golden']} (golden)"
           + (f", replay {s['replay']}" if s.get("replay") else "")]
    out += [f"  BLIND: {b}" for b in s.get("blind") or []]
    out += [f"  RECOMPILED: {b}" for b in s.get("recompiles") or []]
    out += [f"  WARNING: {w}" for w in s.get("refusals") or []]
    out.append(f"  rows {s['rows']}: " + ", ".join(f"{k} {v}" for k, v in count_parts(s))
               + f"  ->  {verdict_text(s)}")
    judged = s.get("judged_counts")
    if judged:
        out.append("  tensors judged where produced: "
                   + ", ".join(f"{k} {judged[k]}" for k in ("pass", "warning", "error")))
    gbps = s.get("gb_per_s")
    out.append(f"  {s['bytes_compared'] / 1e6:.1f} MB of tensor data in {s['seconds']:.2f} s"
               + ((f" ({gbps:.2f} GB/s)" if gbps >= 0.1 else f" ({gbps * 1e3:.3g} MB/s)")
                  if gbps else ""))
    said = str(s.get("warning") or "")
    for w in s.get("refusals") or []:  # already a WARNING line above
        said = said.replace(w, "").strip()
    if said:
        out.append(f"  warning: {said}")
    cul = s.get("culprit")
    if cul:
        out.append(f"  culprit: {_where(cul)}")
        out.append(f"      {cul['verdict']}: {cul['message']}")
    else:
        out.append("  culprit: none (no op output is judged an error)")
    first = s.get("first_divergence")
    if first and (not cul or first.get("my_address") != cul.get("my_address")):
        out.append(f"  first divergence (where the run starts to differ, whoever caused it): "
                   f"{_where(first)}")
    suspects = s.get("suspects") or []
    if suspects:
        honest = ("; ops whose kernels amplify honestly (divisions, thresholds, views of part "
                  "of their input) last" if s.get("ranking") == "amplification" else "")
        out.append(f"  top suspects (errors, then warnings; each by score = "
                   f"{s.get('ranking') or 'local error or amplification'}"
                   f", x what an honest kernel explains{honest}):")
        out += [f"    {_fmt(r['score']):>10}  {r['verdict']:7s} seq {r['seq_my']} "
                f"{shown(r['op'] or '')} [{r['phase']}] {shown(r['module'] or '-')}"
                for r in suspects[:top]]
    out += [f"  note: {n}" for n in s.get("notes") or []]
    return "\n".join(out)


def culprit_text(c: dict[str, Any]) -> str:
    """An op row as a summary names it: op, phase and module."""
    return f"{shown(c.get('op') or '')} [{c.get('phase')}] in {shown(c.get('module') or '-')}"


def format_ranks(s: dict[str, Any]) -> str:
    """A multi-rank compare's merged summary, one line per rank. Collective epochs (how many
    collectives a rank had issued) are said only where there are ranks to line up: in a
    one-rank run every op is at epoch 0, which read as a training epoch."""
    many = (s.get("world_size") or 1) > 1

    def epoch(r: dict[str, Any]) -> str:
        return f" at collective epoch {r.get('epoch')}" if many else ""

    out = [f"compared {len(s['ranks'])} ranks (world size {s['world_size']}): {s['my']} (my) "
           f"with {s['golden']} (golden)" + (f", replay {s['replay']}" if s.get("replay") else "")
           + f"  ->  {verdict_text(s)}",
           f"  {s['bytes_compared'] / 1e6:.1f} MB of tensor data in {s['seconds']:.2f} s"]
    out[1:1] = [f"  BLIND: {b}" for b in s.get("blind") or []]
    if s.get("warning"):
        out.append(f"  warning: {s['warning']}")
    within = any(e.get("first_deviation") for e in s["ranks"])
    out.append("  diverged first: " + (f"rank {s['first_rank']}" if s["first_rank"] is not None
                                       else "none (deviations within precision only: no "
                                       "error, no culprit)" if within else "none"))
    for e in s["ranks"]:
        c, fd = e["culprit"], e["first_divergence"]
        if e["label"] == "inherited":
            i = e["inherited"]
            what = (f"inherited via {i['via']} (collective epoch {i['epoch']}) from rank "
                    f"{i['from_rank']}")
        elif c is not None:
            # the merged rows.csv's Index, and the row in the rank's own report
            what = (f"culprit #{c['index']} (rank{e['rank']}/rows.csv #{c['rank_index']}) "
                    f"{culprit_text(c)}{epoch(c)}: {c['message']}")
        else:
            what = e["label"]
        out.append(f"  rank {e['rank']}: {e['verdict']:7s} {what}"
                   + (f" (first divergence seq {fd['seq_my']}{epoch(fd)})" if fd else ""))
    return "\n".join(out)


def format_written(paths: dict[str, Any]) -> str:
    """The report files written, one line each."""
    return "\n".join(f"  wrote {f}: {p}" for f, p in paths.items())
