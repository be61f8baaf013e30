"""Argument types and flags the commands share, so each spells them (and checks them) the same.

A value argparse refuses here is answered as argparse answers any bad argument: the usage and
one `error:` line naming the option, exit 2, before anything is read or written.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for an integer of at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), capped by OMP_NUM_THREADS when that
    is set: a job limited to one thread gets one worker, as torch would give it one thread."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        cores = min(cores, int(omp))
    return max(1, cores)


def worker_count(text: str) -> int:
    """An argparse `type` for `-j`: a number of worker processes, or `auto` (usable_cores)."""
    if text.strip().lower() == "auto":
        return usable_cores()
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor 'auto'"
                                         ) from None
    return at_least(1)(text)


def port(text: str) -> int:
    """An argparse `type` for a TCP port (0 picks a free one)."""
    value = at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, not {value}")
    return value


def add_progress_flags(parser: argparse.ArgumentParser) -> None:
    """`--quiet/-q` and `--progress`, the same for every command that draws a progress bar.

    `--no-progress` (compare's old spelling) stays accepted, hidden, so scripts keep working.
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    group.add_argument("--progress", action="store_true",
                       help="progress bar even when stderr is not a terminal")
    group.add_argument("--no-progress", dest="quiet", action="store_true",
                       help=argparse.SUPPRESS)


def progress_wanted(args: argparse.Namespace) -> bool:
    """A bar unless --quiet; on a terminal by default, anywhere with --progress."""
    return not args.quiet and (args.progress or sys.stderr.isatty())
