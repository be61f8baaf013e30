"""Text from an untrusted dump or request, made harmless to print on a terminal.

A module name, op name or source path comes from the file (a ModuleDict key can hold any
character). Printed raw, an escape sequence in it recolours, moves the cursor or rewrites what
the terminal shows, and a newline splits a listing's line in two.
"""

from __future__ import annotations

import re
from typing import TextIO

_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LAYOUT_KEPT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but tab and newline


def _escape(m: re.Match[str]) -> str:
    return f"\\x{ord(m[0]):02x}"


def shown(text: str) -> str:
    """`text` with every control character written as `\\xNN` (newlines too): for one name."""
    return _ANY_CONTROL.sub(_escape, text)


def printable(text: str) -> str:
    """`text` with control characters but tab and newline written as `\\xNN`: for a whole
    output whose lines are ours."""
    return _LAYOUT_KEPT.sub(_escape, text)


class PrintableStream:
    """A text stream that writes `printable` text to `stream` (the CLI's stdout)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str):  # flush, fileno, isatty, encoding...
        return getattr(self._stream, name)
