"""compare()'s pairs measured in batches of bounded bytes: here, in `-j` worker processes, or
by a runner (a Dask cluster), each batch's metrics handed back as it finishes so rows are
built while later batches run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from typing import Any

from accuracy.compare.engine import BlobReader, compare_refs, worker_run
from accuracy.compare.pairs import PairSpec, needs_data, tensor_key
from accuracy.compare.writers import warm
from accuracy.dumpfile import Dump, TensorRef

BATCH_BYTES = 32 << 20  # work unit sent to a worker process


# Runs the pair batches somewhere else (a Dask cluster: accuracy.compare.cluster.DaskRunner):
# gets the batches and the algorithms, yields each batch's metric dicts in batch order. A
# runner may also have `prepare(paths)`: called as compare() starts, with the two dumps' paths.
BatchRunner = Callable[[list[list[tuple[TensorRef, TensorRef]]], tuple[str, ...]],
                       Iterable[list[dict[str, Any]]]]


class Results:
    """The pairs' metric dicts, taken from the batches as they finish, so the rows of the
    pairs already measured are built while the rest are still being computed (by a Dask
    cluster or `-j` processes; in this process every batch is computed when a row first
    needs one). Building the rows after the last batch was serial time a cluster cannot
    share."""

    def __init__(self, batches: Iterator[list[tuple[tuple, dict[str, Any]]]],
                 runner: Iterable[Any] | None = None) -> None:
        self._batches = batches
        self._runner = runner  # closed on abort: its pending tasks are cancelled
        self._done: dict[tuple, dict[str, Any]] = {}

    def get(self, key: tuple) -> dict[str, Any]:
        """The metrics of pair `key`, waiting for its batch if it is still running."""
        while key not in self._done:
            got = next(self._batches, None)
            if got is None:
                raise KeyError(f"no batch measured the pair {key}")
            self._done.update(got)
        return self._done[key]

    def close(self) -> None:
        """Take any batch no row asked for and end the run (its pool, progress bar)."""
        for got in self._batches:
            self._done.update(got)

    def abort(self) -> None:
        """End the run early (a row failed): its pool and progress bar are closed, and a
        runner's tasks not finished are cancelled, even when no batch was asked for yet."""
        for it in (self._batches, self._runner):
            close = getattr(it, "close", None)
            if close is not None:
                close()


def run_metrics(specs: list[PairSpec], dumps: dict[str, Dump], algs: tuple[str, ...],
                jobs: int, progress: bool, runner: BatchRunner | None = None
                ) -> tuple[Results, int]:
    """The pairs' metrics (filled as their batches finish) and the bytes they cover."""
    todo: dict[tuple, tuple[TensorRef, TensorRef]] = {}
    for s in specs:
        if needs_data(s):
            assert s.my is not None and s.golden is not None
            k = (tensor_key(s.my), tensor_key(s.golden))
            if k not in todo:
                todo[k] = (s.my.ref(), s.golden.ref())
    keys = list(todo)
    total = sum(m.nbytes + g.nbytes for m, g in todo.values())
    batches: list[list[tuple]] = [[]]
    size = 0
    for k in keys:
        if size > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(k)
        size += todo[k][0].nbytes + todo[k][1].nbytes
    # a runner is handed every batch now: its tasks run while the caller builds rows
    ran = runner([[todo[k] for k in b] for b in batches], algs) if runner and todo else None
    return Results(_batch_results(todo, batches, dumps, algs, jobs, progress, ran,
                                   total), ran), total


def _batch_results(todo: dict[tuple, tuple[TensorRef, TensorRef]], batches: list[list[tuple]],
                   dumps: dict[str, Dump], algs: tuple[str, ...], jobs: int, progress: bool,
                   ran: Iterable[list[dict[str, Any]]] | None, total: int
                   ) -> Iterator[list[tuple[tuple, dict[str, Any]]]]:
    """Each batch's (pair key, metrics), as the batches finish (a runner's in batch order)."""
    if not todo:
        return
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="compare", leave=False)

    def done(b: list[tuple], res: list[dict[str, Any]]) -> list[tuple[tuple, dict[str, Any]]]:
        if bar:
            bar.update(sum(todo[k][0].nbytes + todo[k][1].nbytes for k in b))
        return list(zip(b, res, strict=True))

    with ExitStack() as stack:
        if bar:
            stack.callback(bar.close)
        if ran is not None:
            for b, res in zip(batches, ran, strict=True):
                yield done(b, res)
        elif jobs > 1 and len(batches) > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed  # 5 ms: here

            ex = stack.enter_context(ProcessPoolExecutor(max_workers=min(jobs, len(batches))))
            futs = {ex.submit(worker_run, [todo[k] for k in b], algs): b for b in batches}
            warm()  # the workers are forked by now: this process has time to spare
            for f in as_completed(futs):
                yield done(futs[f], f.result())
        else:  # here, all at once: nothing would run beside the rows
            from accuracy.compare.blas import single_threaded_blas

            reader = BlobReader(dumps)
            with single_threaded_blas():
                measured = [done(b, compare_refs(reader, [todo[k] for k in b], algs))
                            for b in batches]
            yield from measured

