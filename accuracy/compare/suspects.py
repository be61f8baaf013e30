"""Two-tier flow, step 2: turn a statistics-mode report into a dump selection.

A statistics dump of every op is cheap (about 1 MB for the benchmark step); tensors of every
op are not (540 MB). The report of two statistics dumps already ranks suspects; this picks
the ops around the top ones (the suspect, a few ops before it whose outputs feed it, the op
after, and the end of its module) so `dumper(..., select="suspects.json")` records tensors
of just those in a second run, under the same seq numbers. See docs/cluster.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accuracy.compare.report import load_report
from accuracy.dumpfile.schema import SELECTION_FORMAT
from accuracy.errors import OutputExistsError, UsageError
from accuracy.outputs import writable_folder


def _pick_keys(summary: dict[str, Any], top: int) -> list[tuple]:
    picks = [r for r in (summary.get("suspects") or [])[:top]]
    for k in ("culprit", "first_divergence"):
        if summary.get(k):
            picks.append(summary[k])
    out: list[tuple] = []
    for r in picks:
        key = (r.get("seq_my"), r.get("seq_golden"))
        if key not in out and None not in key:
            out.append(key)
    return out


def select_suspects(report_dir: str | os.PathLike[str], *, top: int = 5, before: int = 3,
                    after: int = 1) -> dict[str, Any]:
    """The selection (a JSON-able dict) for the top suspects of the report in `report_dir`.

    For each of the `top` suspects (plus the culprit and the first divergence), the matched
    ops from `before` ops ahead of it to `after` ops behind it in execution order, and the
    end op of the modules it runs in (where the report's module rows are taken).
    """
    if top < 1 or before < 0 or after < 0:
        raise UsageError("top must be at least 1, before and after at least 0")
    data = load_report(report_dir)
    summary, rows = data["summary"], data["rows"]
    if not rows:
        raise UsageError(f"{report_dir}: the report has no rows.json; write it with "
                         "`accuracy compare ... --formats json`")
    order: list[tuple] = []  # matched ops in execution order: (seq_my, seq_golden)
    names: dict[tuple, tuple[str, str, str, str]] = {}  # op, golden op, module, phase
    module_ends: dict[str, list[tuple]] = {}  # module -> (key, phase) of each of its end rows
    for r in rows:
        key = (r.get("seq_my"), r.get("seq_golden"))
        if None in key:
            continue
        if r.get("kind") == "op":
            if key not in names:
                order.append(key)
                names[key] = (r.get("op") or "", r.get("op_golden") or r.get("op") or "",
                              r.get("module") or "", r.get("phase") or "")
        elif r.get("module"):
            module_ends.setdefault(r["module"], []).append((key, r.get("phase") or ""))
    position = {k: i for i, k in enumerate(order)}
    chosen: dict[tuple, str] = {}
    for rank, key in enumerate(_pick_keys(summary, top)):
        i = position.get(key)
        if i is None:
            continue
        for k in order[max(0, i - before): i + after + 1]:
            chosen.setdefault(k, f"around suspect {rank + 1}")
        module, phase = names[key][2], names[key][3]
        while module:
            # The end of the call the suspect runs in: the module's first end row at or after
            # it in the same phase (not every call, nor the optimizer's rows of its parameters).
            ends = [position[k] for k, ph in module_ends.get(module, [])
                    if ph == phase and position.get(k, -1) >= i]
            if ends:
                chosen.setdefault(order[min(ends)], f"end of module {module}")
            module = module.rpartition(".")[0]
    keys = sorted(chosen, key=position.__getitem__)
    return {
        "format": SELECTION_FORMAT,
        "report": str(Path(report_dir)),
        "dumps": {"my": summary.get("my"), "golden": summary.get("golden")},
        "suspects": [{"seq_my": k[0], "seq_golden": k[1], "op": names[k][0]}
                     for k in _pick_keys(summary, top) if k in names],
        "my": [{"seq": k[0], "op": names[k][0], "why": chosen[k]} for k in keys],
        "golden": [{"seq": k[1], "op": names[k][1], "why": chosen[k]} for k in keys],
    }


def write_selection(selection: dict[str, Any], path: str | os.PathLike[str],
                    overwrite: bool = False) -> Path:
    p = Path(path)
    if p.exists() and not overwrite:
        raise OutputExistsError(f"{p} already exists; pass --overwrite or choose another -o")
    writable_folder(p.parent, f"-o {p}: folder")
    p.write_text(json.dumps(selection, indent=1) + "\n")
    return p


def format_selection(selection: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """What was selected and how to use it in the second run."""
    return (f"{len(selection['my'])} ops around {len(selection['suspects'])} suspects of "
            f"{selection.get('report', 'the report')}; wrote {path}\n"
            f'  second run: with dumper("device.h5", select="{path}"): step()  (and golden)')
