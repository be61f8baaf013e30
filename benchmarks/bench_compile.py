"""Recording a compiled step: cost against recording the eager step, and compile time.

The bench step (accuracy.examples.bench_setup/bench_step: 4-layer TransformerEncoder, forward
and backward) eager and under `torch.compile` (Inductor, CPU), each bare and dumped in
statistics and tensor mode, interleaved round by round after warm-up, so a shared machine
slows every side alike; each dumped step as a ratio to its own bare step. By default
(`--threads both`) the whole benchmark, compile time included, runs twice, each in its own
process: with torch's default threads, then with OMP_NUM_THREADS=1; `--threads default` or
`--threads N` runs one setting. Met / not met is printed beside each goal.

Goals (issue 26): recording a compiled step costs no more than recording the eager step (ratio
to each one's own bare step, statistics and tensor mode); compile time under the dumper is at
most 1.2x compile time without it.

Goal (issue 47), "standing hooks" (`accuracy.watch_compiled()`: programs compiled with the
kernel hook lines in, no dumper active): the compiled step within 2% of the same step compiled
without them. In one process: the dumper's global module hooks in first (both sides run under
them, as a job with the standing hooks does), a program compiled without the hook lines, then
`watch_compiled()` and a second program of the same function compiled with them; each checked
(a dumped call of each: the plain one's region `not-recorded`, the hooked one's recorded), then
bare steps of both interleaved, round by round (`--idle-rounds`), ratio hooked / plain per
round; and the hook line's own cost, `after_launch` with no dumper timed alone, in ns per
kernel launch, with the launches a step makes. Compile time with the standing hooks is the
third side of the compile-time runs (`standing`: cold and warm caches, with the FX-graph
cache's hits and misses of each side).

Compile time is measured fairly: each side compiles in its own fresh process with its own
fresh `TORCHINDUCTOR_CACHE_DIR` (cold: gcc builds every C++ kernel on both sides, nothing
in-process is shared), then once more in a fresh process over the directory it filled (warm:
a user's rerun; torch's FX-graph and AOTAutograd caches are on, as by default, on both sides:
the dumped side's programs come back from them with their hook lines), warm repeated
`--warm-runs` times (median). Compile time is torch's own account of it
(`torch._dynamo.utils.compilation_time_metrics`: dynamo's frame compiles, with AOTAutograd and
Inductor inside, plus the backward compiled lazily at the first backward). Also printed: the
first call (forward and backward) minus a steady call of the same side, which on the dumped
side also holds the dumper's one-time costs of its first recorded step (file, writer thread,
first-use imports) that are not compiling.

Run: PYTHONPATH=$PWD TORCHINDUCTOR_COMPILE_THREADS=1 .venv/bin/python benchmarks/bench_compile.py
     [--repeat 5] [--warm-runs 3] [--no-compile-time] [--threads both|N]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_threads_arg, run_both_threads, threads_from_argv, verdict

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS (torch is imported in children)

HERE = Path(__file__).resolve().parent


def _child_compile(side: str, tmp: Path) -> None:
    """One side's compile time in this fresh process (cache dir set by the parent)."""
    import torch

    from accuracy import dumper
    from accuracy.examples import bench_setup, bench_step

    model, batch = bench_setup()
    if side == "standing":
        from accuracy import watch_compiled

        assert watch_compiled()
    m = torch.compile(model)

    # The steady call runs in the same dumper context as the first: a new dumper context
    # recompiles (dynamo guards on the global module hooks' handle ids, new per dumper).
    with contextlib.ExitStack() as stack:
        if side == "dumped":
            stack.enter_context(dumper(dump_path=tmp / "compile.h5", mode="statistics",
                                       overwrite=True))
        t0 = time.perf_counter()
        bench_step(m, batch)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        bench_step(m, batch)
        steady = time.perf_counter() - t0
    metrics = torch._dynamo.utils.compilation_time_metrics
    compiled = sum(sum(metrics.get(k, ())) for k in _COMPILE_KEYS)
    inductor = torch._dynamo.utils.counters["inductor"]
    print(json.dumps({"side": side, "first": first, "steady": steady,
                      "first_minus_steady": first - steady, "compile": compiled,
                      "fx_hit": inductor["fxgraph_cache_hit"],
                      "fx_miss": inductor["fxgraph_cache_miss"]}))


# torch's compile-time entries: dynamo's frame compiles (AOTAutograd and Inductor run inside
# them) and the backward AOTAutograd compiles lazily at the first backward
_COMPILE_KEYS = ("_compile.compile_inner", "backward._backward_impl")


def _forward_bare(m, x):
    return m(x)


def _forward_dumped(m, x):
    return m(x)


