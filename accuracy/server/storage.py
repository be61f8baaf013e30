"""Where runs live: the data directory, the index, path rules and a cache of open dumps.

Uploaded dumps are stored as `runs/<id>.h5` (the client's file name is only a label);
registered dumps stay where they are but must resolve inside an allowed root.

Every run, report and job row is owned by the data directory of the server that made it
(`owner`); lookups and lists here see only this server's rows, so servers with their own data
directories can share one database.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.orm import sessionmaker

from accuracy.dumpfile import Dump, DumpError, load_dump
from accuracy.jsonsafe import jsonable
from accuracy.lru import BoundedLRU
from accuracy.server.db import (
    Job,
    Report,
    ReportRow,
    ReportRowData,
    Run,
    adopt_legacy_rows,
    make_engine,
    make_sessionmaker,
)
from accuracy.server.errors import ApiError, not_found, scrub
from accuracy.server.isolated import dump_summary

log = logging.getLogger(__name__)

DEFAULT_MAX_UPLOAD = 4 * 1024**3
_OPEN_DUMPS = 8
MAX_PATH_CHARS = 4096


def new_id() -> str:
    return uuid.uuid4().hex


def clean_label(name: str | None, default: str) -> str:
    """A display label from a client; path-like names are refused rather than trusted."""
    if not name:
        return default
    name = name.strip()
    if "/" in name or "\\" in name or ".." in name or "\x00" in name:
        raise ApiError(400, "name must be a plain file name: no '/', '\\' or '..'")
    if len(name) > 200:
        raise ApiError(400, "name is longer than 200 characters")
    return name


class Storage:
    """The data directory and its index; one per app."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        db_url: str | None = None,
        allowed_roots: Iterable[str | os.PathLike[str]] | None = None,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        for sub in ("runs", "reports", "tmp"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        self.db_url = db_url or f"sqlite:///{self.data_dir / 'index.sqlite'}"
        self.engine = make_engine(self.db_url)
        self.Session: sessionmaker = make_sessionmaker(self.engine)
        self.owner = str(self.data_dir)  # the key of this server's rows in a shared database
        if n := adopt_legacy_rows(self.engine, self.owner):
            log.info("adopted %d row(s) written before data directories owned rows", n)
        roots = list(allowed_roots) if allowed_roots else [self.data_dir]
        self.allowed_roots = [Path(r).resolve() for r in roots]
        self.max_upload_bytes = int(max_upload_bytes)
        self._dumps: BoundedLRU[str, Dump] = BoundedLRU(
            _OPEN_DUMPS, on_evict=lambda _run_id, old: old.close())
        self._lock = threading.Lock()
        self._clear_tmp()

    def _clear_tmp(self) -> None:
        """Remove what a server that died left half-written (the data lock says none runs)."""
        for p in (self.data_dir / "tmp").iterdir():
            if p.is_file():
                p.unlink(missing_ok=True)
        for p in (self.data_dir / "runs").glob("*.partial*"):  # a replay cut short
            if p.is_file():
                p.unlink(missing_ok=True)

    # -- paths -----------------------------------------------------------------------------

    def tmp_path(self) -> Path:
        return self.data_dir / "tmp" / f"{new_id()}.part"

    def allowed_path(self, raw: str, *, kind: str = "file") -> Path:
        """Resolve a client path; refuse it unless it lies inside an allowed root."""
        if not raw or "\x00" in raw:
            raise ApiError(400, "path is empty or invalid")
        if len(raw) > MAX_PATH_CHARS:
            raise ApiError(400, f"path is longer than {MAX_PATH_CHARS} characters")
        try:
            p = Path(raw).expanduser().resolve(strict=False)
        except (OSError, RuntimeError, ValueError):
            raise ApiError(400, "path cannot be resolved") from None
        if not any(p == r or p.is_relative_to(r) for r in self.allowed_roots):
            raise ApiError(403, "path is outside the allowed roots of this server")
        try:
            missing = not (p.exists() if kind == "file" else p.is_dir())  # a FIFO: 422 later
        except OSError:  # a name too long for the file system, a loop, no permission...
            raise ApiError(400, "path cannot be resolved") from None
        if missing:
            raise ApiError(404, f"no such {'file' if kind == 'file' else 'directory'} under "
                                "the allowed roots")
        return p

    # -- runs ------------------------------------------------------------------------------

    def _index_run(self, path: Path, name: str, source: str, run_id: str) -> Run:
        try:
            s = dump_summary(path)  # in a child with a time limit: see isolated.py
        except DumpError as e:
            raise ApiError(422, f"not a valid accuracy dump: {scrub(str(e), path)}") from None
        s.pop("path", None)
        attrs = s.get("attrs", {})
        run = Run(
            id=run_id, name=name, source=source, path=str(path), ops=int(s.get("ops", 0)),
            backend=str(attrs.get("backend") or "") or None,
            profile=str(attrs.get("profile") or "") or None,
            complete=bool(s.get("complete")), file_bytes=int(s.get("file_bytes", 0)),
            summary=json.dumps(jsonable(s)), data_dir=self.owner,
        )
        with self.Session.begin() as ses:
            ses.add(run)
        log.info("indexed run %s (%s, %d ops)", run_id, name, run.ops)
        return run

    def add_uploaded(self, tmp: Path, name: str) -> Run:
        """Validate an upload already streamed to `tmp`, then move it into runs/."""
        run_id = new_id()
        final = self.data_dir / "runs" / f"{run_id}.h5"
        try:
            try:
                dump_summary(tmp)
            except DumpError as e:
                raise ApiError(422, f"not a valid accuracy dump: {scrub(str(e), tmp)}") from None
            os.replace(tmp, final)
            os.chmod(final, 0o444)
            return self._index_run(final, name, "upload", run_id)
        except BaseException:
            tmp.unlink(missing_ok=True)
            if final.exists():
                final.chmod(0o644)
                final.unlink(missing_ok=True)
            raise

    def adopt_file(self, path: Path, name: str) -> Run:
        """Index a dump the server itself wrote under runs/ (a replay)."""
        run_id = path.stem if len(path.stem) == 32 else new_id()
        return self._index_run(path, name, "upload", run_id)

    def register(self, raw_path: str, name: str | None) -> Run:
        p = self.allowed_path(raw_path, kind="file")
        return self._index_run(p, clean_label(name, p.name), "register", new_id())

    def runs(self) -> list[Run]:
        with self.Session() as ses:
            return list(ses.scalars(select(Run).where(Run.data_dir == self.owner)
                                    .order_by(Run.created.desc(), Run.name)))

    def owns(self, row: Run | Report | Job | None) -> bool:
        """A row of this server's data directory (another server's rows are not found here)."""
        return row is not None and row.data_dir == self.owner

    def run(self, run_id: str) -> Run:
        with self.Session() as ses:
            run = ses.get(Run, run_id)
        if not self.owns(run):
            raise not_found(f"run {run_id!r}")
        return run

    def delete_run(self, run_id: str) -> None:
        run = self.run(run_id)
        with self._lock:
            d = self._dumps.pop(run_id, None)
            if d is not None:
                d.close()
        with self.Session.begin() as ses:
            ses.execute(delete(Run).where(Run.id == run_id, Run.data_dir == self.owner))
        if run.source == "upload":
            p = Path(run.path)
            if p.is_relative_to(self.data_dir / "runs"):
                p.chmod(0o644)
                p.unlink(missing_ok=True)

    def dump(self, run_id: str) -> Dump:
        """The run's dump, opened read-only and kept open for the next request."""
        with self._lock:
            d = self._dumps.get(run_id)
            if d is not None:
                return d
        run = self.run(run_id)
        try:
            # an uploaded file sits in runs/ under an id, beside other users' runs: the
            # dump its replayed_from names is never looked for there
            d = load_dump(run.path, sources=run.source != "upload")
            d.records  # noqa: B018 - build the op table once, under no request's deadline
        except DumpError as e:
            raise ApiError(410, f"the run's dump can no longer be read: "
                                f"{scrub(str(e), run.path)}") from None
        with self._lock:
            self._dumps.put(run_id, d)
        return d

    # -- reports ---------------------------------------------------------------------------

    def report(self, report_id: str) -> Report:
        with self.Session() as ses:
            rep = ses.get(Report, report_id)
        if not self.owns(rep):
            raise not_found(f"report {report_id!r}")
        return rep

    def reports(self) -> list[Report]:
        with self.Session() as ses:
            return list(ses.scalars(select(Report).where(Report.data_dir == self.owner)
                                    .order_by(Report.created.desc())))

    def delete_report(self, report_id: str) -> None:
        self.report(report_id)
        with self.Session.begin() as ses:
            ses.execute(delete(ReportRow).where(ReportRow.report_id == report_id))
            ses.execute(delete(ReportRowData).where(ReportRowData.report_id == report_id))
            ses.execute(delete(Report).where(Report.id == report_id))

    # -- jobs ------------------------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        with self.Session() as ses:
            job = ses.get(Job, job_id)
        if not self.owns(job):
            raise not_found(f"job {job_id!r}")
        return job

    def jobs(self, limit: int | None = None) -> list[Job]:
        """This server's jobs, newest first."""
        stmt = select(Job).where(Job.data_dir == self.owner).order_by(Job.created.desc())
        with self.Session() as ses:
            return list(ses.scalars(stmt.limit(limit) if limit else stmt))

    def close(self) -> None:
        with self._lock:
            for d in self._dumps.values():
                d.close()
            self._dumps.clear()
        self.engine.dispose()
