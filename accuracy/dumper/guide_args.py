"""The keywords of Ascend's `torch.utils.dumper`, with their meaning, for `dumper(...)`.

Engineers arrive with that guide's snippets; they run unchanged once the import is replaced:
`use_dump` (False: record nothing), `use_load` + `load_file_path` (load mode; '' or None: no
load), `dump_path` naming a folder (the dump goes inside as `dump_{rank}.h5`), and
`load_with_acl_dump`, which is refused: it maps Ascend IR to TBE kernels through ACL.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)

DUMP_FILE_IN_FOLDER = "dump_{rank}.h5"


@dataclass(frozen=True)
class Resolved:
    """What the dumper does: record (`active`), into `path`, loading `load_file_path` or not."""

    active: bool
    path: str | None
    load_file_path: str | None


def dump_file(dump_path: str | os.PathLike[str], rank: int) -> str:
    """The file to write: `{rank}` expanded; a folder gets `dump_{rank}.h5` inside it.

    A folder is: an existing folder, a path written with a trailing slash, or a path that is
    not an existing file and whose name has no suffix (`dump`, `out/run1`: a name without
    `.h5` silently became an HDF5 file called `dump`). A name with a suffix (`run.h5`) is a file.
    """
    raw = os.fspath(dump_path)
    path = raw.replace("{rank}", str(rank))
    folder = (path.endswith(("/", os.sep)) or os.path.isdir(path)
              or (not os.path.exists(path) and not os.path.splitext(os.path.basename(path))[1]))
    if folder:
        return os.path.join(path, DUMP_FILE_IN_FOLDER.format(rank=rank))
    return path


def resolve(
    dump_path: str | os.PathLike[str] | None,
    rank: int,
    *,
    use_dump: bool,
    use_load: bool | None,
    load_file_path: str | os.PathLike[str] | None,
    load_with_acl_dump: bool,
    check_overflow: bool,
) -> Resolved:
    """Check the guide's keywords together; raises ValueError with a one-line reason."""
    if load_with_acl_dump:
        raise ValueError(
            "load_with_acl_dump=True maps Ascend IR to TBE kernels through ACL; there is "
            "nothing to map off Ascend: drop it (load mode itself works with load_file_path=...)")
    golden = os.fspath(load_file_path) if load_file_path not in (None, "") else None
    if use_load and golden is None:
        raise ValueError("use_load=True needs load_file_path=<a tensor dump or an "
                         "`accuracy extract` file of the golden run>")
    if use_load is False and golden is not None:
        log.warning("use_load=False: load_file_path %r is not loaded", golden)
        golden = None
    active = bool(use_dump) or golden is not None or check_overflow
    if not active:
        return Resolved(False, None, None)
    if dump_path is None or os.fspath(dump_path) == "":
        raise ValueError("dumper needs dump_path: a file (run.h5) or a folder (the dump is "
                         f"written inside it as {DUMP_FILE_IN_FOLDER})")
    return Resolved(True, dump_file(dump_path, rank), golden)
