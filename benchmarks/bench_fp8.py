"""Overhead of the fp8/MX sim profiles and of their quantisation figures, per training step.

One step (forward + backward) of the benchmark transformer (`accuracy.examples.tiny_lm`,
larger than the tests' so that GEMMs weigh), timed interleaved (A B C A B C ...) so that a
shared machine slows every variant alike:

- bare step; sim exact (dispatch only); sim fp16-cube (rounding, the old kind of profile);
- sim fp8 / fp8-delayed / mxfp8 / mxfp4 (quantisation + figures, nothing recorded);
- the same under `dumper(mode="statistics")`: figures written into each GEMM's record;
- quantisation alone: the figures' share is measured by `quantize(..., figures=False)`.

    python benchmarks/bench_fp8.py [--repeat 5] [--layers 4] [--d 256] [--threads both|N]

Without `--threads` it runs on one torch thread, as its figures always did.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import threads_from_argv

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_threads_arg, interleaved, run_both_threads  # noqa: E402

from accuracy.device_backend import sim  # noqa: E402
from accuracy.device_backend.formats import E4M3, quantize  # noqa: E402
from accuracy.dumper import dumper  # noqa: E402
from accuracy.examples import lm_batch, lm_step, tiny_lm  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=256)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    if args.threads == "both":
        return run_both_threads(argv)
    if not args.threads:  # as before the option: one thread
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_lm(layers=args.layers, d_model=args.d, ff=4 * args.d)
    batch = lm_batch(batch=4, seq=64)
    tmp = tempfile.mkdtemp(prefix="bench_fp8_")

    def run(profile: str | None, dump: bool):
        def fn() -> None:
            model.zero_grad(set_to_none=True)
            ctx = sim(profile=profile) if profile else contextlib.nullcontext()
            path = os.path.join(tmp, "d.h5")
            dctx = dumper(path, mode="statistics", overwrite=True) if dump \
                else contextlib.nullcontext()
            with ctx, dctx:
                lm_step(model, batch)
        return fn

    variants = {"bare": run(None, False), "sim exact": run("exact", False),
                "sim fp16-cube": run("fp16-cube", False)}
    for p in ("fp8", "fp8-delayed", "mxfp8", "mxfp4"):
        variants[f"sim {p}"] = run(p, False)
    variants["stats dump, sim exact"] = run("exact", True)
    for p in ("fp8", "mxfp8"):
        variants[f"stats dump, sim {p}"] = run(p, True)
    times = interleaved(variants, args.repeat)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"load average: {os.getloadavg()}")
    print(f"tiny_lm(layers={args.layers}, d={args.d}), batch 4 x 64, {args.repeat} runs each; "
          f"torch {torch.__version__}, threads {torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')})\n")
    print("| variant | median s | x bare | x sim exact |")
    print("| --- | ---: | ---: | ---: |")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v / med['bare']:.2f} | {v / med['sim exact']:.2f} |")
    # the figures' own share: one 256x1024 operand quantised with and without them
    x = torch.randn(256, 1024)
    q = interleaved({"with figures": lambda: quantize(x, E4M3),
                     "without": lambda: quantize(x, E4M3, figures=False)}, 20)
    a, b = statistics.median(q["with figures"]), statistics.median(q["without"])
    print(f"\nquantize one 256x1024 operand (e4m3, per tensor): {1e3 * b:.2f} ms, with "
          f"figures {1e3 * a:.2f} ms (figures x{a / b:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
