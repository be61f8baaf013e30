"""The monitor's costs on the benchmark step (accuracy.examples.bench_setup/bench_step + AdamW).

Figures:
- monitor every step vs the bare step (goal <= 1.10x), steps interleaved so load drifts hit
  both alike; the median of per-step times;
- a snapshot (model + optimizer state + RNG states + the batch): time and bytes per snapshot;
- trigger to report: a step flagged at step 13 with snapshots every 10, captured by re-running
  steps 10..13 with the dumper on step 13, replayed and compared.

Met / not met is printed beside the goal. `--threads both` runs it twice from one command, each
in a fresh process: torch's default threads, then OMP_NUM_THREADS=1; `--threads N` sets
OMP_NUM_THREADS (without the flag, the environment's setting holds).

Run: python benchmarks/bench_monitor.py [--steps 30] [--no-capture] [--threads both|N]

The monitor at its defaults in two checkouts (before / after a change), each against the bare
step, in alternating processes (CPU time of the fastest processes):

    git archive main | tar -x -C /tmp/main-tree
    python benchmarks/bench_monitor.py --model qwen2 --ab before=/tmp/main-tree after=. \
        --rounds 3 --steps 40 --threads both

What each part of the monitor costs (each arm adds one part to the one before, in one process
stepped interleaved; the fastest of N processes):

    python benchmarks/bench_monitor.py --model qwen2 --parts 2 --steps 30 --threads both

A/B against another version of the figures (the module that does the monitor's work), in the
same process, steps interleaved bare / this version / that version:

    git show main:accuracy/monitor/figures.py > /tmp/figures_main.py
    python benchmarks/bench_monitor.py --against /tmp/figures_main.py --no-capture
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import add_threads_arg, run_both_threads, threads_from_argv, verdict

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

import torch

if __package__ in (None, ""):  # this checkout, or the one an --ab child measures
    sys.path.insert(0, os.environ.get("BENCH_MONITOR_TREE")
                    or str(Path(__file__).resolve().parents[1]))

import accuracy.monitor as am  # noqa: E402
from accuracy.examples import bench_setup, bench_step  # noqa: E402
from accuracy.monitor.snapshots import State  # noqa: E402


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


MODEL = "bench"  # --model: "bench" (the benchmark step) or "qwen2" (many small modules)


def _qwen2(seed: int):
    """A tiny random-init `transformers` Qwen2 (2 layers, 33 modules: many small ops), batch 4
    of 64 tokens: the model the issue measured the monitor's cost on."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 512, (4, 64), generator=g)
    return model, (ids, ids.clone())


