"""Pydantic models for every request and response body (they are the OpenAPI at /docs)."""

from __future__ import annotations

import json
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from accuracy.dumpfile import OpRecord, TensorRecord
from accuracy.jsonsafe import jsonable
from accuracy.server.db import Job, Report, Run

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    total: int
    offset: int
    limit: int
    items: list[T]


class RunOut(BaseModel):
    id: str
    name: str
    source: str = Field(description="upload or register")
    created: str
    ops: int
    backend: str | None
    profile: str | None
    complete: bool
    file_bytes: int
    rank: int | None = Field(None, description="the rank the dump was recorded on")
    world_size: int | None = None

    @classmethod
    def of(cls, r: Run) -> RunOut:
        rank, world = run_rank(r)
        return cls(id=r.id, name=r.name, source=r.source, created=r.created, ops=r.ops,
                   backend=r.backend, profile=r.profile, complete=r.complete,
                   file_bytes=r.file_bytes, rank=rank, world_size=world)


def run_rank(r: Run) -> tuple[int | None, int | None]:
    """(rank, world size) from the run's indexed dump attributes; None where absent."""
    try:
        attrs = json.loads(r.summary or "{}").get("attrs") or {}
        rank, world = attrs.get("rank"), attrs.get("world_size")
        return (int(rank) if isinstance(rank, int) else None,
                int(world) if isinstance(world, int) else None)
    except (ValueError, AttributeError):
        return None, None


class RunDetail(RunOut):
    summary: dict[str, Any] = Field(
        description="ops, by_phase, by_op, by_dtype, modules, attrs (backend, profile, faults)")

    @classmethod
    def of(cls, r: Run) -> RunDetail:
        return cls(**RunOut.of(r).model_dump(), summary=json.loads(r.summary))


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="a dump file inside one of the server's allowed roots")
    name: str | None = None


class TensorOut(BaseModel):
    address: str
    dtype: str
    shape: list[int]
    stride: list[int]
    device: str
    has_data: bool
    is_link: bool
    stats: dict[str, float | int | str | None]
    content_hash: str | None = Field(
        default=None, description="XXH3-64 of the stored bytes, hex (tensor dumps of schema 3)")

    @classmethod
    def of(cls, t: TensorRecord) -> TensorOut:
        return cls(address=t.address, dtype=t.dtype, shape=list(t.shape), stride=list(t.stride),
                   device=t.device, has_data=t.has_data, is_link=t.is_link,
                   stats=jsonable(t.stats),
                   content_hash=f"{t.content_hash:016x}" if t.content_hash else None)


class OpOut(BaseModel):
    seq: int
    op: str
    phase: str
    module: str
    source: str
    step: int
    extra: dict[str, Any]
    inputs: list[TensorOut]
    outputs: list[TensorOut]

    @classmethod
    def of(cls, r: OpRecord) -> OpOut:
        return cls(seq=r.seq, op=r.op, phase=r.phase, module=r.module, source=r.source,
                   step=r.step, extra=jsonable(r.extra),
                   inputs=[TensorOut.of(t) for t in r.inputs],
                   outputs=[TensorOut.of(t) for t in r.outputs])


class HistogramOut(BaseModel):
    edges: list[float]
    counts: list[list[int]] = Field(description="one list per tensor, over the same edges")
    nan: list[int]
    inf: list[int]
    numel: list[int]
    labels: list[str] = []


class ValuesOut(BaseModel):
    address: str
    numel: int
    bucket: int = Field(description="elements per point")
    index: list[int]
    min: list[float | None]
    max: list[float | None]
    mean: list[float | None]


class HeatmapOut(BaseModel):
    rows: int
    cols: int
    grid_rows: int
    grid_cols: int
    max: float
    values: list[list[float]] = Field(description="max |my - golden| per cell")


class JobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    my_run_id: str = Field(description="the device run")
    golden_run_id: str = Field(description="the reference run")
    replay: bool = Field(False, description="also replay the device run on cpu (local error)")


class JobOut(BaseModel):
    id: str
    status: str = Field(description="queued, running, done, failed or cancelled")
    progress: float
    stage: str
    error: str | None
    my_run_id: str
    golden_run_id: str
    replay: bool
    report_id: str | None
    created: str
    updated: str

    @classmethod
    def of(cls, j: Job) -> JobOut:
        return cls(id=j.id, status=j.status, progress=j.progress, stage=j.stage, error=j.error,
                   my_run_id=j.my_run_id, golden_run_id=j.golden_run_id, replay=j.replay,
                   report_id=j.report_id, created=j.created, updated=j.updated)


class ReportOut(BaseModel):
    id: str
    name: str
    created: str
    n_rows: int
    my_run_id: str | None
    golden_run_id: str | None
    replay_run_id: str | None

    @classmethod
    def of(cls, r: Report) -> ReportOut:
        return cls(id=r.id, name=r.name, created=r.created, n_rows=r.n_rows,
                   my_run_id=r.my_run_id, golden_run_id=r.golden_run_id,
                   replay_run_id=r.replay_run_id)


class ReportDetail(ReportOut):
    summary: dict[str, Any] = Field(description="counts, culprit, first_divergence, suspects")

    @classmethod
    def of(cls, r: Report) -> ReportDetail:
        return cls(**ReportOut.of(r).model_dump(), summary=json.loads(r.summary))


class ReportRegisterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="a report directory written by `accuracy compare -o`")
    name: str | None = None
    my_run_id: str | None = None
    golden_run_id: str | None = None


class RowDetail(BaseModel):
    row: dict[str, Any]
    my: TensorOut | None = None
    golden: TensorOut | None = None
    replay: TensorOut | None = None


class SeriesOut(BaseModel):
    metric: str
    bucket: int = Field(description="rows per point (each point is its bucket's worst row)")
    idx: list[int]
    value: list[float | None]
    verdict: list[str]
    phase: list[str]
    op: list[str]


class HealthOut(BaseModel):
    status: str
    version: str
    runs: int
    reports: int
    compare_available: bool
    auth: bool = Field(description="whether write endpoints need the token")