def _child_steps(repeat: int, tmp: Path) -> None:
    """The step table, in this process's thread setting."""
    import torch
    from _common import interleaved, ratios, spread

    from accuracy import dumper, load_dump
    from accuracy.examples import bench_setup, bench_step

    model, batch = bench_setup()
    # Two compiled callables with their own code objects, so dynamo keeps one program for
    # each: the recorded side's, compiled under the dumper (with hook lines), and the bare
    # side's, compiled without it. (One compiled module called in turn outside and inside the
    # dumper runs the program compiled outside in both: its kernels go unrecorded, and the
    # dump says so, `not-recorded`. The earlier version of this bench did that.)
    plain = functools.partial(torch.compile(_forward_bare), copy.deepcopy(model))
    recorded = functools.partial(torch.compile(_forward_dumped), copy.deepcopy(model))

    def dumped(m, mode: str, name: str):
        def run():
            with dumper(dump_path=tmp / f"{name}.h5", mode=mode, overwrite=True):
                bench_step(m, batch)
        return run

    torch._dynamo.reset()
    dumped(recorded, "statistics", "compiled-statistics")()
    bench_step(plain, batch)
    with load_dump(tmp / "compiled-statistics.h5") as d:
        kernels = sum(1 for r in d.records if r.op.startswith("inductor."))
        status = sorted({r["status"] for r in d.attrs["compiled_regions"]})
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    t = interleaved({
        "eager bare": lambda: bench_step(model, batch),
        "eager statistics": dumped(model, "statistics", "eager-statistics"),
        "eager tensor": dumped(model, "tensor", "eager-tensor"),
        "compiled bare": lambda: bench_step(plain, batch),
        "compiled statistics": dumped(recorded, "statistics", "compiled-statistics"),
        "compiled tensor": dumped(recorded, "tensor", "compiled-tensor"),
    }, repeat=repeat)
    recompiled = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"dynamo graphs compiled during the timed rounds: {recompiled}"
          + (" (each dumped compiled step that recompiled includes its compile)"
             if recompiled else ""))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load after {load}; "
          f"{repeat} interleaved rounds after 1 warm-up; median (min–max)")
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
                nk = sum(1 for r in d.records if r.op.startswith("inductor."))
                seen = sorted({r["status"] for r in d.attrs.get("compiled_regions", [])})
            print(f"{k:22s} {spread(t[k]):>26s}  {spread(r, '{:.2f}'):>24s}  {n}"
                  + (f" ({nk} kernel rows, regions {seen})" if side == "compiled" else ""))
    for mode in ("statistics", "tensor"):
        c, e = ratio[f"compiled {mode}"], ratio[f"eager {mode}"]
        print(f"recording cost, {mode}: compiled {c:.2f}x its bare step, eager {e:.2f}x "
              f"({verdict(c, e, what='compiled <= eager')})")


def _forward_hooked(m, x):
    return m(x)


def _child_idle(rounds: int, tmp: Path) -> None:
    """The standing hooks' idle cost: bare steps of a program compiled with the hook lines
    against the same function's program compiled without them, interleaved."""
    import timeit

    import torch
    from _common import interleaved, ratios, spread

    from accuracy import dumper, load_dump, watch_compiled
    from accuracy.dumper import scope
    from accuracy.dumper.compiled import launches
    from accuracy.examples import bench_setup
    from accuracy.examples import bench_step as step

    model, batch = bench_setup()
    scope.install_kept_hooks()  # both sides under the global module hooks, as in a job
    plain = functools.partial(torch.compile(_forward_bare), copy.deepcopy(model))
    step(plain, batch)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert watch_compiled()
    hooked = functools.partial(torch.compile(_forward_hooked), copy.deepcopy(model))
    step(hooked, batch)
    status = {}
    for name, m in (("plain", plain), ("hooked", hooked)):
        with dumper(dump_path=tmp / f"idle-{name}.h5", mode="statistics", overwrite=True):
            step(m, batch)
        with load_dump(tmp / f"idle-{name}.h5") as d:
            status[name] = (sorted({r["status"] for r in d.attrs["compiled_regions"]}),
                            sum(1 for r in d.records if r.op.startswith("inductor.")))
    launches_per_step = status["hooked"][1]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    t = interleaved({"plain": lambda: step(plain, batch),
                     "hooked": lambda: step(hooked, batch)}, repeat=rounds, warmup=2)
    during = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    r = ratios(t["hooked"], t["plain"])
    kid = next(iter(launches.KERNELS))
    bufs = [torch.empty(1)] * 4
    n = 200_000
    per = min(timeit.repeat(lambda: launches.after_launch(kid, bufs), number=n, repeat=5)) / n
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load after {load}; {rounds} "
          f"interleaved rounds after 2 warm-up; median (min–max)")
    print(f"programs: plain {status['plain'][0]} ({status['plain'][1]} kernel rows when "
          f"dumped), hooked {status['hooked'][0]} ({launches_per_step} kernel rows); dynamo "
          f"graphs compiled after the plain one: {graphs} (the hooked program's), during the "
          f"rounds: {during}")
    print(f"{'plain step':22s} {spread(t['plain']):>26s}")
    print(f"{'hooked step':22s} {spread(t['hooked']):>26s}")
    med = statistics.median(r)
    print(f"standing hooks, idle: hooked / plain {spread(r, '{:.4f}')} per round, median "
          f"{med:.4f} ({verdict(med, 1.02)})")
    print(f"hook line with no dumper: {per * 1e9:.0f} ns per kernel launch x "
          f"{launches_per_step} launches = {per * launches_per_step * 1e6:.1f} µs a step "
          f"({per * launches_per_step / statistics.median(t['plain']) * 100:.2g}% of the plain "
          f"step)")


