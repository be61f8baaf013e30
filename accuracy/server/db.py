"""The index of runs, reports, report rows and jobs (SQLAlchemy; SQLite file by default).

Files stay the source of truth; the index keeps a report's rows so the server can load a
report's filter and sort columns at once (reportindex.ReportColumns) and read a page's rows by
primary key. Only the WAL pragma below knows about SQLite.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
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


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(16))  # upload | register
    path: Mapped[str] = mapped_column(Text)  # absolute; never shown to clients
    created: Mapped[str] = mapped_column(String(40), default=utcnow)
    ops: Mapped[int] = mapped_column(Integer, default=0)
    backend: Mapped[str | None] = mapped_column(String(40), nullable=True)
    profile: Mapped[str | None] = mapped_column(String(80), nullable=True)
    complete: Mapped[bool] = mapped_column(default=False)
    file_bytes: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[str] = mapped_column(Text, default="{}")  # JSON, paths removed


class Report(Base):
    __tablename__ = "reports"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    my_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    golden_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    replay_run_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created: Mapped[str] = mapped_column(String(40), default=utcnow)
    n_rows: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[str] = mapped_column(Text, default="{}")


class ReportRow(Base):
    __tablename__ = "report_rows"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    report_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("reports.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    op: Mapped[str] = mapped_column(String(200), default="")
    phase: Mapped[str] = mapped_column(String(16), default="")
    module: Mapped[str] = mapped_column(Text, default="")
    # the module path without its root class name (what users type: encoder.layers.0)
    module_tail: Mapped[str] = mapped_column(Text, default="")
    verdict: Mapped[str] = mapped_column(String(16), default="")
    dtype_my: Mapped[str] = mapped_column(String(32), default="")
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
    stage: Mapped[str] = mapped_column(String(200), default="")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    my_run_id: Mapped[str] = mapped_column(String(32))
    golden_run_id: Mapped[str] = mapped_column(String(32))
    replay: Mapped[bool] = mapped_column(default=False)
    report_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created: Mapped[str] = mapped_column(String(40), default=utcnow)
    updated: Mapped[str] = mapped_column(String(40), default=utcnow)


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
    Base.metadata.create_all(engine)
    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
