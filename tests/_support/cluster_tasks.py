"""A Dask task for tests/test_cluster.py that kills its worker process the first time it runs.

It lives in its own module so the spawned Dask workers import it by name
(`tests._support.cluster_tasks`: the checkout is on their sys.path, inherited from pytest).
"""

import errno
import os
import signal
from pathlib import Path

from accuracy.compare.cluster import run_batch


def die_once_then_compare(batch, algorithms, marker):
    """SIGKILL this worker on the first call anywhere (marker file), then compare normally."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return run_batch(batch, algorithms)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def killed_pid(marker):
    return int(Path(marker).read_text())


_REAL_STAT = os.stat


def hide(paths):
    """Make this worker process unable to see `paths`, as a node without that disk would be:
    os.stat (and so Path.exists, the dump reader's open) raises FileNotFoundError for them."""
    hidden = {os.fspath(p) for p in paths}

    def stat(p, *args, **kwargs):
        if os.fspath(p) in hidden:
            raise FileNotFoundError(errno.ENOENT, "not on this worker's disk", os.fspath(p))
        return _REAL_STAT(p, *args, **kwargs)

    os.stat = stat


def unhide():
    os.stat = _REAL_STAT


def replay_logged(seqs, path, on, upcast, metrics_only, log_dir, kill_at):
    """run_ops that appends the seqs it replays to a per-process log, and SIGKILLs its worker
    once, after replaying the first op of the batch that starts at seq `kill_at`."""
    from accuracy.replay.cluster import run_ops

    out = []
    for s in seqs:
        out += run_ops([s], path, on, upcast, metrics_only)
        with open(os.path.join(log_dir, f"ran-{os.getpid()}"), "a") as f:
            f.write(f"{s}\n")
        if seqs[0] == kill_at:
            try:
                fd = os.open(os.path.join(log_dir, "killed"), os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                continue
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
    return out


def refuse_to_answer(paths, mine):
    """A worker's answer to DaskRunner.prepare that fails (a worker lost meanwhile)."""
    raise OSError("this worker could not answer")
