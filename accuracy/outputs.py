"""Checks of a folder the user names for output, made before any work is done.

A command that would run for minutes and then fail to write (a missing drive, a read-only or
pseudo file system, a file where a folder should be) is refused at once with one line naming
the path: `OutputNotWritableError`, an AccuracyError. Writing a probe file is the check,
since permission bits say nothing about read-only mounts or a superuser on /proc.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from accuracy.errors import OutputNotWritableError


def writable_folder(folder: str | os.PathLike[str], what: str = "output") -> Path:
    """Create `folder` if missing and check a file can be written in it; returns it."""
    p = Path(folder) if str(folder) else Path(".")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        raise _not_writable(p, e, what) from None
    return p


def folder_could_be_written(folder: str | os.PathLike[str], what: str = "output") -> Path:
    """Check `folder` could be created and written, creating nothing; returns it.

    For a check made before the work: a command refused later (its input unreadable) must
    not leave an empty folder the user did not have. The probe file goes in the nearest
    folder that exists, where creating `folder` would need the same right.
    """
    p = Path(folder) if str(folder) else Path(".")
    existing = p
    while not (existing.exists() or existing.is_symlink()) and existing.parent != existing:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise FileExistsError(f"{existing} is not a folder")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise _not_writable(p, e, what) from None
    return p


def _not_writable(p: Path, e: OSError, what: str) -> OutputNotWritableError:
    reason = e.strerror or type(e).__name__
    if isinstance(e, FileExistsError) or (p.exists() and not p.is_dir()):
        reason = "a file is in the way of the folder"
    return OutputNotWritableError(f"{what} {p}: cannot write there ({reason}); choose "
                                  "another place")
