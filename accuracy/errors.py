"""The errors a user can act on: one base class, so the CLI tells them from bugs.

Every part raises a subclass of `AccuracyError` when the input or the environment is wrong in a
way the user can fix (a missing file, a foreign file, an option value, an output in the way);
the message is one sentence that names the thing and says what to do. The CLI prints those as
one line and exits 2; any other exception is a bug and keeps its traceback.

Each subclass also keeps the built-in base that callers caught before (`ValueError`,
`FileExistsError`...), so `except ValueError` around a library call still works. This module
imports nothing from the package (nor torch), so every part can use it.
"""

from __future__ import annotations


class AccuracyError(Exception):
    """Something the user can fix; the message says what. Base of every part's error."""


class RaisedForTheUser(Exception):  # noqa: N818 - a mixin: what the class says it is
    """Raised on purpose, because the user asked (`overflow_raise=True`, `strict=True`):
    every guard that keeps the user's step alive through our own failures lets it pass."""


class UsageError(AccuracyError, ValueError):
    """An argument or option value that cannot be used (a bad name, a number out of range, a
    file of the wrong kind)."""


class InputNotFoundError(AccuracyError, FileNotFoundError):
    """A file or folder the user named is not there."""


class OutputExistsError(AccuracyError, FileExistsError):
    """The output is already there and replacing it was not asked for (or it is the wrong kind
    of thing to replace)."""


class NoMatchError(AccuracyError, LookupError):
    """Nothing in the input matches the selection the user gave."""


class OutputNotWritableError(AccuracyError, PermissionError):
    """The output's folder cannot be created or written to."""


class ExtensionUnavailableError(AccuracyError, RuntimeError):
    """A C++ extension cannot be built or loaded here (no compiler, a build cache others can
    write, a device name another backend already holds)."""


class NotComparableError(UsageError):
    """Two inputs that cannot be compared (another model's dump, a replay given as a dump,
    the device and the reference run given the wrong way round): the user gave the wrong
    file, and a verdict over them would be no verdict."""
