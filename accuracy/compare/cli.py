"""`accuracy compare`: argument parsing and the terminal summary; the work is in compare()."""

from __future__ import annotations

import argparse

from accuracy.cliargs import add_progress_flags, at_least, progress_wanted, worker_count
from accuracy.compare.metrics import ALL_ALGORITHMS
from accuracy.compare.report import FORMATS
from accuracy.compare.terminal import format_written


def _compare_ranks(args: argparse.Namespace) -> int:
    from accuracy.compare.multirank import compare_ranks

    kwargs = dict(config=args.config, algorithms=args.alg, mapping=args.mapping, jobs=args.jobs)
    if getattr(args, "cluster", None):  # Dask is imported only on this path
        from accuracy.compare.cluster import compare_ranks_on_cluster

        report = compare_ranks_on_cluster(args.my, args.golden, args.replay,
                                          cluster=args.cluster, **kwargs)
    else:
        report = compare_ranks(args.my, args.golden, args.replay, **kwargs)
    return _finish(report, args, report.format())


def _compare_steps(args: argparse.Namespace) -> int:
    from accuracy.compare.steps import compare_steps

    report = compare_steps(args.my, args.golden, args.replay, config=args.config,
                           algorithms=args.alg, mapping=args.mapping, jobs=args.jobs)
    return _finish(report, args, report.format())


def _finish(report, args: argparse.Namespace, text: str) -> int:
    """Write the report files asked for, print the summary, and give the exit code."""
    paths = (report.write(args.output, _formats(args), overwrite=args.overwrite)
             if args.output else {})
    print(text)
    if paths:
        print(format_written(paths))
    return report.exit_code(args.fail_on)


def _formats(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(f.strip() for f in args.formats.split(",") if f.strip())


def cmd_compare(args: argparse.Namespace) -> int:
    from accuracy.compare import compare
    from accuracy.compare.multirank import check_pair_ranks
    from accuracy.compare.report import check_formats, check_report_dir
    from accuracy.dumpfile import load_dump
    from accuracy.ranks import is_multirank

    if args.output:  # refused before the compare runs, not after
        check_report_dir(args.output, args.overwrite, create=False)  # made when written
        check_formats(_formats(args))
    from accuracy.compare.steps import is_step_tree

    if is_step_tree(args.my) or is_step_tree(args.golden):  # PrecisionDebugger's dump_path
        return _compare_steps(args)
    if is_multirank(args.my) or is_multirank(args.golden):
        return _compare_ranks(args)
    kwargs = dict(config=args.config, algorithms=args.alg, mapping=args.mapping, jobs=args.jobs,
                  progress=progress_wanted(args))
    with load_dump(args.my) as dm, load_dump(args.golden) as dg:  # opened once, for both
        if not args.any_rank:
            check_pair_ranks(dm, dg)
        if getattr(args, "cluster", None):  # Dask is imported only on this path
            from accuracy.compare.cluster import compare_on_cluster

            report = compare_on_cluster(args.my, args.golden, args.replay,
                                        cluster=args.cluster, **kwargs)
        else:
            report = compare(dm, dg, args.replay, **kwargs)
    return _finish(report, args, report.format(args.top))


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("compare", help="compare two dumps: metrics per tensor, verdicts, culprit")
    s.add_argument("-m", "--my", required=True,
                   help="my dump (the device under test); every rank's: 'dev/run_{rank}.h5' "
                        "or a folder")
    s.add_argument("-g", "--golden", required=True,
                   help="golden dump (the reference run), or every rank's, as for -m")
    s.add_argument("-r", "--replay", help="replay dump of my run (adds the local error), or "
                                          "every rank's, as for -m")
    s.add_argument("--any-rank", action="store_true",
                   help="compare two single dumps even if they hold different ranks")
    s.add_argument("-o", "-out", "--output", help="report directory (-out as msaccucmp)")
    s.add_argument("--overwrite", action="store_true", help="replace a report already in -o")
    s.add_argument("--formats", default=",".join(FORMATS),
                   help=f"report files to write (default {','.join(FORMATS)})")
    s.add_argument("--fail-on", choices=["error", "warning"],
                   help="exit 1 when any row reaches this verdict (for CI)")
    s.add_argument("-alg", "--alg", nargs="+", metavar="NAME",
                   help=f"metrics: {', '.join(ALL_ALGORITHMS)}, 'all', or "
                        "package.module:function (default: all but kl_div)")
    s.add_argument("--config", help="TOML thresholds merged over default_thresholds.toml")
    s.add_argument("--mapping", help="JSON/TOML pairing of op or module names (my -> golden)")
    s.add_argument("-j", "--jobs", type=worker_count, default="auto",
                   help="worker processes for the metric pass (default auto: one per core this "
                        "process may use, at most OMP_NUM_THREADS; a compare of less than "
                        "32 MB runs in this process)")
    s.add_argument("--cluster", metavar="local:N|tcp://HOST:PORT",
                   help="run the pair batches on Dask: N local worker processes, or an existing "
                        "scheduler (dumps must be on storage every worker reads at the same path)")
    s.add_argument("--top", type=at_least(0), default=5, help="suspects to print")
    add_progress_flags(s)
    s.set_defaults(func=cmd_compare)
    register_suspects(sub)


def cmd_suspects(args: argparse.Namespace) -> int:
    from accuracy.compare.suspects import format_selection, select_suspects, write_selection

    sel = select_suspects(args.report, top=args.top, before=args.before, after=args.after)
    path = write_selection(sel, args.output, args.overwrite)
    print(format_selection(sel, path))
    return 0


def register_suspects(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("suspects", help="turn a (statistics) report into a dump selection for "
                                        "a second, tensor-mode run (two-tier flow)")
    s.add_argument("report", help="report directory written by `accuracy compare -o`")
    s.add_argument("-o", "--output", required=True, help="selection file to write (JSON)")
    s.add_argument("--top", type=at_least(1), default=5, help="suspects to take (default 5)")
    s.add_argument("--before", type=at_least(0), default=3,
                   help="ops before each suspect to take too (default 3)")
    s.add_argument("--after", type=at_least(0), default=1,
                   help="ops after each suspect to take too (default 1)")
    s.add_argument("--overwrite", action="store_true", help="replace an existing -o file")
    s.set_defaults(func=cmd_suspects)
