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

A/B against another version of the figures (the module that does the monitor's work), in the
same process, steps interleaved bare / this version / that version:

    git show main:accuracy/monitor/figures.py > /tmp/figures_main.py
    python benchmarks/bench_monitor.py --against /tmp/figures_main.py --no-capture
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
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

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each (default 30)")
    ap.add_argument("--no-capture", action="store_true", help="skip trigger-to-report")
    ap.add_argument("--against", type=Path, help="another figures.py to A/B against")
    ap.add_argument("--profile", action="store_true",
                    help="print the thread CPU time of the monitor's parts and stop")
    ap.add_argument("--model", choices=("bench", "qwen2"), default="bench",
                    help="the benchmark step, or a tiny transformers Qwen2 (many small modules)")
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    logging.basicConfig(level=logging.ERROR)
    global MODEL
    MODEL = args.model
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"threads {threads} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}), "
              f"load {_load()}")
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
