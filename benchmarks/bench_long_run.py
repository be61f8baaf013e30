"""Long runs: what a debugger costs on the steps it does not record.

50 steps of the benchmark transformer step (accuracy.examples.bench_setup/bench_step) per
case, each step timed on its own; cases run in turn (bare, case A, case B, bare, ...) for
`--repeat` rounds so a shared machine slows each alike. A case is a name and a driver with
msprobe's three calls (start/stop/step) around each step: add a row by appending to CASES.

Printed per case: the median step time over its idle steps (steps it does not record) against
the bare median, the median of its recorded steps, and the direct cost of its calls on an
idle step (start+stop+step timed alone, many times: the figure the noise cannot hide), with
met / not met beside the goal (an idle step at most 1.02x the bare step, calls at most 2% of
it). The idle steps of `dumper(steps=[never reached])` are also timed in blocks alternating
with bare ones (one dumper per block), the end-to-end figure drift cannot tilt. By default
(`--threads both`) it runs once with the default threads and once with
OMP_NUM_THREADS=1, each in its own process; `--threads default` or `--threads N` runs one.

The monitor (issue 28) adds two rows to the table (every step recorded, and with a snapshot
every 10 steps) and, from `bench_monitor.py`, its figures with an AdamW step: monitored vs bare
step (interleaved), time and memory per snapshot, and the time from trigger to report (default
threads only; `--no-capture` skips it).

Run: .venv/bin/python benchmarks/bench_long_run.py [--steps 50] [--repeat 2] [--no-capture]
     [--threads both|N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import add_threads_arg, run_both_threads, threads_from_argv, verdict

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS (torch is imported in the child)

HERE = Path(__file__).resolve().parent


@dataclass
class Case:
    """A named driver: `make(tmp)` returns an object with start(model), stop(), step(), and
    `recorded(step)` says which steps it records."""

    name: str
    make: Callable[[Path], Any]
    recorded: Callable[[int], bool]


class _Bare:
    def start(self, model: Any = None) -> None: ...
    def stop(self) -> None: ...
    def step(self) -> None: ...


class _DumperDriver:
    """The old way in: one `dumper(steps=...)` around the whole run, `d.step()` per step."""

    def __init__(self, path: Path, steps: list[int]) -> None:
        from accuracy import dumper

        self.d = dumper(path, "statistics", steps=steps, overwrite=True).__enter__()

    def start(self, model: Any = None) -> None: ...
    def stop(self) -> None: ...

    def step(self) -> None:
        self.d.step()

    def close(self) -> None:
        self.d.__exit__(None, None, None)


class _MonitorDriver:
    """`accuracy.monitor.Monitor` driven as a probe (start/stop/step), made at the first
    `start(model)` since a case is made before it sees the model."""

    def __init__(self, path: Path, **options: Any) -> None:
        self.path, self.options, self.mon = path, options, None

    def start(self, model: Any = None) -> None:
        if self.mon is None and model is not None:
            from accuracy.monitor import Monitor

            self.mon = Monitor(model, path=self.path, overwrite=True, **self.options)
        if self.mon is not None:
            self.mon.start(model)

    def stop(self) -> None: ...

    def step(self) -> None:
        if self.mon is not None:
            self.mon.step()

    def close(self) -> None:
        if self.mon is not None:
            self.mon.close()


def _debugger(tmp: Path, **kw: Any) -> Any:
    from accuracy import PrecisionDebugger

    return PrecisionDebugger(dump_path=tmp, task="statistics", level="L1", overwrite=True, **kw)


def _config_debugger(tmp: Path, step: list[int]) -> Any:
    """A debugger reading msprobe's config.json: the file is looked at (one stat) after
    every step, as msprobe's dynamic switch needs."""
    import json

    from accuracy import PrecisionDebugger

    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp / "dump"),
                               "level": "L1", "step": step, "dump_enable": True}))
    return PrecisionDebugger(config_path=cfg, overwrite=True)


