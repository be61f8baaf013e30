"""`accuracy verify`: argument parsing only; the work is `dumpfile.describe.verify_file`."""

from __future__ import annotations

import argparse


def cmd_verify(args: argparse.Namespace) -> int:
    from accuracy.dumpfile.describe import verify_file

    damaged = 0
    for path in args.dumps:
        result = verify_file(path, allow_incomplete=args.allow_incomplete)
        print(result.format())
        damaged += not result.ok
    return 1 if damaged else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `verify` subcommand to the `accuracy` CLI."""
    s = subparsers.add_parser(
        "verify", help="check dumps: layout, index and every stored tensor's checksum "
                       "(exit 1 on damage, or on a dump its run did not finish)")
    s.add_argument("dumps", nargs="+", metavar="dump", help="dump files (.h5)")
    s.add_argument("--allow-incomplete", action="store_true",
                   help="accept a dump cut short (killed, disk full) whose kept ops are "
                        "sound: exit 0, still saying what it lacks")
    s.set_defaults(func=cmd_verify)
