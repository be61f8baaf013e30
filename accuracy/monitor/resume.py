"""A resumed job continues its run: where its rows go, and the triggers' history it restores.

A job resumed from a checkpoint at step N makes its monitor with `start_step=N`. The file of
the run before it is never rewritten: the new rows go to a segment beside it
(`series.segment_path`), which `read_series` joins after the earlier rows (those from step N
on, run after the checkpoint and now run again, give way). The triggers' windows (running
medians) are refilled from the rows before step N, so the resumed job fires on the steps an
uninterrupted one would.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accuracy.errors import OutputExistsError
from accuracy.monitor.series import MonitorFileError, Series, read_series, segment_path, segments
from accuracy.monitor.triggers import StepFigures, Trigger

log = logging.getLogger(__name__)


@dataclass
class Continued:
    """What a monitor starting at `start_step` continues: the path it writes, the attrs that
    tie it to the earlier rows, and those rows (None: a new run)."""

    path: Path
    attrs: dict[str, Any] = field(default_factory=dict)
    earlier: Series | None = None


def continue_run(path: Path, start_step: int, overwrite: bool) -> Continued:
    """Where a monitor starting at `start_step` writes. A new run (step 0, or no file yet)
    writes `path`; a resumed one, a segment beside the file it continues."""
    if start_step <= 0 or overwrite or not path.exists():
        return Continued(path)
    try:
        earlier = read_series(path)
    except (MonitorFileError, OSError) as e:
        raise OutputExistsError(f"{path} exists and cannot be continued ({e}); pass "
                                "overwrite=True or another path") from None
    taken = [int(p.name.rsplit(".seg", 1)[1][:-3]) for p in segments(path)]
    k = max(taken, default=0) + 1
    seg = segment_path(path, k)
    if seg.exists():  # a link or a folder with that name: never written through
        raise OutputExistsError(f"{seg} exists and is not a segment of {path.name}; move it")
    attrs = {"segment": k, "resumed_at": int(start_step),
             "base_created": earlier.attrs.get("created")}
    return Continued(seg, attrs, earlier)


def restore_triggers(triggers: list[Trigger], earlier: Series, start_step: int,
                     freq: int) -> list[tuple[int, str]]:
    """Refill the triggers' history with the rows before `start_step`; returns the firings
    recorded there (step, reason), so a run that already fired does not capture again."""
    rows = [i for i, s in enumerate(earlier.step) if s < start_step]
    for i in rows:
        g = float(earlier.grad_norm[i])
        s = StepFigures(int(earlier.step[i]), float(earlier.loss[i]), g, figures={},
                        grad_known=not math.isnan(g))
        for t in triggers:
            try:
                t.restore(s)
            except Exception:  # noqa: BLE001 - a user's trigger: its history stays empty
                log.exception("monitor: restoring trigger %s failed", t.name)
    if freq > 1 and rows:
        log.info("monitor: the triggers' history is restored from the %d recorded steps "
                 "before step %d (freq=%d: the loss of the other steps was not recorded)",
                 len(rows), start_step, freq)
    fired = []
    for e in earlier.events:
        st = e.get("step")
        if e.get("kind") == "trigger" and isinstance(st, int) and st < start_step:
            reasons = e.get("reasons")
            fired.append((st, "; ".join(map(str, reasons)) if isinstance(reasons, list)
                          else str(reasons)))
    return fired
