"""The monitor's costs on the benchmark step (accuracy.examples.bench_setup/bench_step + AdamW).

Figures:
- monitor every step vs the bare step (goal <= 1.10x), steps interleaved so load drifts hit
  both alike; the median of per-step times;
- a snapshot (model + optimizer state + RNG states + the batch): time and bytes per snapshot;
- trigger to report: a step flagged at step 13 with snapshots every 10, captured by re-running
  steps 10..13 with the dumper on step 13, replayed and compared.

    python benchmarks/bench_monitor.py                      # default threads
    OMP_NUM_THREADS=1 python benchmarks/bench_monitor.py    # one thread
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import accuracy.monitor as am  # noqa: E402
from accuracy.examples import bench_setup, bench_step  # noqa: E402
from accuracy.monitor.snapshots import State  # noqa: E402


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _trainer(seed: int = 0):
    model, batch = bench_setup(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        opt.zero_grad()
        loss = bench_step(model, (x, y))
        opt.step()
        return loss

    return model, opt, batch, step


def overhead(steps: int, folder: Path) -> dict[str, float]:
    """Median per-step seconds, bare vs monitored every step (no snapshots), interleaved."""
    m1, o1, b1, bare = _trainer()
    m2, o2, b2, raw = _trainer()
    mon = am.watch(raw, m2, o2, path=folder / "bench.monitor.h5", snapshot_every=None,
                   overwrite=True)
    for _ in range(3):  # warm-up (allocator, first AdamW step, file creation)
        bare(*b1)
        mon(*b2)
    t_bare, t_mon, c_bare, c_mon = [], [], [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        bare(*b1)
        t1, c1 = time.perf_counter(), time.process_time()
        mon(*b2)
        t2, c2 = time.perf_counter(), time.process_time()
        t_bare.append(t1 - t0)
        t_mon.append(t2 - t1)
        c_bare.append(c1 - c0)
        c_mon.append(c2 - c1)
    mon.monitor.close()
    b, m = statistics.median(t_bare), statistics.median(t_mon)
    cb, cm = statistics.median(c_bare), statistics.median(c_mon)
    return {"bare_s": b, "monitor_s": m, "ratio": m / b, "cpu_ratio": cm / cb,
            "modules": len(mon.monitor.collector.module_names),
            "params": len(mon.monitor.collector.param_names)}


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
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"threads {threads} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}), "
              f"load {_load()}")
        o = overhead(args.steps, folder)
        print(f"monitor every step: bare {o['bare_s'] * 1e3:.1f} ms, monitored "
              f"{o['monitor_s'] * 1e3:.1f} ms, ratio {o['ratio']:.3f}x wall, {o['cpu_ratio']:.3f}x "
              f"CPU time ({o['modules']} modules, "
              f"{o['params']} parameters), load {_load()}")
        s = snapshot_cost(10)
        print(f"snapshot: {s['snapshot_s'] * 1e3:.1f} ms, {s['snapshot_mb']:.1f} MB state + "
              f"{s['batch_mb']:.2f} MB per kept batch, load {_load()}")
        if not args.no_capture:
            c = trigger_to_report(folder)
            print(f"trigger to report: {c['capture_s']:.2f} s (re-ran {c['rerun_steps']} steps, "
                  f"dumped 1, replayed, compared; exact {c['exact']}), load {_load()}")


if __name__ == "__main__":
    main()
