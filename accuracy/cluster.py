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
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    with _quiet_dask():
        yield from _client(distributed, kind, value, timeout)


@contextmanager
def _quiet_dask() -> Iterator[None]:
    """Dask sets its own loggers to INFO: its lines (scheduler start, every worker and
    connection, a closed comm's traceback at shutdown) drown the report of a successful run.
    Keep its warnings only, unless this application logs INFO itself (`accuracy -v`)."""
    dlog = logging.getLogger("distributed")
    before = dlog.level
    quiet = logging.getLogger().getEffectiveLevel() > logging.INFO and before < logging.WARNING
    if quiet:
        dlog.setLevel(logging.WARNING)
    try:
        yield
    finally:
        if quiet:
            dlog.setLevel(before)


def _client(distributed: Any, kind: str, value: int | str, timeout: float) -> Iterator[Any]:
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


def signatures(paths: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of each path as this process sees it (it read their indexes: it
    must see them)."""
    out = {}
    for p in paths:
        st = os.stat(p)
        out[p] = (st.st_size, st.st_mtime_ns)
    return out


def file_view(paths: Sequence[str]) -> dict[str, tuple[str, int, int] | None]:
    """Run on a worker: (host, size, mtime_ns) of each path as this worker sees it, or None
    where it cannot see the file."""
    host = socket.gethostname()
    out: dict[str, tuple[str, int, int] | None] = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out[p] = None
        else:
            out[p] = (host, st.st_size, st.st_mtime_ns)
    return out


class Placement:
    """Which workers can read which dump files, asked of the workers once per run.

    A worker qualifies for a file when it sees a file at that path with the size and
    modification time this process sees (the same file, not another one of that name on its
    own disk). On storage every worker mounts, every worker qualifies and tasks carry no
    restriction; a file on one node's local disk is read only by that node's workers.
    """

    def __init__(self, client: Any, paths: Iterable[str],
                 views: dict[str, dict[str, Any]] | None = None) -> None:
        """views: the workers' `file_view` answers for `paths` when already asked (by
        `ask_workers`, while this process was busy), else asked here."""
        wanted = sorted(set(paths))
        mine = signatures(wanted)
        if views is None or any(p not in v for v in views.values() for p in wanted):
            views = client.run(file_view, wanted)
        assert views is not None
        self.workers = frozenset(views)
        self.readers = {p: frozenset(w for w, v in views.items()
                                     if v.get(p) is not None and tuple(v[p][1:]) == mine[p])
                        for p in wanted}
        self.hosts = {w: next((x[0] for x in v.values() if x), "?") for w, v in views.items()}
        from distributed.comm import get_address_host

        self.on_host: dict[str, set[str]] = {}  # host as the scheduler knows it -> workers
        for w in self.workers:
            self.on_host.setdefault(get_address_host(w), set()).add(w)
        for p, who in self.readers.items():
            if len(who) < len(self.workers):
                log.info("%s is readable by %d of %d workers (hosts %s)", p, len(who),
                         len(self.workers), sorted({self.hosts[w] for w in who}))

    def workers_for(self, paths: Iterable[str]) -> list[str] | None:
        """Where a task reading `paths` may run: None when any worker may; else the hosts
        whose workers all can (a worker the nanny restarts there, under a new address, still
        qualifies), or, where only some workers of a host can, those workers' addresses."""
        paths = sorted(set(paths))
        allowed = frozenset.intersection(*(self.readers[p] for p in paths)) if paths \
            else self.workers
        if not allowed:
            unseen = [p for p in paths if not self.readers[p]]
            if unseen:
                raise ClusterError(
                    f"no Dask worker can read {unseen[0]} as this process sees it (missing, "
                    "or another file of that name); put the dumps on storage every worker "
                    "mounts at the same path")
            raise ClusterError(f"no Dask worker can read all of {', '.join(paths)} together "
                               "(they are on different nodes' disks); put them on storage "
                               "one worker can read")
        if allowed == self.workers:
            return None
        hosts = {h for h, ws in self.on_host.items() if ws & allowed}
        if all(self.on_host[h] <= allowed for h in hosts):
            return sorted(hosts)
        return sorted(allowed)


