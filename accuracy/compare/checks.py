"""Checks on the three dumps before comparing: what cannot be right is refused or said first.

- a replay made from another dump than `-m` gives local errors of other tensors: refused;
- an incomplete dump (the run stopped before the dumper closed) explains missing rows: said
  before anything else;
- the reference backend on the `-m` side and a device on the `-g` side: the sides look swapped;
- compiled kernels that drew random numbers with Inductor's own generator
  (`ACCURACY_COMPILED_RANDOM=inductor`): their dropout masks are no other run's, so every value
  after them differs by the mask, not by numerics: said before the counts.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from accuracy.dumpfile import Dump
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


OWN_RANDOM = "drew random numbers with Inductor's own generator"
# random ops as a kernel's origin nodes or its reference graph name them
_RANDOM_OP = re.compile(r"dropout|bernoulli|\brand|inductor_random|multinomial|normal|"
                        r"exponential|geometric|cauchy|log_normal|uniform")


def _random_kernels(d: Dump) -> list[Any]:
    """Kernel rows whose outputs or reference graph hold a random op."""
    out = []
    for r in d.records:
        if not r.extra.get("compiled"):
            continue
        ref = r.extra.get("reference")
        ops = [str(o.get("orig", "")) + " " + str(o.get("op", ""))
               for o in r.extra.get("outputs") or [] if isinstance(o, dict)]
        ops += [str(n.get("op", "")) for n in (ref.get("nodes") or [] if isinstance(ref, dict)
                                             else []) if isinstance(n, dict)]
        if any(_RANDOM_OP.search(o) for o in ops):
            out.append(r)
    return out


def own_random(d: Dump, side: str) -> str | None:
    """A sentence when the dump's compiled kernels drew random numbers with Inductor's own
    generator and some kernel holds a random op, else None."""
    if d.attrs.get("compiled_random") != "inductor":
        return None
    kernels = _random_kernels(d)
    if not kernels:
        return None
    first = kernels[0]
    return (f"{side} dump {d.path}: {len(kernels)} compiled kernel(s) {OWN_RANDOM} (first: "
            f"{first.op} in {first.module or 'the root'}): their masks are no other run's, so "
            "their outputs and everything after them differ by the masks, not by numerics; "
            "record again without ACCURACY_COMPILED_RANDOM=inductor to draw eager's masks")
