"""The index of runs, reports, report rows and jobs (SQLAlchemy; SQLite file by default).

Runs, reports and jobs carry the data directory of the server that owns them (`data_dir`), so
several servers with their own data directories can share one database: each sees, serves and
recovers only its own rows (Storage does the filtering).

Files stay the source of truth; the index keeps a report's rows so the server can load a
report's filter and sort columns at once (reportindex.ReportColumns) and read a page's rows by
primary key. Only the WAL pragma below knows about SQLite.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

# Metric columns a report table can be sorted by; the full row lives in ReportRow.data.
METRIC_COLUMNS = (
    "cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "local_error_ratio",
)


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Base(DeclarativeBase):
    pass


# Tables whose rows belong to one data directory (report rows follow their report).
OWNED_TABLES = ("runs", "reports", "jobs")
# Columns holding text a dump or a client gives (names, op, phase, dtype...): TEXT, whatever
# its length (PostgreSQL refuses a longer value for a VARCHAR(n) and fails the whole job;
# SQLite never checked). Databases made when they were VARCHAR(n) are widened at startup.
TEXT_COLUMNS = {"runs": ("name", "backend", "profile"), "reports": ("name",),
                "report_rows": ("op", "phase", "verdict", "dtype_my"), "jobs": ("stage",)}


def _owner_column() -> Mapped[str | None]:
    """The resolved data directory of the server that owns the row; NULL only in a database
    written before ownership existed, until a server adopts it (adopt_legacy_rows)."""
    return mapped_column(Text, nullable=True, index=True)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(16))  # upload | register
    path: Mapped[str] = mapped_column(Text)  # absolute; never shown to clients
    created: Mapped[str] = mapped_column(String(40), default=utcnow)
    ops: Mapped[int] = mapped_column(Integer, default=0)
    backend: Mapped[str | None] = mapped_column(Text, nullable=True)
    profile: Mapped[str | None] = mapped_column(Text, nullable=True)
    complete: Mapped[bool] = mapped_column(default=False)
    file_bytes: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[str] = mapped_column(Text, default="{}")  # JSON, paths removed
    data_dir: Mapped[str | None] = _owner_column()


class Report(Base):
    __tablename__ = "reports"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    my_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    golden_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    replay_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created: Mapped[str] = mapped_column(String(40), default=utcnow)
    n_rows: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[str] = mapped_column(Text, default="{}")
    data_dir: Mapped[str | None] = _owner_column()


class ReportRow(Base):
    __tablename__ = "report_rows"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    report_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("reports.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    op: Mapped[str] = mapped_column(Text, default="")
    phase: Mapped[str] = mapped_column(Text, default="")
    module: Mapped[str] = mapped_column(Text, default="")
    # the module path without its root class name (what users type: encoder.layers.0)
    module_tail: Mapped[str] = mapped_column(Text, default="")
    verdict: Mapped[str] = mapped_column(Text, default="")
    dtype_my: Mapped[str] = mapped_column(Text, default="")
    cosine: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_abs_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_rel_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    mean_abs_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    rmse: Mapped[float | None] = mapped_column(Float, nullable=True)
    local_error_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)

    # Narrow rows (the full JSON lives in ReportRowData), read once per report in idx order.
    # Filters and sorts run in memory (reportindex), so one index serves: the per-column
    # indexes earlier versions created (ix_rows_report_<col>) are unused and cost indexing time.
    __table_args__ = (
        Index("ix_rows_report_idx", "report_id", "idx", unique=True),
    )


class ReportRowData(Base):
    """The full row as JSON, read only for the rows of the page being served."""

    __tablename__ = "report_row_data"

    report_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("reports.id", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[str] = mapped_column(Text)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="compare")
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    stage: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    my_run_id: Mapped[str] = mapped_column(String(32))
    golden_run_id: Mapped[str] = mapped_column(String(32))
    replay: Mapped[bool] = mapped_column(default=False)
    report_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created: Mapped[str] = mapped_column(String(40), default=utcnow)
    updated: Mapped[str] = mapped_column(String(40), default=utcnow)
    data_dir: Mapped[str | None] = _owner_column()


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - DB-API connection
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """Create the engine and the tables; WAL lets readers page while a job indexes a report."""
    kwargs: dict = {}
    if url.startswith(("postgresql://", "postgres://")):  # the driver the 'server' extra ships
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    _create_schema(engine)
    return engine


# pg_advisory_xact_lock key held while a server creates or migrates the schema ("accuracy")
_SCHEMA_LOCK = 0x6163637572616379


def _create_schema(engine: Engine) -> None:
    """Create the tables, then migrate a database written before ownership: add `data_dir`
    (and its index) to runs, reports and jobs. Idempotent; servers starting at once on one
    database take turns (concurrent CREATE TABLEs collide): an advisory lock on PostgreSQL, a
    flock on the SQLite file (SQLite's own locks are fcntl locks, which flock leaves alone)."""
    with _sqlite_file_lock(engine), engine.begin() as con:
        if engine.dialect.name == "postgresql":
            con.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        Base.metadata.create_all(con)
        for table in OWNED_TABLES:
            if "data_dir" in {c["name"] for c in inspect(con).get_columns(table)}:
                continue
            con.execute(text(f"ALTER TABLE {table} ADD COLUMN data_dir TEXT"))
            con.execute(text(f"CREATE INDEX IF NOT EXISTS ix_{table}_data_dir "
                             f"ON {table} (data_dir)"))
        if engine.dialect.name == "postgresql":
            _widen_text_columns(con)


def _widen_text_columns(con: Any) -> None:
    """VARCHAR(n) columns of TEXT_COLUMNS (a database made by an older server) become TEXT:
    on PostgreSQL a change from VARCHAR to TEXT rewrites nothing."""
    for table, columns in TEXT_COLUMNS.items():
        lengths = {c["name"]: getattr(c["type"], "length", None)
                   for c in inspect(con).get_columns(table)}
        for column in columns:
            if lengths.get(column) is not None:
                con.execute(text(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT"))


@contextlib.contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:" or path.startswith("file:"):
        yield
        return
    # Created and locked before any connection opens: a connection's first act is switching the
    # file to WAL, and SQLite answers concurrent switches with "database is locked" at once,
    # without waiting out the busy timeout (seen under load with four servers starting).
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def adopt_legacy_rows(engine: Engine, owner: str) -> int:
    """Give the rows of a database written before ownership (data_dir NULL) to `owner`, the
    first server that starts on it: such a database served one data directory."""
    n = 0
    with engine.begin() as con:
        for table in OWNED_TABLES:
            n += con.execute(text(f"UPDATE {table} SET data_dir = :o WHERE data_dir IS NULL"),
                             {"o": owner}).rowcount or 0
    return n


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
