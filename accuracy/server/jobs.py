"""Compare jobs: each runs `accuracy.compare` (and optionally `accuracy.replay`) in a child
process, so a job can be cancelled for real and a crash in it cannot take the server down.

One job runs at a time (comparisons are CPU-bound); the others wait in order. A child runs in
its own process group and dies with its server (PR_SET_PDEATHSIG, and a watchdog on the parent
pid where prctl is missing); whatever it leaves half-written (the replay's `runs/<id>.h5.partial`,
the report directory) is removed by the server whenever the child ends without success, SIGKILL
included. A server that restarts marks the jobs it was running as failed and removes their
leftovers; the data directory's lock (datalock.py) guarantees those jobs' server is gone. Only
its own jobs: another server on the same database (another data directory) keeps running its.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import queue
import re
import shutil
import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException

from accuracy.server.db import Job, Report, Run, utcnow
from accuracy.server.errors import ApiError, scrub
from accuracy.server.storage import Storage, new_id

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
FORMATS = ("json", "csv", "html", "xlsx")
PR_SET_PDEATHSIG = 1
_ID = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_MAX_QUEUED_JOBS = 8
RETRY_AFTER_S = 30


MAX_ERROR_CHARS = 2000


def job_error(e: BaseException, *paths: str | Path) -> str:
    """What a client reads of a job's failure: one line, server paths scrubbed. A database
    error says only that (its text holds the SQL and the row's values: the server log has
    them)."""
    if isinstance(e, SQLAlchemyError):
        return ("the server's database refused to store the result "
                f"({type(getattr(e, 'orig', None) or e).__name__}); see the server log")
    text = " ".join(scrub(f"{type(e).__name__}: {e}", *paths).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


class QueueFull(HTTPException):
    """429 with Retry-After: more jobs wait than the server keeps (--max-queued-jobs)."""

    def __init__(self, limit: int) -> None:
        super().__init__(429, f"{limit} compare jobs are already waiting; retry later (this "
                              "server's --max-queued-jobs)",
                         headers={"Retry-After": str(RETRY_AFTER_S)})


def _die_with_parent(parent_pid: int) -> None:
    """In the child: own process group, and exit as soon as the server is gone."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog below does it, within a second
        pass
    if os.getppid() != parent_pid:  # the server died before prctl took effect
        os._exit(1)

    def watchdog() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watchdog, daemon=True, name="parent-watchdog").start()


def compare_available() -> bool:
    try:
        from accuracy.compare import compare, load_report  # noqa: F401
    except ImportError:
        return False
    return True


def _child(my: str, golden: str, out_dir: str, replay_out: str | None,
           events: Any, parent_pid: int, cluster: str | None = None) -> None:
    """Runs in the child process: replay, compare, write the report; reports stages.
    With `cluster` (a scheduler address) replay and compare run their batches there."""
    _die_with_parent(parent_pid)
    where = " on the cluster" if cluster else ""
    try:
        replay_path = None
        if replay_out:
            events.put(("stage", 0.1, f"replaying the device run on cpu{where}"))
            if cluster:
                from accuracy.replay import replay_on_cluster

                replay_on_cluster(my, replay_out, cluster=cluster, on="cpu")
            else:
                from accuracy.dumpfile import load_dump
                from accuracy.replay import replay

                with load_dump(my) as d:
                    replay(d, replay_out, on="cpu")
            replay_path = replay_out
        events.put(("stage", 0.4 if replay_out else 0.1, f"comparing{where}"))
        if cluster:
            from accuracy.compare import compare_on_cluster

            report = compare_on_cluster(my, golden, replay_path, cluster=cluster)
        else:
            from accuracy.compare import compare

            report = compare(my, golden, replay_path)
        events.put(("stage", 0.8, "writing the report"))
        report.write(out_dir, formats=FORMATS)
        events.put(("done", 0.9, "written"))
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent as a message
        logging.getLogger(__name__).debug("compare job failed:\n%s", traceback.format_exc())
        events.put(("error", 0.0, job_error(e, my, golden, out_dir)))


