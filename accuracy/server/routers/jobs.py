"""Compare jobs: start (with optional replay), list, status and progress, cancel."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

from fastapi import APIRouter, Depends

from accuracy.server.deps import get_jobs, get_storage, require_read, require_write
from accuracy.server.jobs import JobManager
from accuracy.server.schemas import JobIn, JobOut
from accuracy.server.storage import Storage

router = APIRouter(prefix="/api/jobs", tags=["jobs"])


@router.post("", response_model=JobOut, status_code=202, dependencies=[Depends(require_write)])
def start_job(body: JobIn, jobs: JobManager = Depends(get_jobs)) -> JobOut:
    """Queue a compare of two runs; poll GET /api/jobs/{id} for progress and the report id."""
    return JobOut.of(jobs.start(body.my_run_id, body.golden_run_id, replay=body.replay))


@router.get("", response_model=list[JobOut], dependencies=[Depends(require_read)])
def list_jobs(storage: Storage = Depends(get_storage)) -> list[JobOut]:
    return [JobOut.of(j) for j in storage.jobs()]


@router.get("/{job_id}", response_model=JobOut, dependencies=[Depends(require_read)])
def get_job(job_id: str, storage: Storage = Depends(get_storage)) -> JobOut:
    return JobOut.of(storage.job(job_id))


@router.post("/{job_id}/cancel", response_model=JobOut, dependencies=[Depends(require_write)])
def cancel_job(job_id: str, jobs: JobManager = Depends(get_jobs)) -> JobOut:
    """Stop a queued or running job (a running one's process is terminated)."""
    return JobOut.of(jobs.cancel(job_id))
