"""`accuracy monitor`: argument parsing only; the work is in `accuracy.monitor`."""

from __future__ import annotations

import argparse
import json


def cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from accuracy.errors import OutputExistsError
    from accuracy.monitor.plot import write_plot
    from accuracy.outputs import writable_folder

    out = Path(args.output)
    if out.exists() and not args.overwrite:
        raise OutputExistsError(f"{out} exists; pass --overwrite or another -o")
    writable_folder(out.parent if str(out.parent) else Path("."))
    print(f"wrote {write_plot(args.series, out)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from accuracy.monitor.summary import summarise

    info = summarise(args.series)
    print(json.dumps(info, indent=2, default=str) if args.json else info["text"])
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `monitor` subcommand (plot, show) to the `accuracy` CLI."""
    s = subparsers.add_parser("monitor", help="plots and summaries of a monitor series "
                                              "(accuracy.monitor)")
    sub = s.add_subparsers(dest="monitor_cmd", required=True)
    p = sub.add_parser("plot", help="write each figure per layer over steps and a layer x step "
                                    "heat map as one self-contained HTML page")
    p.add_argument("series", help="a monitor file (*.monitor.h5)")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.set_defaults(func=cmd_plot)
    w = sub.add_parser("show", help="steps recorded, loss range, triggers and captures")
    w.add_argument("series", help="a monitor file (*.monitor.h5)")
    w.add_argument("--json", action="store_true", help="as JSON")
    w.set_defaults(func=cmd_show)