class JobManager:
    """Starts, tracks and cancels compare jobs for one app.

    cluster: a Dask scheduler address (jobcluster.JobCluster) the jobs' children run on."""

    def __init__(self, storage: Storage, rows: Any, *, cluster: str | None = None,
                 max_queued: int = DEFAULT_MAX_QUEUED_JOBS) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, not {max_queued}")
        self.storage = storage
        self.max_queued = max_queued
        self._waiting = 0  # jobs submitted whose run has not begun
        self._lock = threading.Lock()
        self.rows = rows  # RowIndex, to index finished reports
        self.cluster = cluster
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compare-job")
        self._cancel: dict[str, threading.Event] = {}
        self._ctx = mp.get_context("spawn")
        self._fail_orphans()

    def _fail_orphans(self) -> None:
        with self.storage.Session.begin() as ses:
            n = ses.execute(
                update(Job).where(Job.status.in_(ACTIVE), Job.data_dir == self.storage.owner)
                .values(
                    status="failed", updated=utcnow(),
                    error="the server restarted while this job was queued or running")
            ).rowcount
        if n:
            log.warning("marked %d interrupted job(s) failed", n)
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Report directories and replay dumps of jobs whose server died before indexing them
        (the data lock guarantees no live server is still writing them)."""
        with self.storage.Session() as ses:
            reports = set(ses.scalars(select(Report.id)))
            reports |= {Path(d).name for d in ses.scalars(select(Report.dir)) if d}
            runs = {Path(p).name for p in ses.scalars(select(Run.path))}
        for p in (self.storage.data_dir / "reports").iterdir():
            if _ID.match(p.name) and p.name not in reports and p.is_dir():
                log.warning("removing the report directory of an interrupted job: %s", p.name)
                shutil.rmtree(p, ignore_errors=True)
        for p in (self.storage.data_dir / "runs").glob("*.h5"):
            if _ID.match(p.stem) and p.name not in runs and p.is_file():
                log.warning("removing the replay dump of an interrupted job: %s", p.name)
                p.unlink(missing_ok=True)

    def _set(self, job_id: str, *, only_if: tuple[str, ...] = ACTIVE, **values: Any) -> bool:
        """Update a job still in one of `only_if`; a finished job is never rewritten (so a job
        marked failed can never later read done). False when nothing was updated."""
        values["updated"] = utcnow()
        with self.storage.Session.begin() as ses:
            n = ses.execute(update(Job).where(Job.id == job_id, Job.status.in_(only_if),
                                              Job.data_dir == self.storage.owner)
                            .values(**values)).rowcount
        return bool(n)

    def start(self, my_run_id: str, golden_run_id: str, *, replay: bool = False) -> Job:
        if not compare_available():
            raise ApiError(503, "the compare engine (accuracy.compare) is not installed")
        self.storage.run(my_run_id)
        self.storage.run(golden_run_id)
        with self._lock:
            if self._waiting >= self.max_queued:
                raise QueueFull(self.max_queued)
            self._waiting += 1
        job = Job(id=new_id(), my_run_id=my_run_id, golden_run_id=golden_run_id, replay=replay,
                  stage="queued", data_dir=self.storage.owner)
        try:
            with self.storage.Session.begin() as ses:
                ses.add(job)
            self._cancel[job.id] = threading.Event()
            self._pool.submit(self._run, job.id)
        except BaseException:
            with self._lock:
                self._waiting -= 1
            raise
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.storage.job(job_id)
        if job.status not in ACTIVE:
            raise ApiError(409, f"job is {job.status}; only queued or running jobs can be "
                                "cancelled")
        ev = self._cancel.get(job_id)
        if ev is None:  # queued in a previous server life; nothing runs it
            self._set(job_id, status="cancelled", stage="cancelled")
        else:
            ev.set()
            if job.status == "queued":
                self._set(job_id, only_if=("queued",), status="cancelled", stage="cancelled")
        return self.storage.job(job_id)

    def _run(self, job_id: str) -> None:
        with self._lock:
            self._waiting -= 1
        ev = self._cancel.get(job_id) or threading.Event()
        try:
            job = self.storage.job(job_id)
            if ev.is_set() or job.status != "queued":
                return
            self._execute(job, ev)
        except ApiError as e:
            self._set(job_id, status="failed", error=e.message, stage="failed")
        except Exception as e:  # noqa: BLE001 - a job's failure is recorded, not raised
            log.exception("job %s failed", job_id)  # the whole error, SQL included: the log
            self._set(job_id, status="failed", stage="failed",
                      error=job_error(e, self.storage.data_dir))
        finally:
            self._cancel.pop(job_id, None)

    def _execute(self, job: Job, ev: threading.Event) -> None:
        my, golden = self.storage.run(job.my_run_id), self.storage.run(job.golden_run_id)
        rid = new_id()
        out_dir = self.storage.data_dir / "reports" / rid
        replay_out = (self.storage.data_dir / "runs" / f"{new_id()}.h5") if job.replay else None
        if not self._set(job.id, only_if=("queued",), status="running", progress=0.02,
                         stage="starting"):
            return  # cancelled meanwhile
        finished = False
        try:
            finished = self._supervise(job, ev, my, golden, rid, out_dir, replay_out)
        finally:
            if not finished:  # failed, cancelled, killed, or the server is stopping
                _remove_outputs(out_dir, replay_out)

    def _supervise(self, job: Job, ev: threading.Event, my: Any, golden: Any, rid: str,
                   out_dir: Path, replay_out: Path | None) -> bool:
        """Run the child to its end; True once its report is indexed."""
        from accuracy.compare import load_report
        from accuracy.server.reportindex import index_report

        events = self._ctx.Queue()
        proc = self._ctx.Process(
            target=_child, daemon=True,
            args=(my.path, golden.path, str(out_dir), str(replay_out) if replay_out else None,
                  events, os.getpid(), self.cluster))
        proc.start()
        result: tuple[str, float, str] | None = None
        while True:
            if ev.is_set():
                _stop(proc)
                _remove_outputs(out_dir, replay_out)  # gone before anyone reads "cancelled"
                self._set(job.id, status="cancelled", stage="cancelled")
                return False
            try:
                kind, progress, msg = events.get(timeout=0.2)
            except queue.Empty:
                if not proc.is_alive():
                    try:
                        kind, progress, msg = events.get(timeout=0.5)
                    except queue.Empty:
                        break
                else:
                    continue
            if kind == "stage":
                self._set(job.id, only_if=("running",), progress=progress, stage=msg)
            else:
                result = (kind, progress, msg)
                break
        proc.join(30)
        if proc.is_alive():
            _stop(proc)
        if result is None or result[0] != "done":
            why = result[2] if result else f"the compare process exited with code {proc.exitcode}"
            _remove_outputs(out_dir, replay_out)  # gone before anyone reads "failed"
            self._set(job.id, status="failed", stage="failed", error=why)
            return False
        self._set(job.id, only_if=("running",), progress=0.9, stage="indexing the report")
        replay_run_id = None
        if replay_out and replay_out.exists():
            replay_run_id = self.storage.adopt_file(replay_out, f"replay of {my.name}").id
        data = load_report(out_dir)
        rep = index_report(
            self.storage, data.get("summary", {}), list(data.get("rows", [])),
            name=f"{my.name} vs {golden.name}", report_dir=str(out_dir), my_run_id=my.id,
            golden_run_id=golden.id, replay_run_id=replay_run_id, report_id=rid,
            rows_index=self.rows)
        self._set(job.id, only_if=("running",), status="done", progress=1.0, stage="done",
                  report_id=rep.id, error=None)
        return True

    def shutdown(self) -> None:
        for ev in self._cancel.values():
            ev.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _stop(proc: Any) -> None:
    """Terminate the child and its process group (anything it started), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        proc.terminate()
    proc.join(10)
    if proc.is_alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.join(10)


def _remove_outputs(out_dir: Path, replay_out: Path | None) -> None:
    """A job's half-written files: its report directory, its replay dump and that dump's
    `.partial` siblings."""
    shutil.rmtree(out_dir, ignore_errors=True)
    if replay_out is not None:
        for p in replay_out.parent.glob(f"{replay_out.name}*"):
            p.unlink(missing_ok=True)
