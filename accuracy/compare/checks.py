"""Checks on the three dumps before comparing: what cannot be right is refused or said first.

- a replay made from another dump than `-m` gives local errors of other tensors: refused;
- an incomplete dump (the run stopped before the dumper closed) explains missing rows: said
  before anything else;
- the reference backend on the `-m` side and a device on the `-g` side: the sides look swapped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from accuracy.dumpfile.reader import Dump
from accuracy.errors import UsageError

log = logging.getLogger(__name__)
# Backends a golden run is normally recorded on.
REFERENCE_BACKENDS = ("cpu",)


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_replay(my: Dump, replay: Dump) -> None:
    """Raise ValueError when `replay` was not replayed from `my` (naming both files).

    A dump moved or copied after its replay is accepted when every replayed op is the same op
    at the same position of `my`."""
    src = replay.attrs.get("replayed_from")
    if not src:
        raise UsageError(f"{replay.path} is not a replay (no replayed_from attribute); -r takes "
                         "the output of `accuracy replay` on the -m dump")
    if _same_file(src, my.path):
        return
    mine = {r.seq: r.op for r in my.records}
    theirs = [(r.seq, r.op) for r in replay.records]
    if theirs and all(mine.get(seq) == op for seq, op in theirs) and \
            Path(src).name == Path(my.path).name:
        log.info("replay %s was made from %s, a copy of %s with the same ops", replay.path, src,
                 my.path)
        return
    raise UsageError(f"replay {replay.path} was replayed from {src}, not from the -m dump "
                     f"{my.path}: its local errors belong to other tensors. Replay {my.path} "
                     f"(`accuracy replay {my.path} -o replay.h5`) or pass the matching -m")


def incomplete(d: Dump, side: str) -> str | None:
    """A sentence when the dump did not close cleanly (crash, kill, disk full), else None."""
    done = bool(d.attrs.get("complete")) and getattr(d, "closed_cleanly", True)
    if done:
        return None
    return (f"{side} dump {d.path} is incomplete (the run stopped before the dumper closed: "
            f"a crash, a kill or a full disk); it holds {len(d.records)} ops, and rows after "
            "its last op are unmatched for that reason")


def swapped(my: Dump, golden: Dump) -> str | None:
    """A sentence when -m looks like the reference run and -g like the device run."""
    bm, bg = my.attrs.get("backend"), golden.attrs.get("backend")
    if bm in REFERENCE_BACKENDS and bg and bg not in REFERENCE_BACKENDS:
        return (f"-m {my.path} was recorded on {bm} and -g {golden.path} on {bg}: -m takes the "
                "device under test and -g the reference run; are they swapped?")
    return None
