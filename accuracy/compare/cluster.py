"""Compare's pair batches on a Dask cluster: the same pure batch function, run by workers.

`compare(..., runner=DaskRunner(client))` hands the batches of tensor pairs (about 32 MB each,
built by `compare.batches`) to the workers and takes the metric dicts back in batch order, so the
report is the one a local run makes, row for row. Each batch goes only to workers that can
read both of its files (`cluster.Placement`: all of them on shared storage, that node's
workers for a node's local disk). Each worker keeps its dump files open across tasks and runs
with single-threaded BLAS.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from accuracy.cluster import (
    RETRIES,
    Asked,
    Placement,
    file_view,
    map_in_order,
    signatures,
    tune_worker_malloc,
)
from accuracy.compare.engine import BlobReader, TensorRef, compare_refs

log = logging.getLogger(__name__)
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
    reader = _reader_for_paths({r.path for pair in batch for r in pair})
    assert reader is not None
    return reader


def _reader_for_paths(paths: set[str], replace: bool = True) -> BlobReader | None:
    """The worker's reader with `paths` open in it. Opened under the lock: `see_and_open`
    opens them on the worker's event loop while a task thread may want the same file.
    replace=False: None, rather than closing a reader that holds another file of one of
    these names (a task on the task thread may be reading it)."""
    files = {p: _signature(p) for p in paths}
    with _LOCK:
        known = _READER["files"]
        if any(known.get(p, s) != s for p, s in files.items()) and not replace:
            return None
        if _READER["reader"] is None or any(known.get(p, s) != s for p, s in files.items()):
            if _READER["reader"] is not None:
                _READER["reader"].close()
            _READER["reader"], _READER["files"] = BlobReader(), {}
        _READER["files"].update(files)
        reader: BlobReader = _READER["reader"]
        for p in sorted(paths):
            reader.dump(p)
        return reader


def see_and_open(paths: list[str], mine: dict[str, tuple[int, int]]
                 ) -> dict[str, tuple[str, int, int] | None]:
    """Run on each worker when a compare starts: which of `paths` this worker sees (the
    answer `Placement` needs), and the dumps it sees as the client does opened now, while
    the client still aligns the runs, instead of in its first task (~18 ms per dump: its
    index is read and checked). A dump that fails to open here is left to the task that
    reads it, which reports the error as before."""
    view = file_view(paths)
    same = {p for p, v in view.items() if v is not None and tuple(v[1:]) == tuple(mine[p])}
    try:
        _reader_for_paths(same, replace=False)
    except Exception as e:  # noqa: BLE001 - the batch's own read raises it properly
        log.debug("opening %s ahead failed: %s", sorted(same), e)
    return view


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
        self._asked: tuple[frozenset[str], Asked] | None = None

    def prepare(self, paths: Sequence[str]) -> None:
        """Called by compare() as it starts, with the dumps it will read: the workers say
        which of them they see (for `Placement`) and open them, on a thread, while this
        process reads the indexes and aligns the runs (both were serial before the first
        task: the question's round trip, and each worker's opening in its first task)."""
        wanted = sorted({os.path.abspath(p) for p in paths})
        try:
            mine = signatures(wanted)
        except OSError:
            return  # compare() itself says what is wrong with the file
        self._asked = (frozenset(wanted), Asked(self.client, see_and_open, wanted, mine))

    def __call__(self, batches: Sequence[Batch], algorithms: tuple[str, ...]
                 ) -> Iterator[list[dict[str, Any]]]:
        batches = [_absolute(b) for b in batches]
        asked, self._asked = self._asked, None
        workers = None
        if self.place and batches:
            paths = {r.path for b in batches for p in b for r in p}
            views = None
            if asked is not None and paths <= asked[0]:
                try:
                    views = asked[1].result()
                except Exception as e:  # noqa: BLE001 - asked again below, as before
                    log.info("the workers' first answer failed (%s); asking again", e)
            placement = Placement(self.client, paths, views)
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
