"""`accuracy replay`: argument parsing only; the work is `accuracy.replay.replay`."""

from __future__ import annotations

import argparse
from pathlib import Path

from accuracy.cliargs import add_progress_flags, at_least, progress_wanted
from accuracy.errors import UsageError


def cmd_replay(args: argparse.Namespace) -> int:
    from accuracy.ranks import is_multirank
    from accuracy.replay.engine import replay, require_backend

    require_backend(args.on)  # every path (ranks, cluster) refuses a missing device first
    if is_multirank(args.dump):
        return _replay_ranks(args)
    progress = progress_wanted(args)
    kwargs = dict(on=args.on, upcast=args.upcast, jobs=args.jobs, resume=args.resume,
                  progress=progress, overwrite=args.overwrite, ops=args.op,
                  metrics_only=not args.tensors)
    if args.cluster:  # Dask is imported only on this path
        from accuracy.replay.cluster import replay_on_cluster

        r = replay_on_cluster(args.dump, args.output, cluster=args.cluster, **kwargs)
    else:
        r = replay(args.dump, args.output, **kwargs)
    print(r.format())
    return 0


def _replay_ranks(args: argparse.Namespace) -> int:
    """`accuracy replay 'dev/run_{rank}.h5' -o 'dev/replay_{rank}.h5'`: every rank, and the
    collectives checked against all ranks' inputs."""
    from accuracy.ranks import PLACEHOLDER
    from accuracy.replay.collectives import replay_ranks

    if PLACEHOLDER not in args.output and not Path(args.output).is_dir():
        raise UsageError(f"-o {args.output}: with many ranks' dumps, give a '{PLACEHOLDER}' "
                         "pattern (e.g. 'dev/replay_{rank}.h5') or an existing folder")
    done = replay_ranks(args.dump, args.output, on=args.on, upcast=args.upcast,
                        jobs=args.jobs, resume=args.resume, overwrite=args.overwrite,
                        ops=args.op, progress=False)
    print(done.format())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `replay` subcommand to the `accuracy` CLI."""
    s = subparsers.add_parser(
        "replay", help="re-run each recorded op on a reference with the device's own inputs")
    s.add_argument("dump", help="a tensor-mode dump (e.g. npu.h5), or every rank's: a "
                                "'run_{rank}.h5' pattern or a folder")
    s.add_argument("--on", default="cpu", help="reference backend (default: cpu)")
    s.add_argument("--upcast", default="fp64", choices=["fp64", "fp32", "none"],
                   help="precision of the high-precision reference (default: fp64)")
    s.add_argument("-o", "--output", required=True,
                   help="replay dump to write (replay.h5); for every rank's dumps a "
                        "'replay_{rank}.h5' pattern or a folder")
    s.add_argument("-j", "--jobs", type=at_least(1), default=1,
                   help="worker processes (default: 1)")
    s.add_argument("--tensors", action="store_true",
                   help="also store the same-dtype reference outputs (by default only each "
                        "op's error figures, all that compare reads, are stored)")
    s.add_argument("--metrics-only", action="store_true",
                   help="store only each op's error figures: the default (kept for scripts)")
    s.add_argument("--cluster", metavar="local:N|tcp://HOST:PORT",
                   help="replay op batches on Dask: N local worker processes, or an existing "
                        "scheduler (the dump must be at the same path on every worker)")
    s.add_argument("--op", action="append", help="only ops matching this name/glob (repeatable)")
    s.add_argument("--resume", action="store_true",
                   help="continue an interrupted replay without redoing finished ops")
    s.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_progress_flags(s)
    s.set_defaults(func=cmd_replay)