def _trainer(seed: int = 0):
    if MODEL == "qwen2":
        model, batch = _qwen2(seed)
    else:
        model, batch = bench_setup(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        opt.zero_grad()
        if MODEL == "qwen2":
            loss = model(input_ids=x, labels=y).loss
            loss.backward()
        else:
            loss = bench_step(model, (x, y))
        opt.step()
        return loss

    return model, opt, batch, step


def _against(mon: am.Monitor, figures_file: Path) -> None:
    """Swap the monitor's collector for the `Collector` of another figures.py (A/B)."""
    spec = importlib.util.spec_from_file_location("figures_against", figures_file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {figures_file}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mon.collector.close()
    mon.collector = mod.Collector(mon.model, mon.optimizer)


def overhead(steps: int, folder: Path, against: Path | None = None,
             defaults: bool = False) -> dict[str, float]:
    """Median per-step seconds, bare vs monitored every step, interleaved; `defaults`: the
    monitor as made with no options (snapshots every 10 steps, the batch kept each step),
    else figures only (no snapshots). With `against`, a third arm with the same options,
    monitored by that figures.py's Collector."""
    m1, o1, b1, bare = _trainer()
    arms = {"bare": bare}
    m2, o2, b2, raw = _trainer()
    snap = {} if defaults else {"snapshot_every": None}
    arms["monitor"] = mon = am.watch(raw, m2, o2, path=folder / "bench.monitor.h5",
                                     overwrite=True, **snap)
    if against is not None:
        m3, o3, b3, raw3 = _trainer()
        arms["against"] = am.watch(raw3, m3, o3, path=folder / "against.monitor.h5",
                                   overwrite=True, **snap)  # the same options: an A/B
        _against(arms["against"].monitor, against)
    for _ in range(3):  # warm-up (allocator, first AdamW step, file creation)
        for fn in arms.values():
            fn(*b1)
    wall: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(steps):
        names = list(arms) if i % 2 == 0 else list(arms)[::-1]  # no arm always goes first
        for k in names:
            t0, c0 = time.perf_counter(), time.process_time()
            arms[k](*b1)
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    for k, fn in arms.items():
        if k != "bare":
            fn.monitor.close()
    med = {k: statistics.median(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    out = {"bare_s": med["bare"], "monitor_s": med["monitor"],
           "ratio": med["monitor"] / med["bare"], "cpu_ratio": cmed["monitor"] / cmed["bare"],
           "modules": len(mon.monitor.collector.module_names),
           "params": len(mon.monitor.collector.param_names)}
    if against is not None:
        out |= {"against_s": med["against"], "against_ratio": med["against"] / med["bare"],
                "against_cpu_ratio": cmed["against"] / cmed["bare"]}
    return out


_PARTS = {"hook": "forward hooks", "_pre_step": "optimizer pre-step hook",
          "_post_step": "optimizer post-step hook", "collect": "step end: read-back, figures",
          "append": "HDF5 row append", "monitored": "whole monitored step"}


def profile(steps: int, folder: Path, against: Path | None = None) -> dict[str, dict]:
    """Thread CPU ms per step in the monitor's parts (cProfile, `time.thread_time`), for this
    version and, with `against`, that figures.py."""
    import cProfile
    import pstats

    out: dict[str, dict] = {}
    for label, fig in (("this", None), ("against", against)):
        if label == "against" and fig is None:
            continue
        model, opt, batch, step = _trainer()
        mon = am.watch(step, model, opt, path=folder / f"prof-{label}.monitor.h5",
                       snapshot_every=None, overwrite=True)
        if fig is not None:
            _against(mon.monitor, fig)
        for _ in range(2):
            mon(*batch)
        pr = cProfile.Profile(timer=time.thread_time)
        pr.enable()
        for _ in range(steps):
            mon(*batch)
        pr.disable()
        parts = dict.fromkeys(_PARTS, 0.0)
        for (f, _ln, fn), row in pstats.Stats(pr).stats.items():  # type: ignore[attr-defined]
            if fn in parts and ("accuracy/monitor/" in f or (fig is not None and f == str(fig))):
                parts[fn] += row[3] / steps * 1e3
        out[label] = parts
        mon.monitor.close()
    return out


def snapshot_cost(reps: int) -> dict[str, float]:
    model, opt, batch, step = _trainer()
    step(*batch)  # optimizer state exists
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        snap = State.take(0, model, opt)
        times.append(time.perf_counter() - t0)
    batch_bytes = sum(t.numel() * t.element_size() for t in batch)
    return {"snapshot_s": statistics.median(times), "snapshot_mb": snap.nbytes / 1e6,
            "batch_mb": batch_bytes / 1e6}


def trigger_to_report(folder: Path) -> dict[str, float]:
    model, opt, batch, step = _trainer()
    mon_step = am.watch(step, model, opt, path=folder / "cap.monitor.h5", snapshot_every=10,
                        overwrite=True, triggers=[am.Predicate(lambda s: s.step == 13)])
    for _ in range(14):
        mon_step(*batch)
    mon_step.monitor.close()
    cap = mon_step.monitor.captures[0]
    return {"capture_s": cap.seconds, "rerun_steps": 13 - (cap.snapshot_step or 0) + 1,
            "exact": bool(cap.exact)}


# -- per part -------------------------------------------------------------------------------

# each arm adds one part to the one before: a part's cost is its arm's CPU time minus the
# previous arm's. "frame": the monitor's step hooks and forward hooks that do nothing.
PART_ARMS = ("bare", "frame", "+activations", "+gradients", "+parameters", "+updates",
             "+state", "+triggers", "+row write", "+flush", "+snapshots")


def _part_arm(arm: str, folder: Path):
    """A monitored step whose monitor skips the parts after `arm` (measurement only: the
    parts are knocked out on this monitor's own objects)."""
    from accuracy.monitor import figures as fig

    model, opt, batch, step = _trainer()
    if arm == "bare":
        return step
    at = PART_ARMS.index(arm)
    off = set(PART_ARMS[at + 1:])
    # the old defaults where the options exist (every figure every step, every row at once)
    extra = {k: 1 for k in ("detail_every", "flush_every")
             if k in am.Monitor.__init__.__code__.co_varnames}
    fn = am.watch(step, model, opt, path=folder / f"{arm.strip('+')}.monitor.h5",
                  snapshot_every=10 if "+snapshots" not in off else None,
                  triggers="default" if "+triggers" not in off else None, **extra)
    mon = fn.monitor
    col = mon.collector
    if "+activations" in off:  # the hooks stay, doing nothing
        n = len(col.module_names)
        for h in col._handles[:n]:
            h.remove()
        col._handles[:n] = [m.register_forward_hook(lambda *_: None)
                            for name, m in model.named_modules()][:n]
    if "+gradients" in off:
        col._grad_figures = lambda: setattr(col, "_grads", ([], fig._Reductions()))
    if "+parameters" in off:
        collect = col.collect

        def without_parameter_norms():
            saved, calls = fig._norm_values, []

            def first_nan(ts):  # collect's first call: the parameters' norms
                calls.append(1)
                return [fig.NAN] * len(ts) if len(calls) == 1 else saved(ts)
            fig._norm_values = first_nan
            try:
                return collect()
            finally:
                fig._norm_values = saved
        col.collect = without_parameter_norms
    if "+updates" in off:
        col._keep_parameters = lambda: None
    if "+state" in off:
        col._state_norms = lambda *a: []
    if "+row write" in off:
        mon.writer.append = lambda row: None
    if "+flush" in off:
        append = mon.writer.append

        def append_unflushed(row):
            append(row)
            if mon.writer._f is not None:
                mon.writer._f.flush = lambda: None
        mon.writer.append = append_unflushed
    fn.batch = batch
    return fn


def parts(steps: int, rounds: int) -> dict[str, float]:
    """CPU ms per step of each arm of PART_ARMS: every arm in one process, stepped
    interleaved (the order turned each step), the median of each arm's per-step CPU time;
    `rounds` processes, the fastest of each arm's medians."""
    import json
    import subprocess

    best: dict[str, float] = {}
    for _ in range(rounds):
        proc = subprocess.run([sys.executable, __file__, "--part-child", "all", "--model",
                               MODEL, "--steps", str(steps)], capture_output=True, text=True,
                              check=False, timeout=1800)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not line:
            raise SystemExit(proc.stderr[-2000:])
        for arm, v in json.loads(line[-1]).items():
            best[arm] = min(best.get(arm, math.inf), v)
    return best


def _part_child(steps: int) -> None:
    import json

    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        arms = {a: _part_arm(a, Path(tmp)) for a in PART_ARMS}
        _, _, batch, _ = _trainer()
        for _ in range(5):
            for fn in arms.values():
                fn(*batch)
        cpu: dict[str, list[float]] = {a: [] for a in arms}
        for i in range(steps):
            for a in (PART_ARMS if i % 2 == 0 else PART_ARMS[::-1]):
                c0 = time.process_time()
                arms[a](*batch)
                cpu[a].append(time.process_time() - c0)
        for a, fn in arms.items():
            if a != "bare":
                fn.monitor.close()
    print(json.dumps({a: statistics.median(v) for a, v in cpu.items()}))


def _ab_child(steps: int) -> None:
    """One process of `--ab`: bare and monitored (the monitor at its defaults, as this
    process's `accuracy` makes it) stepped interleaved; prints their per-step medians."""
    import json

    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        _, _, batch, bare = _trainer()
        m, o, _, raw = _trainer()
        arms = {"bare": bare, "monitor": am.watch(raw, m, o, path=Path(tmp) / "ab.monitor.h5")}
        for _ in range(5):
            for fn in arms.values():
                fn(*batch)
        cpu: dict[str, list[float]] = {a: [] for a in arms}
        wall: dict[str, list[float]] = {a: [] for a in arms}
        for i in range(steps):
            for a in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
                c0, t0 = time.process_time(), time.perf_counter()
                arms[a](*batch)
                cpu[a].append(time.process_time() - c0)
                wall[a].append(time.perf_counter() - t0)
        arms["monitor"].monitor.close()
    # the median is a step without the every-Nth work (snapshots, detail figures, a batch's
    # write); the mean spreads that work over the steps
    print(json.dumps({f"{k}_{a}": statistics.median(v[a]) for k, v in (("cpu", cpu),
                                                                        ("wall", wall))
                      for a in arms} | {f"mean_{a}": statistics.fmean(cpu[a]) for a in arms}
                     | {"load": os.getloadavg()[0]}))


def ab(trees: dict[str, Path], steps: int, rounds: int) -> None:
    """Each tree's monitor at its defaults against the bare step, in alternating processes
    (one per tree per round, its `accuracy` from that tree): per round the monitored/bare
    ratio of the medians in that process; the summary, the fastest process's CPU time of
    each arm (monitored over bare) and the median of the rounds' ratios."""
    import json
    import subprocess

    got: dict[str, list[dict]] = {k: [] for k in trees}
    for r in range(rounds):
        for label in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            env = dict(os.environ, BENCH_MONITOR_TREE=str(trees[label].resolve()),
                       PYTHONPATH=str(trees[label].resolve()))
            proc = subprocess.run([sys.executable, __file__, "--ab-child", "--model", MODEL,
                                   "--steps", str(steps)], env=env, capture_output=True,
                                  text=True, check=False, timeout=3000)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode or not line:
                raise SystemExit(f"{label}: {proc.stderr[-2000:]}")
            x = json.loads(line[-1])
            got[label].append(x)
            print(f"  round {r} {label:8s} bare {x['cpu_bare'] * 1e3:7.1f} ms CPU, monitored "
                  f"{x['cpu_monitor'] / x['cpu_bare']:.3f}x CPU (mean of the steps "
                  f"{x['mean_monitor'] / x['mean_bare']:.3f}x), "
                  f"{x['wall_monitor'] / x['wall_bare']:.3f}x wall, load {x['load']:.1f}",
                  flush=True)
    for label, xs in got.items():
        fastest = min(x["cpu_monitor"] for x in xs) / min(x["cpu_bare"] for x in xs)
        med = statistics.median(x["cpu_monitor"] / x["cpu_bare"] for x in xs)
        medw = statistics.median(x["wall_monitor"] / x["wall_bare"] for x in xs)
        mean = min(x["mean_monitor"] for x in xs) / min(x["mean_bare"] for x in xs)
        if torch.get_num_threads() > 1:
            # the bare step's CPU counts every torch thread, the monitor's Python runs on
            # one: the CPU ratio understates what the step's time shows; judged by wall time
            print(f"{label}: monitor at its defaults {medw:.3f}x bare by the step's wall "
                  f"time, median of rounds ({verdict(medw, 1.10, what='<= 1.10x')}); "
                  f"{fastest:.3f}x by the fastest processes' CPU time, which understates it "
                  f"with {torch.get_num_threads()} threads; median of rounds {med:.3f}x CPU; "
                  f"by the mean step (the every-Nth work spread over the steps) {mean:.3f}x "
                  "CPU")
            continue
        print(f"{label}: monitor at its defaults {fastest:.3f}x bare by the fastest "
              f"processes' CPU time ({verdict(fastest, 1.10, what='<= 1.10x')}); median of "
              f"rounds {med:.3f}x CPU, {medw:.3f}x wall; by the mean step (the every-Nth "
              f"work spread over the steps) {mean:.3f}x CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each (default 30)")
    ap.add_argument("--no-capture", action="store_true", help="skip trigger-to-report")
    ap.add_argument("--against", type=Path, help="another figures.py to A/B against")
    ap.add_argument("--profile", action="store_true",
                    help="print the thread CPU time of the monitor's parts and stop")
    ap.add_argument("--model", choices=("bench", "qwen2"), default="bench",
                    help="the benchmark step, or a tiny transformers Qwen2 (many small modules)")
    ap.add_argument("--parts", type=int, metavar="ROUNDS", default=0,
                    help="the cost of each part of the monitor, each arm in its own process, "
                         "interleaved for ROUNDS rounds (fastest CPU time of each)")
    ap.add_argument("--part-child", choices=("all",), help=argparse.SUPPRESS)
    ap.add_argument("--ab", nargs="+", metavar="LABEL=CHECKOUT",
                    help="the monitor at its defaults in each checkout against the bare step, "
                         "in alternating processes (e.g. before=/tmp/main after=.)")
    ap.add_argument("--rounds", type=int, default=3, help="--ab: processes per checkout")
    ap.add_argument("--ab-child", action="store_true", help=argparse.SUPPRESS)
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    logging.basicConfig(level=logging.ERROR)
    global MODEL
    MODEL = args.model
    if args.part_child:
        _part_child(args.steps)
        return
    if args.ab_child:
        _ab_child(args.steps)
        return
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"threads {threads} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}), "
              f"load {_load()}")
        if args.ab:
            trees = dict(a.split("=", 1) for a in args.ab)
            print(f"model: {args.model}; {args.rounds} rounds of {args.steps} interleaved steps")
            ab({k: Path(v) for k, v in trees.items()}, args.steps, args.rounds)
            print(f"load {_load()}")
            return
        if args.parts:
            print(f"model: {args.model}; each arm adds a part to the one above; {args.parts} "
                  f"processes of {args.steps} interleaved steps: the fastest median")
            best = parts(args.steps, args.parts)
            prev = None
            for arm in PART_ARMS:
                adds = "" if prev is None else f"{(best[arm] - best[prev]) * 1e3:+.2f} ms"
                print(f"{arm:14s} {best[arm] * 1e3:8.2f} ms CPU  {best[arm] / best['bare']:.3f}x"
                      f"  {adds}")
                prev = arm
            print(f"load {_load()}")
            return
        if args.profile:
            prof = profile(min(args.steps, 5), folder, args.against)
            for key, what in _PARTS.items():
                print(f"{what:32s} " + "  ".join(f"{lab} {p[key]:7.1f} ms"
                                                 for lab, p in prof.items()))
            print(f"load {_load()}")
            return
        print(f"model: {args.model}")
        for defaults in (True, False):
            o = overhead(args.steps, folder, args.against, defaults)
            what = "at its defaults (snapshots every 10)" if defaults else "figures only"
            print(f"monitor every step, {what}: bare {o['bare_s'] * 1e3:.1f} ms, monitored "
                  f"{o['monitor_s'] * 1e3:.1f} ms, ratio {o['ratio']:.3f}x wall "
                  f"({verdict(o['ratio'], 1.10, what='<= 1.10x')}), {o['cpu_ratio']:.3f}x CPU "
                  f"time ({o['modules']} modules, {o['params']} parameters), load {_load()}")
            if args.against is not None:
                print(f"  against {args.against}: {o['against_s'] * 1e3:.1f} ms, ratio "
                      f"{o['against_ratio']:.3f}x wall, {o['against_cpu_ratio']:.3f}x CPU time")
        s = snapshot_cost(10)
        print(f"snapshot: {s['snapshot_s'] * 1e3:.1f} ms, {s['snapshot_mb']:.1f} MB state + "
              f"{s['batch_mb']:.2f} MB per kept batch, load {_load()}")
        if not args.no_capture:
            c = trigger_to_report(folder)
            print(f"trigger to report: {c['capture_s']:.2f} s (re-ran {c['rerun_steps']} steps, "
                  f"dumped 1, replayed, compared; exact {c['exact']}), load {_load()}")


if __name__ == "__main__":
    main()
