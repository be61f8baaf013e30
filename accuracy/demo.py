"""`accuracy demo`: dump one training step of a small built-in model and show what was recorded."""

from __future__ import annotations

import argparse
from pathlib import Path

from accuracy.dumper import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm


def run_demo(out_dir: str | Path = "demo_out") -> Path:
    """Dump one training step (forward, backward) of the tiny LM in tensor mode."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "golden_cpu.h5"
    model, batch = tiny_lm(), lm_batch()
    with dumper(dump_path=path, overwrite=True):
        lm_step(model, batch)
    return path


def _cmd(args: argparse.Namespace) -> int:
    from accuracy.cli import main

    path = run_demo(args.out)
    print(f"dumped one training step to {path}\n")
    return main(["info", str(path)])


def register(sub) -> None:
    s = sub.add_parser("demo", help="run the end-to-end demo on a small built-in model")
    s.add_argument("--out", default="demo_out", help="folder for the demo's files")
    s.set_defaults(func=_cmd)
