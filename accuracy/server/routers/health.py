"""Liveness and what this server can do."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy import func, select

from accuracy import __version__
from accuracy.server.db import Report, Run
from accuracy.server.deps import Services, services
from accuracy.server.jobs import compare_available
from accuracy.server.schemas import HealthOut

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health", response_model=HealthOut)
def health(svc: Services = Depends(services)) -> HealthOut:
    """Always open (no token), so load balancers and scripts can probe it."""
    with svc.storage.Session() as ses:
        mine = svc.storage.owner
        runs = ses.scalar(select(func.count()).select_from(Run)
                          .where(Run.data_dir == mine)) or 0
        reports = ses.scalar(select(func.count()).select_from(Report)
                             .where(Report.data_dir == mine)) or 0
    return HealthOut(status="ok", version=__version__, runs=runs, reports=reports,
                     compare_available=compare_available(), auth=svc.token is not None)