def _run_child(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warm-runs", type=int, default=3,
                    help="warm compiles per side (fresh processes, alternated; median)")
    ap.add_argument("--no-compile-time", action="store_true",
                    help="skip the compile-time measurement (four fresh compiles)")
    ap.add_argument("--idle-rounds", type=int, default=30,
                    help="interleaved rounds of the standing hooks' idle cost")
    ap.add_argument("--only-standing", action="store_true",
                    help="only the standing hooks' figures: idle cost and compile time")
    ap.add_argument("--child", choices=("compile-bare", "compile-dumped", "compile-standing",
                                        "steps", "idle"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    add_threads_arg(ap, default="both")
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(HERE))
        tmp = Path(args.tmp or tempfile.mkdtemp(prefix="bench_compile_"))
        if args.child == "steps":
            _child_steps(args.repeat, tmp)
        elif args.child == "idle":
            _child_idle(args.idle_rounds, tmp)
        else:
            _child_compile(args.child.removeprefix("compile-"), tmp)
        return
    if args.threads == "both":
        sys.exit(run_both_threads())
    # one thread setting, this process's (--threads set it before anything read it): every
    # child, compile time and step table alike, runs under it
    tmp = Path(tempfile.mkdtemp(prefix="bench_compile_"))
    base = dict(os.environ)
    omp = os.environ.get("OMP_NUM_THREADS")
    print(f"bench_compile: start load {_load()}, temp {tmp}, OMP_NUM_THREADS="
          f"{omp or 'unset (torch default)'}", flush=True)
    sides = ("bare", "standing") if args.only_standing else ("bare", "dumped", "standing")
    if not args.no_compile_time:
        fig: dict[tuple[str, str], list[dict]] = {}
        for temp, runs in (("cold", 1), ("warm", args.warm_runs)):
            for _ in range(runs):
                for side in sides:  # alternated: a neighbour slows every side alike
                    env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"cache-{side}")}
                    out = _run_child(["--child", f"compile-{side}", "--tmp", str(tmp)], env)
                    got = json.loads(out.strip().splitlines()[-1])
                    fig.setdefault((temp, side), []).append(got)
                    print(f"compile {temp} {side}: {got['compile']:.2f} s (first call "
                          f"{got['first']:.2f} s, steady {got['steady']:.2f} s, first - steady "
                          f"{got['first_minus_steady']:.2f} s; FX-graph cache hits "
                          f"{got.get('fx_hit', 0)}, misses {got.get('fx_miss', 0)}), load "
                          f"{_load()}", flush=True)
        for temp in ("cold", "warm"):
            for other, what in (("dumped", "under the dumper"),
                                ("standing", "with the standing hooks")):
                if other not in sides:
                    continue
                runs = list(zip(fig[temp, "bare"], fig[temp, other], strict=True))
                rel = [d["compile"] / b["compile"] for b, d in runs]
                rough = [d["first_minus_steady"] / b["first_minus_steady"] for b, d in runs]
                med = statistics.median(rel)
                print(f"compile time, {temp} caches (each side its own fresh process and "
                      f"cache dir, {len(runs)} run(s)): bare "
                      f"{statistics.median(b['compile'] for b, _ in runs):.2f} s, {what} "
                      f"{statistics.median(d['compile'] for _, d in runs):.2f} s = {med:.2f}x "
                      f"(runs {', '.join(f'{r:.2f}' for r in rel)}; {verdict(med, 1.2)}); "
                      f"first call - steady call: "
                      f"{statistics.median(rough):.2f}x", flush=True)
    env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(tmp / "cache-idle")}
    print(f"\n-- standing hooks, idle (OMP_NUM_THREADS={omp or 'unset (torch default)'}), "
          f"load before {_load()}", flush=True)
    print(_run_child(["--child", "idle", "--idle-rounds", str(args.idle_rounds), "--tmp",
                      str(tmp)], env), end="", flush=True)
    if args.only_standing:
        return
    env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(tmp / "cache-steps")}
    print(f"\n-- OMP_NUM_THREADS={omp or 'unset (torch default)'}, load before {_load()}",
          flush=True)
    print(_run_child(["--child", "steps", "--repeat", str(args.repeat), "--tmp", str(tmp)], env),
          end="", flush=True)


if __name__ == "__main__":
    main()
