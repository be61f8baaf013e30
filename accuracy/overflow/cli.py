"""`accuracy overflow`: argument parsing only; the work is `accuracy.overflow.scan`."""

from __future__ import annotations

import argparse
import json

from accuracy.cliargs import at_least


def cmd_overflow(args: argparse.Namespace) -> int:
    from accuracy.overflow.scan import scan

    rep = scan(args.dump, confirm_on=args.confirm_on)
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2, default=str))
    else:
        print(rep.format(limit=args.limit))
    # a CI gate never passes over what the dump did not keep: a run stopped before the
    # dumper closed may have had its birth after the ops it kept
    return 1 if args.fail_on_birth and (rep.culprits or not rep.complete) else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `overflow` subcommand to the `accuracy` CLI."""
    s = subparsers.add_parser(
        "overflow", help="ops where inf/nan was born, separated from those that inherited it")
    s.add_argument("dump", help="any dump: statistics, tensor, or check_overflow=True")
    s.add_argument("--confirm-on", metavar="DEVICE",
                   help="replay each birth op there (tensor dumps), same dtype and widened")
    s.add_argument("--json", action="store_true", help="the report as JSON")
    s.add_argument("--limit", type=at_least(0), default=20, help="births to list (default 20)")
    s.add_argument("--fail-on-birth", action="store_true",
                   help="exit 1 when a birth not handled by loss scaling is found, or when "
                   "the dump is incomplete (its run stopped before the dumper closed: the ops "
                   "it did not keep are not vouched for) (for CI)")
    s.set_defaults(func=cmd_overflow)
