"""Configuration files handed to the tool (msprobe's config.json, and later the monitor's and
the files re-read while training runs): one reader that bounds what a file can make us do.

A config is small text a person wrote. Read as such: a regular file of at most
MAX_CONFIG_BYTES (no FIFO to block on, no file that grows while read), UTF-8 (a BOM
accepted), JSON nested at most MAX_CONFIG_DEPTH deep (Python's parser recurses). What it
says is then checked field by field by its user; lists of numbers go through
`steps.parse_ids` (ranges stay ranges). Every refusal is one `UsageError` line naming the
file. Imports no torch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from accuracy.errors import InputNotFoundError, UsageError
from accuracy.jsonsafe import loads_bounded

MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 16  # msprobe's config is 3 deep
MAX_LIST_ENTRIES = 10_000  # names in one list field


def read_json(path: str | os.PathLike[str], what: str = "config") -> Any:
    """The JSON value of the config file at `path`; refusals say `{what} {path}: why`."""
    p = Path(path)
    where = f"{what} {p}"
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO cannot block
    except FileNotFoundError:
        raise InputNotFoundError(f"{where}: no such file") from None
    except OSError as e:
        raise UsageError(f"{where}: {e.strerror or e}") from None
    except ValueError:  # a NUL byte in the name
        raise UsageError(f"{what} {str(p)!r}: not a file name") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{where}: not a regular file; give the config.json itself")
        if st.st_size > MAX_CONFIG_BYTES:
            raise UsageError(f"{where}: {st.st_size} bytes; a config is at most "
                             f"{MAX_CONFIG_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{where}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"{where}: more than {MAX_CONFIG_BYTES} bytes; a config is smaller")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                         f"{e.start}); save it as UTF-8") from None
    try:
        return loads_bounded(text, where, MAX_CONFIG_DEPTH, MAX_CONFIG_BYTES)
    except ValueError as e:  # not JSON, or nested deeper than any config
        raise UsageError(str(e)) from None


def check_list(value: Any, name: str, where: str) -> list[str]:
    """A list of at most MAX_LIST_ENTRIES strings (a config field of names)."""
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise UsageError(f"{where}: {name} must be a list of names, not {value!r:.80}")
    if len(value) > MAX_LIST_ENTRIES:
        raise UsageError(f"{where}: {name} holds {len(value)} names (at most "
                         f"{MAX_LIST_ENTRIES}); select with patterns (\"aten.*norm*\")")
    return value
