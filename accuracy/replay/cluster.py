"""Replay's op batches on a Dask cluster: each worker opens the dump itself and replays seqs.

`replay(..., runner=DaskReplayRunner(client))` sends runs of consecutive seqs to the workers
(several of replay's 16-op batches per task, fewer at the end: `cluster.guided_groups`), each
replayed the way a local replay does (reading ahead on a thread), and writes their outcomes
in execution order; the output is still written by this process, to `<out>.partial` first,
so `--resume` carries finished ops over after an interruption, and a task whose worker died
is rerun by the scheduler.
With `metrics_only`, workers send back the figures without the reference tensors.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from accuracy.cluster import RETRIES, Placement, guided_groups, map_in_order, tune_worker_malloc

_MOST, _MOST_TENSORS = 8, 2  # batches per task at most (figures only / with tensors)
_LOCAL = threading.local()  # per worker thread: open dump, device, tensor cache


def _state(path: str, on: str) -> dict[str, Any]:
    from accuracy.dumpfile import load_dump
    from accuracy.replay.cache import TensorCache
    from accuracy.replay.engine import reference_device

    st = os.stat(path)
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns, on)
    cur = getattr(_LOCAL, "state", None)
    if cur is None or cur["key"] != key:
        if cur is not None:
            cur["dump"].close()
        cur = {"key": key, "dump": load_dump(path), "device": reference_device(on),
               "cache": TensorCache()}
        _LOCAL.state = cur
    return cur


def run_ops(seqs: list[int], path: str, on: str, upcast: str, metrics_only: bool) -> list:
    """A Dask task: replay these seqs of the dump at `path` (kept open between tasks)."""
    from accuracy.replay.emulate import Emulation
    from accuracy.replay.kernels import kernel_references, references
    from accuracy.replay.ops import caching, refused_for_sure, replay_op

    tune_worker_malloc()
    st = _state(path, on)
    d, cache, device = st["dump"], st["cache"], st["device"]
    if "kernels" not in st:
        st["kernels"] = references(d.records)
    # the read path of an in-process replay: reads run ahead on a thread
    with caching(cache), kernel_references(st["kernels"]):
        emulation = Emulation.from_attrs(d.attrs)
        out = [replay_op(rec, device, upcast, keep=not metrics_only, emulation=emulation)
               for rec in cache.read_ahead([d.record(s) for s in seqs], device,
                                          refused=refused_for_sure)]
    if metrics_only:
        for o in out:
            o.tensors = []
    return out


class DaskReplayRunner:
    """Runs replay's op batches on a `distributed.Client`; retries a dead worker's batch.

    place: send the batches only to workers that can read the dump (see cluster.Placement).
    """

    def __init__(self, client: Any, retries: int = RETRIES, place: bool = True) -> None:
        self.client = client
        self.retries = retries
        self.place = place

    def __call__(self, path: str, batches: Sequence[list[int]], on: str, upcast: str,
                 metrics_only: bool) -> Iterator[list]:
        path = os.path.abspath(path)  # a worker's working directory is not this process's
        batches = list(batches)
        if not batches:
            return iter(())
        workers = None
        if self.place:
            workers = [Placement(self.client, [path]).workers_for([path])]
        # with tensors, results stay on the workers until written: smaller runs
        runs = guided_groups(len(batches), sum(self.client.nthreads().values()),
                             _MOST if metrics_only else _MOST_TENSORS)
        tasks = [[s for i in run for s in batches[i]] for run in runs]
        results = map_in_order(self.client, run_ops, tasks, path, on, upcast, metrics_only,
                               name="accuracy-replay", retries=self.retries,
                               workers=None if workers is None else workers * len(tasks),
                               eager=metrics_only)  # full replay: tensors stay on the workers
        return _split(results, [[len(batches[i]) for i in run] for run in runs])


def _split(results: Iterator[list], sizes: list[list[int]]) -> Iterator[list]:
    """Each task's outcomes cut back into the batches it ran, in batch order."""
    for outcomes, lengths in zip(results, sizes, strict=True):
        at = 0
        for n in lengths:
            yield outcomes[at:at + n]
            at += n


def replay_on_cluster(dump: Any, out_path: Any, *, cluster: str, **kwargs: Any) -> Any:
    """`replay()` with its op batches run on `cluster` ("local:N" or a scheduler address)."""
    from accuracy.cluster import dask_client
    from accuracy.replay.engine import replay

    with dask_client(cluster) as client:
        return replay(dump, out_path, runner=DaskReplayRunner(client), **kwargs)
