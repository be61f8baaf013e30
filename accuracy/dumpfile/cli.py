"""`accuracy verify`: argument parsing only; the work is `Dump.verify` and the layout check."""

from __future__ import annotations

import argparse


def cmd_verify(args: argparse.Namespace) -> int:
    from accuracy.dumpfile.reader import DumpError, load_dump

    damaged = 0
    for path in args.dumps:
        try:
            with load_dump(path) as d:
                n_ops = len(d.records)  # parses every op row (JSON included)
                problems = d.verify()
                stored = [t for t in d.tensors if t.has_data and not t.is_link]
        except DumpError as e:  # refused at open: layout, links, index, damaged metadata
            print(e)
            damaged += 1
            continue
        for line in problems:
            print(line)
        if problems:
            damaged += 1
        else:
            print(f"{path}: ok ({n_ops} ops, {len(stored)} stored tensors, "
                  f"{sum(t.nbytes for t in stored)} bytes checked)")
    return 1 if damaged else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `verify` subcommand to the `accuracy` CLI."""
    s = subparsers.add_parser(
        "verify", help="check dumps: layout, index and every stored tensor's checksum "
                       "(exit 1 on damage)")
    s.add_argument("dumps", nargs="+", metavar="dump", help="dump files (.h5)")
    s.set_defaults(func=cmd_verify)
