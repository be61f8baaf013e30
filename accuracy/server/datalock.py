"""One server per data directory: an exclusive lock on `DATA/server.lock`, held for the server's
life.

Two servers on one data directory would each think the other's running jobs were orphans of a
crash (and fail them), and clean each other's temporary files. The lock is an `fcntl.flock`, so
the kernel releases it when the holder dies, even by SIGKILL; a stale file is never a problem.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from accuracy.errors import AccuracyError

LOCK_NAME = "server.lock"


class DataDirBusy(AccuracyError, RuntimeError):
    """Another live server holds this data directory."""


class DataDirLock:
    """Take with acquire(); release() (or process exit) gives it back."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirBusy(
                f"{self.path.parent} is in use by another accuracy server (pid {holder}); stop "
                "it or give this one another --data directory") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # closing the descriptor drops the flock

    def __del__(self) -> None:  # an app dropped without its shutdown still frees the folder
        self.release()
