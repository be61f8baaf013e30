"""Ops of a run and their tensors: statistics, histograms, downsampled values."""
# ruff: noqa: B008 - FastAPI's Depends/Query defaults are the documented idiom

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from accuracy.patterns import module_matches, op_matches
from accuracy.server.boundedread import TensorSource, ViewLimits, downsample_of, histogram_of
from accuracy.server.deps import get_storage, get_view_limits, require_read
from accuracy.server.errors import ApiError
from accuracy.server.routers._common import tensor_at
from accuracy.server.schemas import HistogramOut, OpOut, Page, TensorOut, ValuesOut
from accuracy.server.storage import Storage

router = APIRouter(prefix="/api/runs/{run_id}", tags=["ops"],
                   dependencies=[Depends(require_read)])


@router.get("/ops", response_model=Page[OpOut])
def list_ops(
    run_id: str,
    op: str | None = Query(None, description="op name or glob: aten.mm, 'aten.*norm*'"),
    module: str | None = Query(None, description="module path or glob"),
    phase: str | None = Query(None, pattern="^(forward|backward|optimizer)$"),
    dtype: str | None = Query(None, description="only ops with a tensor of this dtype"),
    offset: int = Query(0, ge=0),
    limit: int = Query(100, ge=1, le=1000),
    storage: Storage = Depends(get_storage),
) -> Page[OpOut]:
    d = storage.dump(run_id)
    hits = [r for r in d.records
            if (not op or op_matches(op, r.op)) and (not module or module_matches(module, r.module))
            and (not phase or r.phase == phase)
            and (not dtype or any(t.dtype == dtype for t in r.tensors))]
    return Page[OpOut](total=len(hits), offset=offset, limit=limit,
                       items=[OpOut.of(r) for r in hits[offset:offset + limit]])


@router.get("/ops/{seq}", response_model=OpOut)
def get_op(run_id: str, seq: int, storage: Storage = Depends(get_storage)) -> OpOut:
    d = storage.dump(run_id)
    try:
        return OpOut.of(d.record(seq))
    except KeyError:
        raise ApiError(404, f"no op with sequence number {seq} in this run") from None


@router.get("/tensor", response_model=TensorOut)
def get_tensor(run_id: str, address: str = Query(..., examples=["/aten.mm.default/17/output/0"]),
               storage: Storage = Depends(get_storage)) -> TensorOut:
    return TensorOut.of(tensor_at(storage.dump(run_id), address))


@router.get("/tensor/histogram", response_model=HistogramOut)
def tensor_histogram(run_id: str, address: str, bins: int = Query(64, ge=1, le=1024),
                     storage: Storage = Depends(get_storage),
                     limits: ViewLimits = Depends(get_view_limits)) -> HistogramOut:
    """Computed under the server's view memory budget (large tensors are streamed)."""
    d = storage.dump(run_id)
    src = TensorSource(d, tensor_at(d, address), limits)
    return HistogramOut(**histogram_of([src], bins), labels=[address])


@router.get("/tensor/values", response_model=ValuesOut)
def tensor_values(run_id: str, address: str,
                  max_points: int = Query(2048, ge=1, le=100_000),
                  storage: Storage = Depends(get_storage),
                  limits: ViewLimits = Depends(get_view_limits)) -> ValuesOut:
    """Computed under the server's view memory budget (large tensors are streamed)."""
    d = storage.dump(run_id)
    src = TensorSource(d, tensor_at(d, address), limits)
    return ValuesOut(address=address, **downsample_of(src, max_points))
