"""Compare's pair batches on a Dask cluster: the same pure batch function, run by workers.

`compare(..., runner=DaskRunner(client))` hands the batches of tensor pairs (about 32 MB each,
built by `compare.api`) to the workers and takes the metric dicts back in batch order, so the
report is the one a local run makes, row for row. Each worker keeps its dump files open
across tasks (`engine.worker_run`) and runs with single-threaded BLAS.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from accuracy.cluster import RETRIES, map_in_order, tune_worker_malloc
from accuracy.compare.engine import BlobReader, TensorRef, compare_refs

Batch = list[tuple[TensorRef, TensorRef]]
_LOCK = threading.Lock()
_READER: dict[str, Any] = {"reader": None, "files": {}}


def _signature(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _reader_for(batch: Batch) -> BlobReader:
    """The worker's open files, reopened when a dump at the same path was replaced (a
    long-lived cluster outlives many dumps written to the same names)."""
    files = {r.path: _signature(r.path) for pair in batch for r in pair}
    with _LOCK:
        known = _READER["files"]
        if _READER["reader"] is None or any(known.get(p, s) != s for p, s in files.items()):
            if _READER["reader"] is not None:
                _READER["reader"].close()
            _READER["reader"], _READER["files"] = BlobReader(), {}
        _READER["files"].update(files)
        return _READER["reader"]


def run_batch(batch: Batch, algorithms: tuple[str, ...]) -> list[dict[str, Any]]:
    """A Dask task: metrics of one batch of pairs (files stay open between tasks)."""
    from accuracy.compare.blas import single_threaded_blas

    tune_worker_malloc()
    reader = _reader_for(batch)
    with single_threaded_blas():
        return compare_refs(reader, batch, algorithms)


class DaskRunner:
    """Runs compare's pair batches on a `distributed.Client`; retries a dead worker's batch."""

    def __init__(self, client: Any, retries: int = RETRIES) -> None:
        self.client = client
        self.retries = retries

    def __call__(self, batches: Sequence[Batch], algorithms: tuple[str, ...]
                 ) -> Iterator[list[dict[str, Any]]]:
        return map_in_order(self.client, run_batch, batches, algorithms,
                            name="accuracy-compare", retries=self.retries)


def compare_on_cluster(my: Any, golden: Any, replay: Any = None, *, cluster: str,
                       **kwargs: Any) -> Any:
    """`compare()` with its pair batches run on `cluster` ("local:N" or a scheduler address)."""
    from accuracy.cluster import dask_client
    from accuracy.compare.api import compare

    with dask_client(cluster) as client:
        return compare(my, golden, replay, runner=DaskRunner(client), **kwargs)
