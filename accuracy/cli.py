"""The `accuracy` command line: argument parsing only; each command calls one library function.

Parts of the package add their own subcommands through a `register(subparsers)` function in
their `cli` module, so this file stays a thin dispatcher. Only the part that owns the command
being run is imported (the others are listed from `_PART_COMMANDS`), so `accuracy --help` and
argument errors answer without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence

from accuracy.cliargs import at_least
from accuracy.errors import AccuracyError, UsageError
from accuracy.termtext import PrintableStream, shown

_PART_CLIS = (
    "accuracy.dumpfile.cli",
    "accuracy.replay.cli",
    "accuracy.compare.cli",
    "accuracy.overflow.cli",
    "accuracy.server.cli",
    "accuracy.live.cli",
    "accuracy.demo",
    "accuracy.repro.cli",
    "accuracy.monitor.cli",
)

# command -> (module that registers it, its one-line help) for the parts' commands, so the
# command list needs no part imported. A module in _PART_CLIS missing here is imported eagerly
# (correct, only slower); tests/test_cli_startup.py checks this table against the parts.
_PART_COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("accuracy.dumpfile.cli",
               "check dumps: layout, index and every stored tensor's checksum (exit 1 on damage, "
               "or on a dump its run did not finish)"),
    "replay": ("accuracy.replay.cli",
               "re-run each recorded op on a reference with the device's own inputs"),
    "compare": ("accuracy.compare.cli",
                "compare two dumps: metrics per tensor, verdicts, culprit"),
    "suspects": ("accuracy.compare.cli", "turn a (statistics) report into a dump selection for "
                                         "a second, tensor-mode run (two-tier flow)"),
    "overflow": ("accuracy.overflow.cli",
                 "ops where inf/nan was born, separated from those that inherited it"),
    "serve": ("accuracy.server.cli", "REST API and web UI to browse runs and reports"),
    "prove": ("accuracy.live.cli", "prove a culprit: substitute it by the reference and "
                                   "measure how much of the loss/gradient gap closes"),
    "demo": ("accuracy.demo", "run the end-to-end demo on the emulated accelerator"),
    "repro": ("accuracy.repro.cli",
              "write a standalone script reproducing one recorded Inductor kernel"),
    "monitor": ("accuracy.monitor.cli", "plots and summaries of a monitor series "
                                        "(accuracy.monitor)"),
}


def cmd_info(args: argparse.Namespace) -> int:
    from accuracy.dumpfile.describe import describe

    info = describe(args.dump)
    print(info.to_json() if args.json else info.format(top=args.top))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from accuracy.dumpfile.describe import list_ops

    listing = list_ops(args.dump, op=args.op, module=args.module, phase=args.phase,
                       limit=args.limit, tensors=args.tensors, source=args.source)
    if listing.lines:
        print(listing.format())
    print(listing.counts(), file=sys.stderr)
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from accuracy.dumpfile.extract import extract_file

    print(extract_file(args.dump, args.output, op=args.op, seq=args.seq, module=args.module,
                       overwrite=args.overwrite).format())
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from accuracy.dumpfile.convert import convert_file, convert_folder

    if (args.dump is None) == (args.dump_d is None):
        raise UsageError("give the dump once: `accuracy convert DUMP -o OUT` or, as msaccucmp, "
                         "`-d DUMP_OR_FOLDER -out OUT`")
    src = args.dump if args.dump is not None else args.dump_d
    select = dict(op=args.op, seq=args.seq, module=args.module, overwrite=args.overwrite)
    if os.path.isdir(src):  # a folder of dumps: one subfolder of .npy files per dump
        print(convert_folder(src, args.output, **select).format())
    else:
        print(convert_file(src, args.output, **select).format())
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from accuracy.device_backend import backends_table
    from accuracy.device_backend.registry import format_backends_table

    rows = backends_table()
    print(json.dumps(rows, indent=2, default=str) if args.json else format_backends_table(rows))
    return 0


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv: its first word that is not an option (global options
    take no value)."""
    for a in argv:
        if not a.startswith("-"):
            return a
    return None


