"""Compare two PrecisionDebugger trees (`dump_path/step{N}/rank{R}/dump.h5`) step by step.

Each step both trees hold is a multi-rank comparison (compare/multirank.py pairs its ranks by
the rank recorded in each file); a step only one side holds is named, never skipped silently.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from accuracy.compare.multirank import MultiRankReport, compare_ranks
from accuracy.compare.report import ALL_FORMATS, check_report_dir
from accuracy.errors import UsageError

log = logging.getLogger(__name__)

_STEP = re.compile(r"step(\d+)")
LEAF = "rank{rank}/dump.h5"


def step_dirs(spec: str | os.PathLike[str]) -> dict[int, Path]:
    """step number -> its folder, for a folder laid out by PrecisionDebugger (else empty)."""
    p = Path(spec)
    if not p.is_dir():
        return {}
    out: dict[int, Path] = {}
    for child in p.iterdir():
        m = _STEP.fullmatch(child.name)
        if m and child.is_dir() and not child.is_symlink():
            out[int(m.group(1))] = child
    return out


def is_step_tree(spec: str | os.PathLike[str] | None) -> bool:
    return spec is not None and bool(step_dirs(spec))


class StepsReport:
    """One MultiRankReport per step; `write()` puts each in `step<N>/`."""

    def __init__(self, per_step: dict[int, MultiRankReport], unpaired: list[int]) -> None:
        self.per_step = per_step
        self.unpaired = unpaired

    def exit_code(self, fail_on: str | None) -> int:
        return max((r.exit_code(fail_on) for r in self.per_step.values()), default=0)

    def format(self, top: int = 5) -> str:
        lines: list[str] = []
        if self.unpaired:
            lines.append(f"steps in only one tree (not compared): {self.unpaired}")
        for step, rep in sorted(self.per_step.items()):
            lines.append(f"== step {step} ==")
            lines.append(rep.format(top))
        return "\n".join(lines)

    def write(self, out_dir: str | os.PathLike[str], formats: tuple[str, ...] = ALL_FORMATS,
              *, overwrite: bool = True) -> dict[str, Path]:
        out = check_report_dir(out_dir, overwrite)
        paths: dict[str, Path] = {}
        for step, rep in sorted(self.per_step.items()):
            for kind, p in rep.write(out / f"step{step}", formats).items():
                paths[f"step{step} {kind}"] = p
        return paths


def compare_steps(my: str | os.PathLike[str], golden: str | os.PathLike[str],
                  replay: str | os.PathLike[str] | None = None, **kw: Any) -> StepsReport:
    """Compare every step both trees hold, rank by rank; keywords go to compare()."""
    sm, sg = step_dirs(my), step_dirs(golden)
    sr = step_dirs(replay) if replay else {}
    if not sm or not sg:
        side = my if not sm else golden
        raise UsageError(f"{side}: no step<N>/ folders: give both sides as PrecisionDebugger "
                         "dump_path folders, or both as single dumps")
    steps = sorted(set(sm) & set(sg))
    if not steps:
        raise UsageError(f"no step is in both {my} (steps {sorted(sm)}) and {golden} "
                         f"(steps {sorted(sg)})")
    unpaired = sorted(set(sm) ^ set(sg))
    if unpaired:
        log.warning("steps in only one tree, not compared: %s", unpaired)
    reports: dict[int, MultiRankReport] = {}
    for step in steps:
        rp = str(sr[step] / LEAF) if step in sr else None
        reports[step] = compare_ranks(str(sm[step] / LEAF), str(sg[step] / LEAF), rp, **kw)
    return StepsReport(reports, unpaired)
