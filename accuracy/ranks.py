"""Per-rank dump files: finding them from a `{rank}` pattern or a folder, keyed by rank.

A file's rank is the one its dumper recorded (the `rank` attribute), never its name: renamed
or mixed-up files still pair correctly, and two files claiming one rank are refused.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from accuracy.dumpfile import DumpError, load_dump
from accuracy.errors import UsageError

PLACEHOLDER = "{rank}"


def is_multirank(spec: str | os.PathLike[str] | None) -> bool:
    """Whether a CLI argument names many ranks' dumps (a `{rank}` pattern or a folder)."""
    return spec is not None and (PLACEHOLDER in str(spec) or Path(spec).is_dir())


@dataclass
class RankFiles:
    """One side's dumps: rank -> path, and the world size they were recorded in."""

    spec: str
    files: dict[int, Path]
    world_size: int

    @property
    def ranks(self) -> list[int]:
        return sorted(self.files)


def _candidates(spec: str) -> list[Path]:
    if PLACEHOLDER in spec:
        pattern = glob.escape(spec).replace(PLACEHOLDER, "*")  # escape() leaves {} alone
        # the placeholder stands for a rank number only: 'run/{rank}.h5' must not take the
        # 'run/replay_0.h5' written beside it, nor 'run_{rank}.h5' a 'run_0_old.h5'
        number = re.compile(re.escape(spec).replace(re.escape(PLACEHOLDER), r"\d+"))
        return sorted(Path(p) for p in glob.glob(pattern)
                      if number.fullmatch(p) and Path(p).is_file())
    folder = Path(spec)
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".h5"
                  and not p.name.startswith("."))


def find_rank_files(spec: str | os.PathLike[str]) -> RankFiles:
    """Every dump a pattern or folder names, keyed by the rank recorded in it.

    Raises ValueError (with what to do) when none is found, when two files claim one rank,
    or when the files disagree on the world size.
    """
    spec = str(spec)
    if PLACEHOLDER not in spec and not Path(spec).is_dir():
        raise UsageError(f"{spec}: neither a '{PLACEHOLDER}' pattern nor a folder of per-rank "
                         "dumps")
    files: dict[int, Path] = {}
    worlds: dict[int, list[int]] = {}
    for p in _candidates(spec):
        try:
            with load_dump(p) as d:
                rank = int(d.attrs.get("rank", 0))
                world = int(d.attrs.get("world_size", 1))
        except DumpError as e:
            raise UsageError(f"{e}; remove it from the folder or fix the pattern") from None
        if rank in files:
            raise UsageError(f"{files[rank]} and {p} both hold rank {rank}: are two runs mixed "
                             "in one folder? Use a pattern that names one run")
        files[rank] = p
        worlds.setdefault(world, []).append(rank)
    if not files:
        raise UsageError(f"{spec}: no dump files found (a pattern such as 'dev/run_{{rank}}.h5' "
                         "or a folder of .h5 dumps)")
    if len(worlds) > 1:
        detail = "; ".join(f"world size {w}: ranks {sorted(r)}" for w, r in sorted(worlds.items()))
        raise UsageError(f"{spec}: files from runs of different world sizes ({detail})")
    world = next(iter(worlds))
    outside = [r for r in files if not 0 <= r < world]
    if outside:
        raise UsageError(f"{spec}: ranks {outside} lie outside world size {world}")
    return RankFiles(spec, files, world)


def output_path(spec: str | os.PathLike[str], rank: int, stem: str = "replay") -> Path:
    """Where rank `rank`'s output goes: the pattern filled in, or `<folder>/<stem>_<rank>.h5`."""
    spec = str(spec)
    if PLACEHOLDER in spec:
        return Path(spec.replace(PLACEHOLDER, str(rank)))
    return Path(spec) / f"{stem}_{rank}.h5"
