"""`accuracy compare`: argument parsing and the terminal summary; the work is in compare()."""

from __future__ import annotations

import argparse
from typing import Any

from accuracy.cliargs import add_progress_flags, at_least, progress_wanted
from accuracy.compare.metrics import ALL_ALGORITHMS
from accuracy.compare.report import FORMATS


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))


def _where(r: dict[str, Any]) -> str:
    return (f"seq {r['seq_my']} {r['op']} [{r['phase']}] in {r['module'] or '-'} "
            f"at {r['source'] or '?'}\n      {r['my_address']}  vs  {r['golden_address']}")


def print_summary(s: dict[str, Any], top: int = 5) -> None:
    c = s["counts"]
    print(f"compared {s['my']} (my) with {s['golden']} (golden)"
          + (f", replay {s['replay']}" if s.get("replay") else ""))
    for w in s.get("refusals") or []:
        print(f"  WARNING: {w}")
    print(f"  rows {s['rows']}: " + ", ".join(f"{k} {v}" for k, v in c.items())
          + f"  ->  {s['verdict'].upper()}")
    j = s.get("judged_counts")
    if j:
        print("  tensors judged where produced: "
              + ", ".join(f"{k} {j[k]}" for k in ("pass", "warning", "error")))
    gbps = s.get("gb_per_s")
    print(f"  {s['bytes_compared'] / 1e6:.1f} MB of tensor data in {s['seconds']:.2f} s"
          + (f" ({gbps:.2f} GB/s)" if gbps else ""))
    if s.get("warning"):
        print(f"  warning: {s['warning']}")
    cul = s.get("culprit")
    if cul:
        print(f"  culprit: {_where(cul)}")
        print(f"      {cul['verdict']}: {cul['message']}")
    else:
        print("  culprit: none (no op output is judged an error)")
    sus = s.get("suspects") or []
    if sus:
        print(f"  top suspects (score = {s.get('ranking') or 'local error or amplification'}, "
              "x what an honest kernel explains):")
        for r in sus[:top]:
            print(f"    {_fmt(r['score']):>10}  {r['verdict']:7s} seq {r['seq_my']} {r['op']} "
                  f"[{r['phase']}] {r['module'] or '-'}")
    for n in s.get("notes") or []:
        print(f"  note: {n}")


def print_ranks(s: dict[str, Any]) -> None:
    """The merged summary of a multi-rank compare, one line per rank."""
    print(f"compared {len(s['ranks'])} ranks (world size {s['world_size']}): {s['my']} (my) "
          f"with {s['golden']} (golden)" + (f", replay {s['replay']}" if s.get("replay") else "")
          + f"  ->  {s['verdict'].upper()}")
    print(f"  {s['bytes_compared'] / 1e6:.1f} MB of tensor data in {s['seconds']:.2f} s")
    if s.get("warning"):
        print(f"  warning: {s['warning']}")
    print("  diverged first: " + ("none" if s["first_rank"] is None else f"rank {s['first_rank']}"))
    for e in s["ranks"]:
        c, fd = e["culprit"], e["first_divergence"]
        if e["label"] == "inherited":
            i = e["inherited"]
            what = f"inherited via {i['via']} (epoch {i['epoch']}) from rank {i['from_rank']}"
        elif c is not None:
            what = f"culprit #{c['rank_index']} {c['op']} [{c['phase']}] epoch {c['epoch']}: " \
                   f"{c['message']}"
        else:
            what = e["label"]
        print(f"  rank {e['rank']}: {e['verdict']:7s} {what}"
              + (f" (first divergence epoch {fd['epoch']} seq {fd['seq_my']})" if fd else ""))


def _compare_ranks(args: argparse.Namespace) -> int:
    from accuracy.compare.multirank import compare_ranks

    kwargs = dict(config=args.config, algorithms=args.alg, mapping=args.mapping, jobs=args.jobs)
    if getattr(args, "cluster", None):  # Dask is imported only on this path
        from accuracy.compare.cluster import compare_ranks_on_cluster

        report = compare_ranks_on_cluster(args.my, args.golden, args.replay,
                                          cluster=args.cluster, **kwargs)
    else:
        report = compare_ranks(args.my, args.golden, args.replay, **kwargs)
    paths = (report.write(args.output, _formats(args), overwrite=args.overwrite)
             if args.output else {})
    print_ranks(report.summary)
    for f, p in paths.items():
        print(f"  wrote {f}: {p}")
    return report.exit_code(args.fail_on)


def _formats(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(f.strip() for f in args.formats.split(",") if f.strip())


def cmd_compare(args: argparse.Namespace) -> int:
    from accuracy.compare import compare
    from accuracy.compare.multirank import check_pair_ranks
    from accuracy.compare.report import check_formats, check_report_dir
    from accuracy.ranks import is_multirank

    if args.output:  # refused before the compare runs, not after
        check_report_dir(args.output, args.overwrite)
        check_formats(_formats(args))
    if is_multirank(args.my) or is_multirank(args.golden):
        return _compare_ranks(args)
    if not args.any_rank:
        check_pair_ranks(args.my, args.golden)
    kwargs = dict(config=args.config, algorithms=args.alg, mapping=args.mapping, jobs=args.jobs,
                  progress=progress_wanted(args))
    if getattr(args, "cluster", None):  # Dask is imported only on this path
        from accuracy.compare.cluster import compare_on_cluster

        report = compare_on_cluster(args.my, args.golden, args.replay, cluster=args.cluster,
                                    **kwargs)
    else:
        report = compare(args.my, args.golden, args.replay, **kwargs)
    paths = (report.write(args.output, _formats(args), overwrite=args.overwrite)
             if args.output else {})
    print_summary(report.summary, args.top)
    for f, p in paths.items():
        print(f"  wrote {f}: {p}")
    return report.exit_code(args.fail_on)


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
    s.add_argument("-j", "--jobs", type=at_least(1), default=1, help="worker processes")
    s.add_argument("--cluster", metavar="local:N|tcp://HOST:PORT",
                   help="run the pair batches on Dask: N local worker processes, or an existing "
                        "scheduler (dumps must be on storage every worker reads at the same path)")
    s.add_argument("--top", type=at_least(0), default=5, help="suspects to print")
    add_progress_flags(s)
    s.set_defaults(func=cmd_compare)
    register_suspects(sub)


def cmd_suspects(args: argparse.Namespace) -> int:
    from accuracy.compare.suspects import select_suspects, write_selection

    sel = select_suspects(args.report, top=args.top, before=args.before, after=args.after)
    path = write_selection(sel, args.output, args.overwrite)
    print(f"{len(sel['my'])} ops around {len(sel['suspects'])} suspects of {args.report}; "
          f"wrote {path}")
    print(f'  second run: with dumper("device.h5", select="{path}"): step()  (and golden)')
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
