"""The app factory: storage, services, routers, error handlers, static files."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from accuracy import __version__
from accuracy.server.boundedread import DEFAULT_VIEW_MEMORY, ViewLimits
from accuracy.server.datalock import DataDirLock
from accuracy.server.deps import Services
from accuracy.server.errors import install_handlers
from accuracy.server.fastrows import RowsFastLane
from accuracy.server.guard import (
    DEFAULT_MAX_JSON_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    LOOPBACK_HOSTS,
    RequestGuard,
)
from accuracy.server.jobs import DEFAULT_MAX_QUEUED_JOBS, JobManager
from accuracy.server.reportindex import RowIndex
from accuracy.server.routers import health, jobs, ops, reports, runs, ui
from accuracy.server.routers import monitor as monitor_router
from accuracy.server.storage import DEFAULT_MAX_UPLOAD, Storage

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


def create_app(
    data_dir: str | os.PathLike[str],
    *,
    token: str | None = None,
    db_url: str | None = None,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD,
    allowed_roots: Iterable[str | os.PathLike[str]] | None = None,
    protect_reads: bool = False,
    allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    view_memory_bytes: int = DEFAULT_VIEW_MEMORY,
    cluster: str | None = None,
    max_queued_jobs: int = DEFAULT_MAX_QUEUED_JOBS,
) -> FastAPI:
    """Build the service over a data directory.

    token: when set, every write endpoint needs it (and reads too with protect_reads, which
    the CLI turns on for non-loopback hosts). allowed_roots: directories under which paths may
    be registered (default: the data directory only). allowed_hosts: Host names the server
    answers to ('*' for any). max_json_bytes: cap on every request body but uploads.
    read_timeout_s: a request body that stops arriving for this long is dropped (408).
    view_memory_bytes: the memory one tensor view (histogram, values, heat map) may use.
    cluster: "local:N" or a Dask scheduler address; compare and replay jobs run there
    (jobcluster.py; a local cluster starts here and stops with the app).
    max_queued_jobs: compare jobs that may wait; one more is refused with 429 + Retry-After.
    Raises DataDirBusy when another live server holds the data directory, ClusterError for a
    cluster that cannot be used.
    """
    lock = DataDirLock(_prepared(data_dir))
    lock.acquire()
    job_cluster = None
    try:
        if cluster:  # Dask is imported only here
            from accuracy.server.jobcluster import JobCluster

            job_cluster = JobCluster(cluster)
        storage = Storage(data_dir, db_url=db_url, allowed_roots=allowed_roots,
                          max_upload_bytes=max_upload_bytes)
        rows = RowIndex(storage)
        jobs_ = JobManager(storage, rows, cluster=job_cluster.address if job_cluster else None,
                           max_queued=max_queued_jobs)
        svc = Services(storage=storage, rows=rows, jobs=jobs_,
                       token=token or None, protect_reads=protect_reads and bool(token),
                       views=ViewLimits(view_memory_bytes))
    except BaseException:
        if job_cluster is not None:
            job_cluster.close()
        lock.release()
        raise

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        svc.jobs.shutdown()
        if job_cluster is not None:  # its client lives on its own loop: close off this one
            await run_in_threadpool(job_cluster.close)
        storage.close()
        lock.release()

    app = FastAPI(title="accuracy report service", version=__version__, lifespan=lifespan,
                  description="Runs, ops, tensors, compare jobs and reports of `accuracy`.",
                  docs_url=None, redoc_url=None)  # /docs: routers/ui.py, assets vendored
    app.state.services = svc
    app.state.data_lock = lock
    app.state.job_cluster = job_cluster
    app.state.rows_fast_lane = True
    install_handlers(app)
    app.add_middleware(RowsFastLane)  # inside the guard: added first
    app.add_middleware(RequestGuard, allowed_hosts=list(allowed_hosts),
                       max_json_bytes=max_json_bytes, read_timeout_s=read_timeout_s)
    for r in (health.router, runs.router, ops.router, jobs.router, reports.router, ui.router):
        app.include_router(r)
    app.include_router(monitor_router.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    return app


def _prepared(data_dir: str | os.PathLike[str]) -> Path:
    p = Path(data_dir).resolve()
    p.mkdir(parents=True, exist_ok=True)
    return p