class Asked:
    """`client.run(fn, *args)` on every worker, started on a thread so that this process
    keeps working meanwhile (the workers answer, and open files, while the client aligns the
    runs); `result()` waits for the answers and raises what the call raised."""

    def __init__(self, client: Any, fn: Callable[..., Any], *args: Any) -> None:
        self._out: dict[str, Any] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(client, fn, args),
                                        name="accuracy-ask-workers", daemon=True)
        self._thread.start()

    def _run(self, client: Any, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._out = client.run(fn, *args)
        except BaseException as e:  # handed to whoever waits for the answers
            self._error = e

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the Dask workers did not answer")
        if self._error is not None:
            raise self._error
        return self._out


def guided_groups(n: int, workers: int, most: int) -> list[range]:
    """Consecutive runs of `n` batch indices, one task each: large runs first, shrinking to
    single batches at the end (guided self-scheduling: each run is the remaining work over
    twice the workers, at most `most`), so a run costs few tasks' scheduling and result
    messages yet the workers still finish together."""
    out: list[range] = []
    i = 0
    while i < n:
        k = max(1, min(most, (n - i) // (2 * max(1, workers))))
        out.append(range(i, i + k))
        i += k
    return out


def _run_group(fn: Callable[..., Any], group: list[Any], *args: Any) -> list[Any]:
    """A task of several batches: `fn(batch, *args)` for each, results in batch order."""
    return [fn(b, *args) for b in group]


def map_in_order(client: Any, fn: Callable[..., Any], batches: Sequence[Any], *args: Any,
                 name: str, retries: int = RETRIES,
                 workers: Sequence[list[str] | None] | None = None,
                 eager: bool = True, group: int = 1) -> Iterator[Any]:
    """Run `fn(batch, *args)` for each batch on the cluster; yield the results in batch order.

    The tasks are submitted here, before the first result is asked for, so the caller can
    work while they run (compare builds the rows that need no metrics meanwhile).
    Tasks are impure (their keys are unique per call) so a second run recomputes; a task whose
    worker dies is rescheduled up to `retries` times. `workers`: per batch, the workers it may
    run on (None: any; from Placement.workers_for). eager: fetch each result as soon as it is
    done and let the workers forget it, so a worker that dies later loses no finished batch
    (the scheduler would recompute a lost result); False fetches in batch order, leaving
    later results on the workers (for large results). group: at most this many consecutive
    batches of one placement per task (`guided_groups`; 1: a task per batch). Pending tasks
    are cancelled when the iterator is closed or ends.
    """
    token = uuid.uuid4().hex[:12]
    batches = list(batches)
    placements: dict[tuple[str, ...] | None, list[int]] = {}
    for i in range(len(batches)):
        w = workers[i] if workers is not None else None
        placements.setdefault(tuple(w) if w is not None else None, []).append(i)
    n_workers = max(1, sum(client.nthreads().values())) if group > 1 else 1  # threads
    tasks: list[list[int]] = []  # batch indices of each task
    futures: list[Any] = []
    for allowed, idx in placements.items():  # one submission per distinct placement
        placed = {} if allowed is None else {"workers": list(allowed),
                                             "allow_other_workers": False}
        runs = [idx[r.start:r.stop] for r in guided_groups(len(idx), n_workers, group)]
        first = len(tasks)
        if group > 1:
            fs = client.map(_run_group, [fn] * len(runs), [[batches[i] for i in run]
                                                           for run in runs],
                            *[[a] * len(runs) for a in args],
                            key=[f"{name}-{token}-{first + j}" for j in range(len(runs))],
                            retries=retries, pure=False, **placed)
        else:
            fs = client.map(fn, [batches[run[0]] for run in runs],
                            *[[a] * len(runs) for a in args],
                            key=[f"{name}-{token}-{first + j}" for j in range(len(runs))],
                            retries=retries, pure=False, **placed)
        tasks += runs
        futures += fs
    return _in_order(client, tasks, futures, eager, group)


def _in_order(client: Any, tasks: list[list[int]], futures: list[Any], eager: bool,
              group: int) -> Iterator[Any]:
    """map_in_order's results, in batch order; cancels what is pending when closed."""
    first_batch = [run[0] for run in tasks]
    try:
        done: dict[int, Any] = {}
        nxt = 0

        def take(t: int, result: Any) -> None:
            for i, r in zip(tasks[t], result if group > 1 else [result], strict=True):
                done[i] = r

        if not eager:
            for t in sorted(range(len(tasks)), key=first_batch.__getitem__):
                take(t, futures[t].result())
                while nxt in done:
                    yield done.pop(nxt)
                    nxt += 1
            return
        from distributed import as_completed

        index = {f.key: t for t, f in enumerate(futures)}
        # results fetched by the client's event loop as tasks finish, not by a call from
        # this thread per task (each a round trip through the loop)
        for f, result in as_completed(list(futures), with_results=True):
            t = index[f.key]
            take(t, result)
            futures[t] = None  # released: the worker drops its copy
            f.release()
            while nxt in done:
                yield done.pop(nxt)
                nxt += 1
    finally:
        client.cancel([f for f in futures if f is not None])
