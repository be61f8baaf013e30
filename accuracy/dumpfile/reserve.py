"""File space held past the end of a dump, so HDF5's own writes never meet a full disk.

HDF5 cannot recover from a failed write: a flush that hits ENOSPC half-way can leave an index
entry pointing past the end-of-allocation its superblock records, and the committed rows
become unreadable ("actual len exceeds EOA"; seen when another program filled the disk under
a running dump). So the writer keeps blocks allocated past the end of its file
(`fallocate(FALLOC_FL_KEEP_SIZE)`: the blocks are the file's, its size does not change), sized
for the next flush or blob growth, and renews them before each. HDF5's writes then land in
blocks already owned; when a renewal fails, recording stops while the file can still be
closed as the last commit left it. HDF5's flushes and close may truncate the file to its end,
which frees what is held (so it is renewed before each HDF5 write); after a failed close,
`give_back` frees it.

Linux only; where the call or the file system does not support it, nothing is held and the
writer keeps its statvfs headroom check alone.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os

log = logging.getLogger(__name__)

_KEEP_SIZE = 0x01
_PUNCH_HOLE = 0x02
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV}
# allocated blocks that are not data (extent and indirect blocks): never counted as held
_METADATA_SLACK = 64 << 10
_EXTRA = 1 << 20  # asked beyond the need: small beside the free-space check's 4 MiB headroom


def _fallocate_call():
    try:
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (AttributeError, OSError):  # not Linux's libc
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _fallocate_call()


def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """0, or the errno of the failed call."""
    if _FALLOCATE is None:
        return errno.ENOSYS
    if _FALLOCATE(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()


class SpaceReserve:
    """Blocks held past the end of one open file (see the module docstring)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.supported = _FALLOCATE is not None

    def renew(self, nbytes: int) -> None:
        """Hold `nbytes` past the file's end; OSError(ENOSPC) when the disk cannot give them."""
        if not self.supported or nbytes <= 0:
            return
        st = os.fstat(self._fd)
        # A writer renews before every HDF5 write, and re-allocating held space walks its
        # pages again (~0.3 ms per 4 MiB on tmpfs): skip it when the blocks past the end (at
        # least what is allocated beyond the file's last block, less metadata blocks) cover
        # the need. An allocation asks a little more than the need, so the next renewals of
        # about the same size find it held.
        block = max(st.st_blksize, 4096)
        below = -(-st.st_size // block) * block
        if st.st_blocks * 512 - below - _METADATA_SLACK >= nbytes:
            return
        err = _fallocate(self._fd, _KEEP_SIZE, st.st_size, nbytes + _EXTRA)
        if err == errno.ENOSPC:  # a fuller disk may still give the need alone
            err = _fallocate(self._fd, _KEEP_SIZE, st.st_size, nbytes)
        if err in _UNSUPPORTED:
            log.debug("fallocate not supported here (%s): no space held ahead of HDF5's writes",
                      os.strerror(err))
            self.supported = False
            return
        if err:
            raise OSError(err, os.strerror(err))


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Give the file system back the blocks of [offset, offset + length) of the file (they
    read as zeros, the size stays): space allocated and never written. False where the file
    system cannot."""
    return _fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, offset, length) == 0


def give_back(path: os.PathLike[str] | str) -> None:
    """Free the blocks held past the end of the closed file at `path` (best effort).

    A truncation below the file's end frees every block past the new end (a hole punched
    past the end is a no-op on ext4), so the file is grown by one byte and cut back.
    """
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        os.ftruncate(fd, size + 1)
        os.ftruncate(fd, size)
    except OSError as e:
        log.debug("could not give back the space held past the end of %s: %s", path, e)
    finally:
        os.close(fd)
