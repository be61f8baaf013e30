"""`PrecisionDebugger`: msprobe's start/stop/step driver around the dumper.

A driver, not a recorder: on a step the config selects (and a rank it selects), `start()`
opens a `dumper` writing `dump_path/step{N}/rank{R}/dump.h5` and `stop()` closes it; on every
other step nothing is installed, so the step runs at the bare speed. Mistakes in the call
order are logged, one line each, and training goes on. The first `start()` says where the
dumps go, and whether `dump_path` already holds an earlier run's (not replaced unless
`overwrite` was chosen), as warnings: a training script shows no info lines.

The config file is re-read while training runs, as msprobe's dynamic switch (`dump_enable`)
needs: at the end of each step, when its modification time or size changed, through the same
loader as at the start. A change written before step N takes effect from step N+1 at the
latest; a file that does not load (half-written, invalid) leaves the config in force and says
why once.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from accuracy.debugger import config as _config
from accuracy.errors import AccuracyError
from accuracy.steps import Schedule

log = logging.getLogger(__name__)


class PrecisionDebugger:
    """msprobe's `PrecisionDebugger(config_path=..., task=..., dump_path=..., level=...,
    model=..., step=...)`; `schedule=` (ours) takes `accuracy.schedule(...)`.

    Keywords win over the file, as in msprobe. `overwrite` (or `"overwrite": true` in the
    file): replace a step's dump left by an earlier run (otherwise that step is not recorded;
    the first `start()` warns of them).
    """

    def __init__(self, config_path: str | os.PathLike[str] | None = None, task: str | None = None,
                 dump_path: str | os.PathLike[str] | None = None, level: str | None = None,
                 model: Any = None, step: list[int | str] | None = None, *,
                 schedule: Schedule | None = None, overwrite: bool | None = None) -> None:
        over = dict(task=task, dump_path=str(dump_path) if dump_path is not None else None,
                    level=level, step=step, schedule=schedule, overwrite=overwrite)
        self._overrides = over
        self.config_path = Path(config_path) if config_path is not None else None
        self._stamp = self._file_stamp()
        self._refused: tuple[int, ...] | None = None  # the file version said to be refused
        if self.config_path is not None:
            self.config = _config.load(self.config_path, **over)
        else:
            self.config = _config.build({}, "PrecisionDebugger", **over)
        source = (f"config {self.config_path} (re-read after each step when it changes)"
                  if self.config_path is not None else "keywords")
        log.info("PrecisionDebugger: in force from %s: %s", source, self.config.describe())
        if self.config.ignored:
            log.info("config fields with no effect here: %s", ", ".join(self.config.ignored))
        self.model = model
        self.current_step = 0
        self._started = False
        self._announced = False
        self._dumper: Any = None
        self._rank: int | None = None

    # -- msprobe's calls -----------------------------------------------------------------

    def start(self, model: Any = None) -> None:
        """Begin the step's recorded region (nothing is installed on an unselected step)."""
        if model is not None:
            self.model = model
        if self._started:
            log.warning("PrecisionDebugger.start() called twice without stop() (step %d): "
                        "the second call is ignored", self.current_step)
            return
        self._started = True
        if "torch._dynamo" in sys.modules:  # a program compiled from now on is recorded
            # on the selected step as it runs, not recompiled (dumper/compiled/standing.py)
            from accuracy.dumper.compiled import standing

            standing.ensure()
        if not self._announced:
            self._announced = True
            self._announce()
        if not self.config.wants(self.current_step, self.rank):
            return
        try:
            self._dumper = self._open()
        except Exception as e:  # noqa: BLE001 - the training goes on without this step's dump
            self._dumper = None
            log.error("step %d: not recorded: %s", self.current_step, e)

    def stop(self) -> None:
        """End the recorded region; the step's dump is complete on disk when this returns."""
        if not self._started:
            log.warning("PrecisionDebugger.stop() without start() (step %d): nothing to stop",
                        self.current_step)
            return
        self._started = False
        self._close()

    def step(self) -> None:
        """End of a training step: the next `start()` counts as step N+1."""
        if self._started and self._dumper is not None:
            log.warning("PrecisionDebugger.step() inside a recorded region (start() without "
                        "stop()) at step %d: the region is closed here", self.current_step)
        self._started = False
        self._close()
        self.current_step += 1
        if self.config_path is not None:
            self._reload()

    # -- the file re-read while training runs ----------------------------------------------

    def _file_stamp(self) -> tuple[int, ...] | None:
        if self.config_path is None:
            return None
        try:
            st = os.stat(self.config_path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)

    def _reload(self) -> None:
        """The file, again, if it changed; the next step follows it."""
        stamp = self._file_stamp()
        if stamp == self._stamp or stamp == self._refused:
            return
        try:
            new = _config.load(self.config_path, **self._overrides)  # type: ignore[arg-type]
        except (AccuracyError, OSError, ValueError) as e:
            self._refused = stamp
            log.warning("config %s changed but is not applied (%s); the config in force "
                        "stays: %s", self.config_path, " ".join(str(e).split()),
                        self.config.describe())
            return
        self._stamp, self._refused = stamp, None
        if new == self.config:
            return
        self.config = new
        log.info("config %s re-read: from step %d: %s", self.config_path, self.current_step,
                 new.describe())

    # -- ours ----------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        if self._rank is None:
            from accuracy.dumper.loop import current_rank

            self._rank = current_rank()[0]
        return self._rank

    def path_for(self, step: int, rank: int) -> Path:
        """Where step `step` of rank `rank` is written."""
        return self.config.dump_path / f"step{step}" / f"rank{rank}" / "dump.h5"

    @property
    def overwrite(self) -> bool:
        """Whether an earlier run's dump of a step recorded again is replaced."""
        return self.config.overwrite

    def earlier_steps(self) -> list[int]:
        """Steps of this rank whose dumps an earlier run left in dump_path."""
        found = []
        try:
            for child in self.config.dump_path.glob("step*"):
                n = child.name[4:]
                if n.isdigit() and (child / f"rank{self.rank}" / "dump.h5").is_file():
                    found.append(int(n))
        except OSError:
            return []
        return sorted(found)

    def _announce(self) -> None:
        """Where this run dumps, and what an earlier run left there: said once, as warnings
        (msprobe prints its dump path; a reused dump_path kept each step's old dump and said
        only 'not recorded' per step, as an error)."""
        if not self.config.dump_enable:
            return
        c = self.config
        log.warning("PrecisionDebugger: recording %s (%s mode) to %s/step{N}/rank%d/dump.h5",
                    c.steps_text(), c.mode, c.dump_path, self.rank)
        old = self.earlier_steps()
        if not old:
            return
        shown = ", ".join(map(str, old[:10])) + (", ..." if len(old) > 10 else "")
        if self.overwrite:
            log.warning("PrecisionDebugger: %s holds an earlier run's dumps (steps %s): each "
                        "step recorded again replaces its dump (overwrite)", c.dump_path, shown)
        else:
            log.warning("PrecisionDebugger: %s holds an earlier run's dumps (steps %s): a step "
                        "recorded again is not written and its old dump is kept; pass "
                        "overwrite=True (or \"overwrite\": true in config.json) to replace "
                        "them, or choose another dump_path", c.dump_path, shown)

    @property
    def recording(self) -> bool:
        """Whether a dump is open now."""
        return self._dumper is not None

    def _open(self) -> Any:
        from accuracy.dumper.core import dumper

        c = self.config
        path = self.path_for(self.current_step, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        d = dumper(path, c.mode, ops=c.ops or None, modules=c.modules or None,
                   data_mode=list(c.data_mode), overwrite=self.overwrite,
                   check_overflow=c.task == "overflow_check", overflow_nums=c.overflow_nums)
        d.current_step = self.current_step
        d.__enter__()
        return d

    def _close(self) -> None:
        d, self._dumper = self._dumper, None
        if d is None:
            return
        try:
            d.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - training goes on; the log says what was lost
            log.error("step %d: closing the dump failed: %s", self.current_step, e)
