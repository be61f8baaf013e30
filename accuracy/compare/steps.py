"""Compare two PrecisionDebugger trees (`dump_path/step{N}/rank{R}/dump.h5`) step by step.

Each step both trees hold is a multi-rank comparison (compare/multirank.py pairs its ranks by
the rank recorded in each file); a step only one side holds is named, never skipped silently.
A step that starts from parameters that already differ (an earlier step's fault reached the
weights through the optimizer) is said: its culprit may be an op that only met those weights,
so the first faulty step is the one to read.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from accuracy.compare.multirank import MultiRankReport, compare_ranks
from accuracy.compare.report import ALL_FORMATS, check_report_dir
from accuracy.compare.row import JUDGED, Row
from accuracy.compare.terminal import culprit_text
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


def read_not_made(row: Row) -> bool:
    """A forward op's input that no recorded op of the step made (parameters, buffers, the
    batch), paired and compared with golden."""
    return (row.kind == "op" and row.io == "input" and row.phase == "forward"
            and not row.produced_by and row.verdict in JUDGED
            and row.golden_address is not None)


def _differs(row: Row) -> bool:
    if row.bit_exact is not None:
        return not row.bit_exact
    return any(v for v in (row.max_diff, row.min_diff, row.mean_diff, row.l2norm_diff))


def start_differs(rows: list[Row]) -> list[Row]:
    """The tensors a step read but did not make (`read_not_made`) that differ from golden:
    the step started from other parameters (or another batch)."""
    return [r for r in rows if read_not_made(r) and _differs(r)]


class StepsReport:
    """One MultiRankReport per step; `write()` puts each in `step<N>/`."""

    def __init__(self, per_step: dict[int, MultiRankReport], unpaired: list[int],
                 my: str = "", golden: str = "") -> None:
        self.per_step = per_step
        self.unpaired = unpaired
        self.my, self.golden = my, golden
        self.start = {step: start_differs(rep.rows) for step, rep in per_step.items()}

    def exit_code(self, fail_on: str | None) -> int:
        return max((r.exit_code(fail_on) for r in self.per_step.values()), default=0)

    def first_faulty(self) -> int | None:
        """The first step with a culprit that started from the same parameters as golden."""
        return next((step for step, rep in sorted(self.per_step.items())
                     if rep.summary.get("culprit") and not self.start[step]), None)

    def _start_line(self, step: int, first: int | None) -> str:
        differ = self.start[step]
        r = differ[0]
        where = f"input {r.tensor_index} of {r.op} in {r.module or 'the root'}"
        then = (f"step {first}" if first is not None and first < step
                else "an earlier step, recorded from where the runs still matched")
        return (f"  parameters differ at the start of step {step} ({len(differ)} tensors the "
                f"step read but did not compute differ from golden, first: {where}): its "
                f"culprit may have only met weights an earlier step changed; compare the first "
                f"faulty step, {then}")

    def format(self, top: int = 5) -> str:
        """Every step's merged summary, each said at its step, then the first faulty step."""
        steps = sorted(self.per_step)
        lines = [f"compared steps {', '.join(map(str, steps))} of {self.my} (my) with "
                 f"{self.golden} (golden)"]
        if self.unpaired:
            lines.append(f"steps in only one tree (not compared): {self.unpaired}")
        first = self.first_faulty()
        for step in steps:
            lines.append(f"== step {step} ==")
            if self.start[step]:
                lines.append(self._start_line(step, first))
            lines.append(self.per_step[step].format(top))
        if first is not None:
            cul = self.per_step[first].summary["culprit"]
            lines.append(f"first faulty step: step {first}, {culprit_text(cul)} "
                         f"(rank {cul.get('rank')})")
        else:
            lines.append("first faulty step: none (no step that started from golden's "
                         "parameters has a culprit)")
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
    if unpaired:  # the report says it (its first lines): a warning here printed it twice
        log.info("steps in only one tree, not compared: %s", unpaired)
    reports: dict[int, MultiRankReport] = {}
    for step in steps:
        rp = str(sr[step] / LEAF) if step in sr else None
        reports[step] = compare_ranks(str(sm[step] / LEAF), str(sg[step] / LEAF), rp, **kw)
    return StepsReport(reports, unpaired, str(my), str(golden))
