"""A Dask task for tests/test_cluster.py that kills its worker process the first time it runs.

It lives in its own module so the spawned Dask workers import it by name (tests/ is on their
sys.path, inherited from pytest).
"""

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