DESCRIPTION = """\
Find the op that broke the numbers when a PyTorch model moves to another backend.

Wrap one training step in `with accuracy.dumper("npu.h5"):` on the device and on the golden
backend, then:
  accuracy replay npu.h5 -o replay.h5                    each op's own error
  accuracy compare -m npu.h5 -g gpu.h5 -r replay.h5 -o report/   verdicts, culprit
  accuracy serve --report report/                        browse it at http://127.0.0.1:8000/
`accuracy demo` shows the whole story on an emulated accelerator."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; given argv, only the part owning the command in it is imported."""
    p = argparse.ArgumentParser(prog="accuracy", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument("--traceback", action="store_true",
                   help="show the traceback of an error too (for a bug report)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="what a dump holds: ops, phases, modules, dtypes, bytes")
    s.add_argument("dump")
    s.add_argument("--json", action="store_true")
    s.add_argument("--top", type=at_least(0), default=10, help="how many op names to list")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("ls", help="list recorded ops matching filters")
    s.add_argument("dump")
    s.add_argument("--op", help="op name or glob, e.g. aten.mm or 'aten.*norm*'")
    s.add_argument("--module", help="module path glob, e.g. 'encoder.layers.0.*'")
    s.add_argument("--phase", choices=["forward", "backward", "optimizer"])
    s.add_argument("--tensors", action="store_true", help="also list each tensor's statistics")
    s.add_argument("--source", action="store_true", help="show the source line")
    s.add_argument("--limit", type=at_least(0), default=0, help="list at most this many (0: all)")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser("extract", help="write ops as real HDF5 groups (for h5copy and viewers)")
    s.add_argument("dump")
    s.add_argument("--op")
    s.add_argument("--seq", type=int)
    s.add_argument("--module")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--overwrite", action="store_true")
    s.set_defaults(func=cmd_extract)

    s = sub.add_parser("convert", help="write each tensor of a dump as a .npy file named by "
                                       "its address (like msaccucmp convert)")
    s.add_argument("dump", nargs="?", help="a dump, or a folder of dumps (each converted into "
                                           "OUTPUT/<its name>/)")
    s.add_argument("-d", "--dump-file", dest="dump_d", metavar="DUMP_OR_FOLDER",
                   help="the dump or folder, msaccucmp's spelling")
    s.add_argument("-v", "--version", dest="dump_version", type=int, choices=[1, 2], default=2,
                   help="msaccucmp's dump-format version, accepted so its command lines run "
                        "unchanged (an accuracy dump has one format: no effect)")
    s.add_argument("--op", help="op name or glob")
    s.add_argument("--seq", type=int, help="sequence number of one op")
    s.add_argument("--module", help="module path glob")
    s.add_argument("-o", "-out", "--output", required=True,
                   help="folder for the .npy files and index.json")
    s.add_argument("--overwrite", action="store_true",
                   help="write into a folder that already holds files")
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser("backends", help="device backends present on this machine")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_backends)

    wanted = _command_in(argv) if argv is not None else None
    for name in _PART_CLIS:
        listed = [c for c, (m, _) in _PART_COMMANDS.items() if m == name]
        if argv is not None and listed and wanted not in listed:
            for c in listed:  # not the command being run: listed, not imported
                sub.add_parser(c, help=_PART_COMMANDS[c][1], add_help=False)
            continue
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        mod.register(sub)
    return p


def _quiet_closed_pipe() -> int:
    """stdout's reader went away (`accuracy info x.h5 | head`): stop without a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, as a shell reports a command that a closed pipe stopped


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    # Names from a dump cannot drive the terminal, on stdout or in log lines and warnings.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s",
                        stream=PrintableStream(sys.stderr))
    logging.captureWarnings(True)
    out = sys.stdout
    sys.stdout = PrintableStream(out)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_closed_pipe()
    except AccuracyError as e:  # what the user can fix; anything else is a bug: traceback
        if args.traceback:
            traceback.print_exc()
        print(f"accuracy {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = out
        logging.captureWarnings(False)


# A library message names both spellings ("pass overwrite=True (CLI: --overwrite)"); the
# command line shows its own ("pass --overwrite").
_PY_AND_CLI = re.compile(r"\b\w+=\S+ \(CLI: ([^)]+)\)")


def _one_line(e: BaseException) -> str:
    """The message of an error, on one line ("[Errno 17] File exists: 'x'" made plain), in
    command-line wording."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        text = f"{e.filename}: {e.strerror}"
    elif isinstance(e, KeyError) and e.args:
        text = str(e.args[0])
    else:
        text = str(e) or type(e).__name__
    return shown(_PY_AND_CLI.sub(r"\1", " ".join(text.split())))


if __name__ == "__main__":
    sys.exit(main())
