"""`accuracy prove`: proof by substitution from the command line.

A dump holds the ops a step ran, not the step: the step functions come from `--step
module:function` (and `--golden-step`, `--context`), importable from the current folder.
The culprit comes from `--culprit OP[@MODULE]`, or else from comparing the two dumps given.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from accuracy.errors import InputNotFoundError, UsageError


def load_callable(spec: str) -> Any:
    """`package.module:function` or `path/to/file.py:function` -> the function."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise UsageError(f"{spec!r}: write module:function, e.g. mysteps:device_step")
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise InputNotFoundError(f"{target}: no such file")
        name = "_accuracy_user_" + os.path.splitext(os.path.basename(target))[0]
        loader_spec = importlib.util.spec_from_file_location(name, target)
        if loader_spec is None or loader_spec.loader is None:
            raise UsageError(f"{target}: cannot be imported")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise UsageError(f"{spec!r}: cannot import {target} ({e}); run from the folder "
                             "that holds it or give a path/to/file.py") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{spec!r}: {target} has no function {attr}")
    return fn


def _culprit_from_dumps(device: str, golden: str, replay: str | None) -> str:
    from accuracy.compare import compare

    summary = compare(device, golden, replay=replay).summary
    c = summary.get("culprit")
    if not c or not c.get("op"):
        raise UsageError(f"compare of {device} and {golden} names no culprit; give one with "
                         "--culprit OP[@MODULE]")
    return c["op"] + (f"@{c['module']}" if c.get("module") else "")


def _cmd(args: Any) -> int:
    from accuracy.live.prove import prove

    culprits = list(args.culprit or [])
    if not culprits:
        if not (args.device and args.golden):
            raise UsageError("give --culprit OP[@MODULE], or the device and golden dumps to "
                             "find it by comparing them")
        culprits = [_culprit_from_dumps(args.device, args.golden, args.replay)]
        print(f"culprit from compare: {culprits[0]}")
    step = load_callable(args.step)
    golden = load_callable(args.golden_step)
    context = load_callable(args.context) if args.context else None
    proof = prove(step, culprits=culprits, golden=golden, context=context, on=args.on,
                  dtype=args.dtype, seed=args.seed, report=args.report)
    print(proof.format(os.path.join(args.report, "proof.html")))
    return 0 if proof.convincing or not args.fail_unconvincing else 1


def register(sub: Any) -> None:
    s = sub.add_parser("prove", help="prove a culprit: substitute it by the reference and "
                                     "measure how much of the loss/gradient gap closes")
    s.add_argument("device", nargs="?", help="device dump (to find the culprit by compare)")
    s.add_argument("golden", nargs="?", help="golden dump (to find the culprit by compare)")
    s.add_argument("--replay", help="replay of the device dump, for compare's culprit")
    s.add_argument("--step", required=True,
                   help="module:function running one device step from a fresh seeded state, "
                        "returning the loss or (loss, model)")
    s.add_argument("--golden-step", required=True, help="module:function, the golden step")
    s.add_argument("--context", help="module:function returning a context manager that puts "
                                     "the step on the device (e.g. a sim(...))")
    s.add_argument("--culprit", action="append",
                   help="OP or OP@MODULE (repeatable), e.g. aten.gelu.default@encoder.layers.2")
    s.add_argument("--on", default="cpu", help="reference backend")
    s.add_argument("--dtype", help="run substituted ops at this dtype (default: their own)")
    s.add_argument("--seed", type=int, default=0, help="seed of the control's random choice")
    s.add_argument("--report", required=True, help="folder for proof.json and proof.html")
    s.add_argument("--fail-unconvincing", action="store_true",
                   help="exit 1 unless the culprit closes >=90%% and the control <=10%%")
    s.set_defaults(func=_cmd)
