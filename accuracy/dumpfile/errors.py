"""The errors a dump reader raises, and the exceptions h5py reports damage as."""

from __future__ import annotations

from accuracy.errors import AccuracyError

# h5py reports damaged metadata or data as any of these (HDF5 errors, bad values decoded)
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, UnicodeError,
             RecursionError, OverflowError)


class DumpError(AccuracyError, ValueError):
    """A file that cannot be read as a dump; the message names the file and the problem."""


class DamagedDataError(DumpError):
    """A tensor's stored bytes are damaged (checksum mismatch, unreadable HDF5 chunks)."""
