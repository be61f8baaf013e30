"""Replay's op batches on a Dask cluster: each worker opens the dump itself and replays seqs.

`replay(..., runner=DaskReplayRunner(client))` sends lists of seqs (16 ops each) to the
workers and writes their outcomes in execution order, as a local replay does; the output is
still written by this process, to `<out>.partial` first, so `--resume` carries finished ops
over after an interruption, and a batch whose worker died is rerun by the scheduler.
With `metrics_only`, workers send back the figures without the reference tensors.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from accuracy.cluster import RETRIES, Placement, map_in_order, tune_worker_malloc

_LOCAL = threading.local()  # per worker thread: open dump, device, tensor cache


def _state(path: str, on: str) -> dict[str, Any]:
    from accuracy.dumpfile.reader import load_dump
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
    from accuracy.replay.ops import caching, replay_op

    tune_worker_malloc()
    st = _state(path, on)
    d = st["dump"]
    with caching(st["cache"]):
        out = [replay_op(d.record(s), st["device"], upcast) for s in seqs]
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
        workers = None
        if self.place and batches:
            workers = [Placement(self.client, [path]).workers_for([path])] * len(batches)
        return map_in_order(self.client, run_ops, batches, path, on, upcast, metrics_only,
                            name="accuracy-replay", retries=self.retries, workers=workers,
                            eager=metrics_only)  # full replay: tensors stay on the workers


def replay_on_cluster(dump: Any, out_path: Any, *, cluster: str, **kwargs: Any) -> Any:
    """`replay()` with its op batches run on `cluster` ("local:N" or a scheduler address)."""
    from accuracy.cluster import dask_client
    from accuracy.replay.engine import replay

    with dask_client(cluster) as client:
        return replay(dump, out_path, runner=DaskReplayRunner(client), **kwargs)