def _cases(steps: int) -> list[Case]:
    from accuracy import schedule

    sched = schedule(skip_first=steps // 2, wait=0, warmup=0, active=2, repeat=1)
    never = [10 * steps]  # a step list the run never reaches: idle on every step
    return [
        Case("bare", lambda tmp: _Bare(), lambda s: False),
        Case("PrecisionDebugger, idle (step list not reached)",
             lambda tmp: _debugger(tmp / "idle", step=never), lambda s: False),
        Case("PrecisionDebugger from config.json, idle (the file re-checked each step)",
             lambda tmp: _config_debugger(tmp / "cfg", never), lambda s: False),
        Case("PrecisionDebugger, schedule recording 2 steps",
             lambda tmp: _debugger(tmp / "sched", schedule=sched), lambda s: s in sched),
        Case("dumper(steps=[not reached]) around the run",
             lambda tmp: _DumperDriver(tmp / "dumper.h5", never), lambda s: False),
        Case("Monitor every step (probe; this step has no optimizer)",
             lambda tmp: _MonitorDriver(tmp / "mon.monitor.h5", snapshot_every=None),
             lambda s: True),
        Case("Monitor every step, snapshot every 10 steps",
             lambda tmp: _MonitorDriver(tmp / "snap.monitor.h5", snapshot_every=10),
             lambda s: True),
    ]


CASES = _cases  # other features append their rows in _cases
_MODE_ON_IDLE: set[str] = set()  # cases that left a dispatch mode installed on an idle step


def _run_case(case: Case, model: Any, batch: Any, steps: int, tmp: Path) -> list[float]:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from accuracy.examples import bench_step

    drv = case.make(tmp)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        drv.start(model)
        if not case.recorded(i) and _get_current_dispatch_mode() is not None:
            _MODE_ON_IDLE.add(case.name)
        bench_step(model, batch)
        drv.stop()
        drv.step()
        times.append(time.perf_counter() - t0)
    if hasattr(drv, "close"):
        drv.close()
    return times


def _call_cost(case: Case, tmp: Path, n: int = 20000) -> float:
    """Seconds of start+stop+step on an idle step, timed alone."""
    drv = case.make(tmp / "calls")
    for _ in range(100):  # past any recorded step at the start
        if case.recorded(getattr(drv, "current_step", 0) or 0):
            drv.start(None)
            drv.stop()
        drv.step()
    t0 = time.perf_counter()
    k = 0
    while k < n:
        if not case.recorded(getattr(drv, "current_step", 0) or 0):
            drv.start(None)
            drv.stop()
        drv.step()
        k += 1
    cost = (time.perf_counter() - t0) / n
    if hasattr(drv, "close"):
        drv.close()
    return cost


def _idle_interleaved(model: Any, batch: Any, tmp: Path, rounds: int = 6,
                      block: int = 5) -> tuple[float, float]:
    """(bare median, idle median) in seconds: blocks of `block` bare steps alternate with
    blocks of idle steps inside `dumper(steps=[never reached])`, so drift and load reach
    both alike (the per-case table runs each case's steps in one stretch)."""
    from accuracy import dumper
    from accuracy.examples import bench_step

    def timed_block() -> list[float]:
        out = []
        for _ in range(block):
            t0 = time.perf_counter()
            bench_step(model, batch)
            out.append(time.perf_counter() - t0)
        return out

    bare: list[float] = []
    idle: list[float] = []
    for _ in range(rounds):
        bare += timed_block()
        with dumper(dump_path=tmp / "idle.h5", steps=[10**9], overwrite=True):
            idle += timed_block()
    return statistics.median(bare), statistics.median(idle)


def _monitor_figures(steps: int, capture: bool) -> dict:
    """bench_monitor.py's figures (an AdamW step): overhead, snapshot, trigger to report."""
    sys.path.insert(0, str(HERE))
    import bench_monitor as bm

    folder = Path(tempfile.mkdtemp(prefix="bench_long_run_monitor_"))
    out = {"overhead": bm.overhead(steps, folder), "snapshot": bm.snapshot_cost(10),
           "load": os.getloadavg()}
    if capture:
        out["capture"] = bm.trigger_to_report(folder)
    return out


def child(steps: int, repeat: int, capture: bool = False) -> dict:
    import torch

    from accuracy.examples import bench_setup, bench_step

    model, batch = bench_setup()
    cases = CASES(steps)
    tmp = Path(tempfile.mkdtemp(prefix="bench_long_run_"))
    for _ in range(3):
        bench_step(model, batch)  # warm-up
    times: dict[str, list[list[float]]] = {c.name: [] for c in cases}
    for _ in range(repeat):
        for c in cases:
            times[c.name].append(_run_case(c, model, batch, steps, tmp))
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "cases": {}}
    for c in cases:
        idle = [t for run in times[c.name] for i, t in enumerate(run) if not c.recorded(i)]
        rec = [t for run in times[c.name] for i, t in enumerate(run) if c.recorded(i)]
        out["cases"][c.name] = {"idle_median": statistics.median(idle) if idle else None,
                                "recorded_median": statistics.median(rec) if rec else None,
                                "total": statistics.median(sum(r) for r in times[c.name]),
                                "calls": _call_cost(c, tmp) if idle else None,
                                "mode_on_idle": c.name in _MODE_ON_IDLE}
    out["idle_interleaved"] = _idle_interleaved(model, batch, tmp)
    out["monitor"] = _monitor_figures(max(5, min(steps, 20)), capture)
    return out


