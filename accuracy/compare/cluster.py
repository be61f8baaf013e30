"""Compare's pair batches on a Dask cluster: the same pure batch function, run by workers.

`compare(..., runner=DaskRunner(client))` hands the batches of tensor pairs (about 32 MB each,
built by `compare.api`) to the workers and takes the metric dicts back in batch order, so the
report is the one a local run makes, row for row. Each batch goes only to workers that can
read both of its files (`cluster.Placement`: all of them on shared storage, that node's
workers for a node's local disk). Each worker keeps its dump files open across tasks and runs
with single-threaded BLAS.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from accuracy.cluster import RETRIES, Placement, map_in_order, tune_worker_malloc
from accuracy.compare.engine import BlobReader, TensorRef, compare_refs

Batch = list[tuple[TensorRef, TensorRef]]
# batches (about 32 MB each) per task at most: a task per batch cost the client and the
# scheduler ~6 ms of CPU each, on the cores the workers use (see docs/cluster.md)
_MOST = 16
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


def _absolute(batch: Batch) -> Batch:
    """The batch with absolute paths: a worker's working directory is not this process's."""
    return [tuple(r if os.path.isabs(r.path) else dataclasses.replace(
        r, path=os.path.abspath(r.path)) for r in pair) for pair in batch]  # type: ignore[misc]


class DaskRunner:
    """Runs compare's pair batches on a `distributed.Client`; retries a dead worker's batch.

    place: send each batch only to workers that can read its files (one `client.run` per
    compare to ask them); False sends any batch to any worker.
    """

    def __init__(self, client: Any, retries: int = RETRIES, place: bool = True) -> None:
        self.client = client
        self.retries = retries
        self.place = place

    def __call__(self, batches: Sequence[Batch], algorithms: tuple[str, ...]
                 ) -> Iterator[list[dict[str, Any]]]:
        batches = [_absolute(b) for b in batches]
        workers = None
        if self.place and batches:
            placement = Placement(self.client, {r.path for b in batches for p in b for r in p})
            workers = [placement.workers_for({r.path for p in b for r in p}) for b in batches]
        return map_in_order(self.client, run_batch, batches, algorithms,
                            name="accuracy-compare", retries=self.retries, workers=workers,
                            group=_MOST)


def compare_on_cluster(my: Any, golden: Any, replay: Any = None, *, cluster: str,
                       **kwargs: Any) -> Any:
    """`compare()` with its pair batches run on `cluster` ("local:N" or a scheduler address)."""
    from accuracy.cluster import dask_client
    from accuracy.compare.api import compare

    with dask_client(cluster) as client:
        return compare(my, golden, replay, runner=DaskRunner(client), **kwargs)


def compare_ranks_on_cluster(my: Any, golden: Any, replay: Any = None, *, cluster: str,
                             **kwargs: Any) -> Any:
    """`compare_ranks()` (one dump per rank) with every rank's batches run on `cluster`; each
    rank's batches go to the workers that can read that rank's files."""
    from accuracy.cluster import dask_client
    from accuracy.compare.multirank import compare_ranks

    with dask_client(cluster) as client:
        return compare_ranks(my, golden, replay, runner=DaskRunner(client), **kwargs)
