"""Dask set-up shared by compare and replay on a cluster (`--cluster local:N | tcp://host:port`).

Dask is an optional extra (`pip install accuracy[cluster]`) and is imported only here, only
when a cluster is asked for. Workers are single-threaded processes: the work is NumPy/torch
arithmetic and h5py reads, which a second thread in the same process only slows (h5py holds
one global lock, and OpenBLAS/torch threads of two tasks fight over the same cores).
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from accuracy.errors import AccuracyError

log = logging.getLogger(__name__)

RETRIES = 2  # a task whose worker died is run again on another worker, this many times
_TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
# Local workers: no MALLOC_TRIM_THRESHOLD_ (see tune_worker_malloc), and no statistical
# profiler (it samples the running task's stack every 10 ms: ~10% more CPU measured).
_LOCAL_CONFIG = {_TRIM_KEY: None, "distributed.worker.profile.enabled": False}
_LOCAL = re.compile(r"local:(\d+)")
_REMOTE = re.compile(r"(tcp|tls|ucx|inproc)://\S+")
# glibc mallopt parameters, and the values a plain process reaches by itself: its dynamic
# mmap threshold grows to the largest block freed (up to 32 MiB), the trim threshold to twice it.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20
_tuned = False


def tune_worker_malloc() -> bool:
    """Let this worker process reuse freed heap memory like an ordinary process does.

    Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 (to hand memory back to the
    OS quickly). Setting it turns off glibc's dynamic mmap threshold, so every 256 KiB metric
    buffer and 16 MB read window is a fresh mmap: measured 330,000 page faults per GB compared
    instead of 27,000, and 1.8x the CPU time of the same batch in-process. Linux/glibc only;
    elsewhere it does nothing. Returns whether it applied.
    """
    global _tuned
    if _tuned:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False
    _tuned = ok
    return ok


class ClusterError(AccuracyError, ValueError):
    """A --cluster value that cannot be used (bad form, Dask missing, scheduler unreachable)."""


def parse_cluster(spec: str) -> tuple[str, int | str]:
    """("local", workers) or ("remote", address); raises ClusterError with what to write."""
    m = _LOCAL.fullmatch(spec.strip())
    if m:
        n = int(m.group(1))
        if n < 1:
            raise ClusterError(f"--cluster {spec}: a local cluster needs at least 1 worker")
        return "local", n
    if _REMOTE.fullmatch(spec.strip()):
        return "remote", spec.strip()
    raise ClusterError(f"--cluster {spec!r}: write local:N (N worker processes on this "
                       "machine) or the scheduler address, e.g. tcp://scheduler:8786")


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ClusterError("--cluster needs Dask: pip install 'accuracy[cluster]' "
                           "(dask[distributed])") from None
    return distributed


@contextmanager
def dask_client(spec: str, timeout: float = 60.0) -> Iterator[Any]:
    """A `distributed.Client` for `spec`; a local cluster is started here and closed after."""
    kind, value = parse_cluster(spec)
    distributed = _import_distributed()
    if kind == "local":
        import dask

        saved = dict(os.environ)  # the nanny writes its worker variables into our environment
        try:
            with dask.config.set(_LOCAL_CONFIG):
                cluster = distributed.LocalCluster(
                    host="127.0.0.1", n_workers=int(value), threads_per_worker=1,
                    processes=True, dashboard_address=None)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        try:
            with distributed.Client(cluster, timeout=timeout) as client:
                yield client
        finally:
            cluster.close()
        return
    try:
        client = distributed.Client(str(value), timeout=timeout)
    except OSError as e:
        raise ClusterError(f"--cluster {value}: cannot reach the Dask scheduler ({e}); is "
                           "`dask scheduler` running there?") from None
    with client:
        yield client


def map_in_order(client: Any, fn: Callable[..., Any], batches: Sequence[Any], *args: Any,
                 name: str, retries: int = RETRIES) -> Iterator[Any]:
    """Run `fn(batch, *args)` for each batch on the cluster; yield the results in batch order.

    Tasks are impure (their keys are unique per call) so a second run recomputes; a task whose
    worker dies is rescheduled up to `retries` times. Pending tasks are cancelled on exit.
    """
    token = uuid.uuid4().hex[:12]
    futures = client.map(fn, list(batches), *[[a] * len(batches) for a in args],
                         key=[f"{name}-{token}-{i}" for i in range(len(batches))],
                         retries=retries, pure=False)
    try:
        for f in futures:
            yield f.result()
    finally:
        client.cancel(futures)
