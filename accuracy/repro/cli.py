"""`accuracy repro`: a standalone reproducer script for one recorded Inductor kernel."""

from __future__ import annotations

import argparse

from accuracy.cliargs import at_least


def cmd_repro(args: argparse.Namespace) -> int:
    from accuracy.repro.script import write_repro

    print(write_repro(args.dump, args.kernel, args.output, golden=args.golden, seq=args.seq,
                      overwrite=args.overwrite).format())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `repro` subcommand to the `accuracy` CLI."""
    s = subparsers.add_parser(
        "repro", help="write a standalone script reproducing one recorded Inductor kernel")
    s.add_argument("dump", help="a tensor-mode dump of a compiled run")
    s.add_argument("--kernel", required=True,
                   help="the kernel's name (inductor.cpp_fused_... as in the report)")
    s.add_argument("--seq", type=at_least(0), default=None,
                   help="which call of the kernel (default: its first)")
    s.add_argument("-g", "--golden", default=None,
                   help="the eager run's dump: the script also compares with its values")
    s.add_argument("-o", "--output", required=True, help="the script to write")
    s.add_argument("--overwrite", action="store_true", help="replace an existing script")
    s.set_defaults(func=cmd_repro)
