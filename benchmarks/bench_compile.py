"""Recording a compiled step: cost against recording the eager step, and compile time.

The bench step (accuracy.examples.bench_setup/bench_step: 4-layer TransformerEncoder, forward
and backward) eager and under `torch.compile` (Inductor, CPU), each bare and dumped in
statistics and tensor mode, interleaved round by round after warm-up, so a shared machine
slows every side alike. Goals (issue 26): recording a compiled step costs no more than
recording the eager step, each as a ratio to its own bare step; compile time under the
dumper is at most 1.2x compile time without it (first call, forward and backward, fresh
dynamo state, FX-graph and AOTAutograd caches off on both sides as the dumper turns them off;
the dumper compiles first, with a cold code cache; the bare compile then finds the C++
kernels gcc built, which favours it).

Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_compile.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import interleaved, ratios, spread

from accuracy import dumper, load_dump
from accuracy.examples import bench_setup, bench_step


def _first_call(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_compile_"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    model, batch = bench_setup()
    plain, recorded = torch.compile(copy.deepcopy(model)), torch.compile(copy.deepcopy(model))

    def dumped(m, mode: str, name: str):
        def run():
            with dumper(dump_path=tmp / f"{name}.h5", mode=mode, overwrite=True):
                bench_step(m, batch)
        return run

    # Compiled under the dumper first, with a cold Inductor code cache (gcc builds every
    # kernel); then, after a reset, bare, finding those C++ kernels built: a comparison that
    # favours the bare compile. Both models share their forward's code, so dynamo's cache
    # holds one program: the bare compiled step runs it too, with no recording source
    # attached (one no-op call per kernel); the second compile below restores the hooked one.
    torch._dynamo.reset()
    compile_dumped = _first_call(dumped(recorded, "statistics", "compiled-statistics"))
    torch._dynamo.reset()
    compile_bare = _first_call(lambda: bench_step(plain, batch))
    torch._dynamo.reset()
    dumped(recorded, "statistics", "compiled-statistics")()
    with load_dump(tmp / "compiled-statistics.h5") as d:
        kernels = sum(1 for r in d.records if r.op.startswith("inductor."))
        status = [r["status"] for r in d.attrs["compiled_regions"]]
    t = interleaved({
        "eager bare": lambda: bench_step(model, batch),
        "eager statistics": dumped(model, "statistics", "eager-statistics"),
        "eager tensor": dumped(model, "tensor", "eager-tensor"),
        "compiled bare": lambda: bench_step(plain, batch),
        "compiled statistics": dumped(recorded, "statistics", "compiled-statistics"),
        "compiled tensor": dumped(recorded, "tensor", "compiled-tensor"),
    }, repeat=args.repeat)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load {load}; "
          f"{args.repeat} interleaved rounds after 1 warm-up; median (min–max)")
    print(f"compiled regions {status}, {kernels} Inductor kernel rows per step")
    print(f"{'run':22s} {'seconds':>26s}  {'x own bare step':>24s}  rows")
    ratio = {}
    for side in ("eager", "compiled"):
        bare = t[f"{side} bare"]
        print(f"{side + ' bare':22s} {spread(bare):>26s}")
        for mode in ("statistics", "tensor"):
            k = f"{side} {mode}"
            r = ratios(t[k], bare)
            ratio[k] = statistics.median(r)
            with load_dump(tmp / f"{side}-{mode}.h5") as d:
                n = len(d.records)
            print(f"{k:22s} {spread(t[k]):>26s}  {spread(r, '{:.2f}'):>24s}  {n}")
    for mode in ("statistics", "tensor"):
        c, e = ratio[f"compiled {mode}"], ratio[f"eager {mode}"]
        print(f"recording cost, {mode}: compiled {c:.2f}x its bare step, eager {e:.2f}x "
              f"(goal compiled <= eager: {'met' if c <= e else 'not met'})")
    cr = compile_dumped / compile_bare
    print(f"compile (first call, fwd+bwd): bare {compile_bare:.1f} s, under the dumper "
          f"{compile_dumped:.1f} s = {cr:.2f}x (goal <= 1.2x: {'met' if cr <= 1.2 else 'not met'})")


if __name__ == "__main__":
    main()