def _report(res: dict, label: str) -> None:
    cases = res["cases"]
    bare = cases["bare"]["idle_median"]
    print(f"\n{label}: torch threads {res['threads']}; bare step median {bare * 1e3:.1f} ms")
    print(f"{'case':50s} {'idle step / bare':>17s} {'calls per idle step':>20s} "
          f"{'recorded step / bare':>21s} {'run total / bare':>17s}  mode on idle steps")
    for name, c in cases.items():
        rec = f"{c['recorded_median'] / bare:.2f}x" if c["recorded_median"] else "-"
        calls = c["calls"]
        idle = f"{c['idle_median'] / bare:16.3f}x" if c["idle_median"] else f"{'-':>17s}"
        cost = f"{calls * 1e6:7.1f} µs ({calls / bare * 100:.4f}%)" if calls is not None \
            else f"{'- (no idle step)':>20s}"
        print(f"{name:50s} {idle} {cost} {rec:>21s} "
              f"{c['total'] / cases['bare']['total']:16.3f}x  "
              f"{'installed' if c['mode_on_idle'] else 'none'}")
    for name, c in cases.items():  # the goal (issue 27), beside each case's idle figures
        if name == "bare" or c["idle_median"] is None:
            continue
        idle = c["idle_median"] / bare
        line = (f"  {name}: idle step / bare {idle:.3f}x ({verdict(idle, 1.02, what='<= 1.02x')}"
                ", end to end)")
        if c["calls"] is not None:
            pct = c["calls"] / bare * 100
            line += f"; calls {pct:.4f}% of the step ({verdict(pct, 2, unit='%')}, direct)"
        print(line)
    if "idle_interleaved" in res:
        b, i = res["idle_interleaved"]
        print(f"  dumper(steps=[never reached]), its idle steps interleaved with bare ones (6 "
              f"blocks of 5 each): {b * 1e3:.1f} ms bare, {i * 1e3:.1f} ms idle: {i / b:.3f}x "
              f"({verdict(i / b, 1.02, what='<= 1.02x')}, end to end, interleaved)")
    m = res.get("monitor")
    if m:
        o, sn = m["overhead"], m["snapshot"]
        print(f"monitor (issue 28, bench_monitor.py, AdamW step): every step "
              f"{o['monitor_s'] * 1e3:.1f} ms vs bare {o['bare_s'] * 1e3:.1f} ms: "
              f"{o['ratio']:.3f}x wall ({verdict(o['ratio'], 1.10, what='<= 1.10x')}), "
              f"{o['cpu_ratio']:.3f}x CPU time; "
              f"snapshot {sn['snapshot_s'] * 1e3:.1f} ms, {sn['snapshot_mb']:.1f} MB state + "
              f"{sn['batch_mb']:.2f} MB per kept batch (every 10 steps: "
              f"{sn['snapshot_s'] / 10 * 1e3:.2f} ms a step)")
        if "capture" in m:
            c = m["capture"]
            print(f"monitor trigger to report: {c['capture_s']:.2f} s (re-ran "
                  f"{c['rerun_steps']} steps, exact {c['exact']})")
        print(f"load average during the monitor figures: {m['load']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-capture", action="store_true", help="skip trigger to report")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--capture", action="store_true", help=argparse.SUPPRESS)
    add_threads_arg(ap, default="both")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.steps, args.repeat, args.capture)))
        return
    if args.threads == "both":
        sys.exit(run_both_threads())
    print(f"{args.steps} steps per case, {args.repeat} round(s); load average before: "
          f"{os.getloadavg()}")
    omp = os.environ.get("OMP_NUM_THREADS")  # set by --threads before anything read it
    label = f"OMP_NUM_THREADS={omp}" if omp else "default threads"
    # trigger to report: default threads only, as before
    capture = ["--capture"] if not omp and not args.no_capture else []
    proc = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps),
                           "--repeat", str(args.repeat), *capture], env=dict(os.environ),
                          capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        print(f"{label}: failed: {proc.stderr[-2000:]}")
        sys.exit(1)
    _report(json.loads(lines[-1]), label)
    print(f"load average after: {os.getloadavg()}")
    print("\ngoal: an idle step costs <= 2% of the step (issue 27): 'calls per idle step' "
          "(direct) and 'idle step / bare' (end to end, noisy under load), judged per case above")


if __name__ == "__main__":
    main()
