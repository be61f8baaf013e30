"""Compare and replay of the benchmark step in-process vs on Dask `local:1` and `local:2`.

Dumps the benchmark step (accuracy/examples.py) golden on CPU and device on `sim` fp16-cube at
`--batch` (32: about 4.3 GB of compared tensor bytes), compares them in this process and on a
LocalCluster of 1 and 2 single-threaded workers, and prints wall time, GB/s, the CPU seconds
the work used (this process, or the workers' own counters) and whether the rows are identical.
Then replays the device dump of `--replay-batch` (metrics only) the same three ways, torch
on one thread everywhere. The machine may be shared: the CPU-seconds rate (GB per CPU second)
is what load does not change; wall-clock speed-ups need idle cores. Met / not met is printed
beside each goal (local:1 within 10% of in-process; local:2 >= 1.8x local:1), and local:2 /
local:1 judged against what this machine allows two processes: its memory streaming 2 vs 1,
measured in the same run (goal: at least 0.9 of that ceiling). Then `--plan N GB` (default 8
300) simulates N workers of GB each from local:1's measured task rate, gaps, client serial part
and per-task cluster cost (`simulate_plan`), with the same model at this run's size beside the
measured sides. `--threads both` runs it twice from one command, each in a fresh process
(its Dask workers inherit the setting): torch's default threads, then OMP_NUM_THREADS=1;
`--threads N` sets OMP_NUM_THREADS.

Run: .venv/bin/python benchmarks/bench_cluster.py [--batch 32] [--replay-batch 8]
        [--workdir DIR] [--repeat N] [--skip-replay] [--two-tier] [--idle] [--probe] [--split]
        [--scaling] [--plan N GB] [--threads both|N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also as benchmarks.bench_cluster
from _common import add_threads_arg, run_both_threads, threads_from_argv, verdict  # noqa: E402

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS (torch is imported later)


def make_dumps(work: Path, batch: int) -> tuple[Path, Path]:
    from accuracy.device_backend import sim
    from accuracy.dumper.core import dumper
    from accuracy.examples import bench_setup, bench_step

    golden, device = work / f"golden_b{batch}.h5", work / f"device_b{batch}.h5"
    if not golden.exists():
        model, data = bench_setup(batch=batch)
        with dumper(str(golden)):
            bench_step(model, data)
    if not device.exists():
        model, data = bench_setup(batch=batch)
        with sim(profile="fp16-cube"), dumper(str(device)):
            bench_step(model, data)
    return device, golden


def warm_page_cache(*paths: Path) -> str:
    """Read each file once, so every timed side finds it in the page cache. Without this the
    first side timed (in-process) paid the disk reads alone when another benchmark had evicted
    the dumps: 6.8 s against 1.7 s in one chained run, a false 'local:1 70% faster'."""
    t0, n = time.perf_counter(), 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                n += len(chunk)
    return f"page cache warmed: {n / 1e9:.2f} GB read in {time.perf_counter() - t0:.1f} s"


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _workers_cpu(client) -> float:
    return sum(client.run(_cpu_seconds).values())


def _load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def timed(fn, client=None) -> tuple[object, float, float]:
    """(result, wall seconds, CPU seconds of whoever did the work)."""
    c0 = _workers_cpu(client) if client else time.process_time()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    cpu = (_workers_cpu(client) if client else time.process_time()) - c0
    return out, wall, cpu


def _rows_json(rep) -> str:
    return json.dumps(rep.rows, default=str)


def bench_compare(device: Path, golden: Path) -> list[dict]:
    from accuracy.cluster import dask_client
    from accuracy.compare import compare
    from accuracy.compare.cluster import DaskRunner

    runs = []
    rep, wall, cpu = timed(lambda: compare(device, golden))
    ref = _rows_json(rep)
    nbytes = rep.summary["bytes_compared"]
    runs.append({"how": "in-process", "wall": wall, "cpu": cpu, "same": True, "load": _load()})
    for n in (1, 2):
        t0 = time.perf_counter()
        with dask_client(f"local:{n}") as client:
            client.run(lambda: __import__("accuracy.compare.cluster") and None)
            start = time.perf_counter() - t0
            rep, wall, cpu = timed(lambda c=client: compare(device, golden,
                                                            runner=DaskRunner(c)), client)
        runs.append({"how": f"--cluster local:{n}", "wall": wall, "cpu": cpu, "start": start,
                     "same": _rows_json(rep) == ref, "load": _load()})
    for r in runs:
        r["bytes"] = nbytes
    return runs


def median_rounds(rounds: list[list[dict]]) -> list[dict]:
    """One row per way of running from several rounds (each round runs every way once, in
    the same order, so the machine's drift falls on all of them): the median wall and CPU
    seconds, every round's walls, and whether every round's rows were identical."""
    out = []
    for i, first in enumerate(rounds[0]):
        mine = [r[i] for r in rounds]
        out.append({**first, "wall": statistics.median(r["wall"] for r in mine),
                    "cpu": statistics.median(r["cpu"] for r in mine),
                    "walls": [r["wall"] for r in mine], "same": all(r["same"] for r in mine),
                    "load": mine[-1]["load"]})
    return out


def _replay_json(path: Path) -> str:
    from accuracy.dumpfile import load_dump

    with load_dump(path) as d:
        return json.dumps([(r.seq, r.extra.get("replay")) for r in d.records], default=str)


def _warm_replay_worker() -> None:
    """What this process has imported before its in-process replay (torch, the replay ops),
    imported in a worker before the timing, so the first task is not charged ~2 CPU s of it."""
    import accuracy.replay.cluster  # noqa: F401
    import accuracy.replay.engine  # noqa: F401
    import accuracy.replay.ops  # noqa: F401


def bench_replay(device: Path, work: Path) -> list[dict]:
    import torch

    from accuracy.cluster import dask_client
    from accuracy.replay import replay
    from accuracy.replay.cluster import DaskReplayRunner

    torch.set_num_threads(1)  # as in a worker: per-core figures on both sides
    nbytes = device.stat().st_size
    out = work / "replay.h5"
    runs = []
    res, wall, cpu = timed(lambda: replay(device, out, metrics_only=True, overwrite=True))
    ref = _replay_json(out)
    runs.append({"how": "in-process", "wall": wall, "cpu": cpu, "same": True, "load": _load(),
                 "ops": res.total})
    for n in (1, 2):
        t0 = time.perf_counter()
        with dask_client(f"local:{n}") as client:
            client.run(_warm_replay_worker)
            start = time.perf_counter() - t0
            res, wall, cpu = timed(lambda c=client: replay(
                device, out, metrics_only=True, overwrite=True,
                runner=DaskReplayRunner(c)), client)
        runs.append({"how": f"--cluster local:{n}", "wall": wall, "cpu": cpu, "start": start,
                     "same": _replay_json(out) == ref, "load": _load(), "ops": res.total})
    for r in runs:
        r["bytes"] = nbytes
    return runs


def two_tier(work: Path) -> None:
    """Disk and culprit of the two-tier flow vs a full tensor dump, on the benchmark step
    (batch 8) with a bias fault in one layer norm."""
    from accuracy.compare import compare
    from accuracy.compare.suspects import select_suspects, write_selection
    from accuracy.device_backend import sim
    from accuracy.dumper.core import dumper
    from accuracy.examples import bench_setup, bench_step

    def run(name: str, mode: str, faulty: bool, **kw) -> tuple[Path, float]:
        path = work / name
        model, data = bench_setup()
        fault = sim.fault("aten.native_layer_norm.default", module="encoder.layers.2.*",
                          kind="bias", value=0.05)
        t0 = time.perf_counter()
        with (sim(profile="fp16-cube", faults=[fault]) if faulty else nullcontext()), \
                dumper(str(path), mode, overwrite=True, **kw):
            bench_step(model, data)
        return path, time.perf_counter() - t0

    def culprit(rep) -> str:
        c = rep.summary["culprit"]
        return f"{c['op']} seq {c['seq_my']} {c['io']} {c['tensor_index']} in {c['module']}" \
            if c else "none"

    (df, tf), (gf, _) = run("dev_full.h5", "tensor", True), run("gold_full.h5", "tensor", False)
    full = compare(df, gf)
    (ds, ts), (gs, _) = run("dev_stats.h5", "statistics", True), run(
        "gold_stats.h5", "statistics", False)
    stats = compare(ds, gs)
    stats.write(work / "stats_report", ("json",))
    sel = select_suspects(work / "stats_report")
    sel_path = write_selection(sel, work / "suspects.json", overwrite=True)
    (d2, t2), (g2, _) = run("dev_sel.h5", "tensor", True, select=sel_path), run(
        "gold_sel.h5", "tensor", False, select=sel_path)
    second = compare(d2, g2)
    print(f"\ntwo-tier flow on the benchmark step ({full.summary['ops_my']} ops; "
          f"{len(sel['my'])} selected around {len(sel['suspects'])} suspects)")
    print("| dump (device side) | file size | dump time s | compared bytes | culprit |")
    print("| --- | --- | --- | --- | --- |")
    for label, path, t, rep in (("tensor, every op", df, tf, full),
                                ("statistics, every op", ds, ts, stats),
                                ("tensor, `select=suspects.json`", d2, t2, second)):
        print(f"| {label} | {path.stat().st_size / 1e6:.2f} MB | {t:.2f} | "
              f"{rep.summary['bytes_compared'] / 1e6:.1f} MB | {culprit(rep)} |")
    print(f"same culprit as the full tensor dump: {culprit(second) == culprit(full)}")


def _one_batch(device: Path, golden: Path) -> list:
    """Every tensor pair of the compare as one batch (what the probe times)."""
    from accuracy.compare import api
    from accuracy.compare.align import Mapping
    from accuracy.compare.engine import TensorRef
    from accuracy.dumpfile import load_dump

    with load_dump(device) as dm, load_dump(golden) as dg:
        todo: dict = {}
        for s in api._specs(dm, dg, Mapping()):  # noqa: SLF001 - the batch compare() builds
            if api._needs_data(s):  # noqa: SLF001
                k = (api._key(s.my), api._key(s.golden))  # noqa: SLF001
                todo.setdefault(k, (TensorRef.of(s.my), TensorRef.of(s.golden)))
    return list(todo.values())


def _task_cost(batch: list, algs: tuple, tune: bool) -> tuple[float, int, str | None]:
    """(thread CPU s, minor page faults) of comparing `batch` here, and MALLOC_TRIM_THRESHOLD_."""
    from accuracy.cluster import tune_worker_malloc
    from accuracy.compare.blas import single_threaded_blas
    from accuracy.compare.engine import BlobReader, compare_refs

    if tune:
        tune_worker_malloc()
    reader = BlobReader()
    compare_refs(reader, batch[:1], algs)  # files open, first pages in
    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    t0 = time.thread_time()
    with single_threaded_blas():
        compare_refs(reader, batch, algs)
    cpu = time.thread_time() - t0
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
    reader.close()
    return cpu, faults, os.environ.get("MALLOC_TRIM_THRESHOLD_")


def probe(device: Path, golden: Path) -> None:
    """The per-worker overhead: one batch's task CPU and page faults, in-process vs workers."""
    import distributed

    from accuracy.cluster import dask_client
    from accuracy.compare.metrics import resolve_algorithms

    batch, algs = _one_batch(device, golden), resolve_algorithms(None)
    print(f"\nprobe: one batch of {sum(m.nbytes + g.nbytes for m, g in batch) / 1e9:.2f} GB "
          f"({_load()})")
    print("| where | task CPU s | minor page faults | MALLOC_TRIM_THRESHOLD_ |")
    print("| --- | --- | --- | --- |")

    def show(label: str, r: tuple) -> None:
        print(f"| {label} | {r[0]:.2f} | {r[1]:,} | {r[2]} |")

    show("in-process", _task_cost(batch, algs, False))
    with distributed.LocalCluster(host="127.0.0.1", n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        show("Dask worker, Dask defaults", client.submit(_task_cost, batch, algs, False,
                                                         pure=False).result())
    with dask_client("local:1") as client:
        show("Dask worker, --cluster local:1 (fixed)", client.submit(
            _task_cost, batch, algs, True, pure=False).result())


def _replay_batches(device: Path) -> list[list[int]]:
    from accuracy.dumpfile import load_dump
    from accuracy.replay.engine import _BATCH

    with load_dump(device) as d:
        seqs = [r.seq for r in d.records]
    return [seqs[i:i + _BATCH] for i in range(0, len(seqs), _BATCH)]


def _replay_task_cost(path: str, batches: list[list[int]]) -> tuple[float, float, float, int]:
    """(process CPU s, this thread's CPU s, wall s, minor page faults) of `run_ops` over every
    batch, here, as a worker runs them (its dump opened and its cache made by the first)."""
    import torch

    from accuracy.replay.cluster import run_ops

    torch.set_num_threads(1)
    c0, th0, t0 = _cpu_seconds(), time.thread_time(), time.perf_counter()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for b in batches:
        run_ops(b, path, "cpu", "fp64", True)
    return (_cpu_seconds() - c0, time.thread_time() - th0, time.perf_counter() - t0,
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)


def probe_replay(device: Path) -> None:
    """The replay worker task (`run_ops` over every batch) in this process vs in a worker."""
    import subprocess

    from accuracy.cluster import dask_client

    batches = _replay_batches(device)
    print(f"\nprobe: replay worker tasks, {len(batches)} batches of {device.name} ({_load()})")
    print("| where | process CPU s | task thread CPU s | wall s | minor page faults |")
    print("| --- | --- | --- | --- | --- |")

    def show(label: str, r: tuple) -> None:
        print(f"| {label} | {r[0]:.2f} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:,} |")

    code = ("import json,sys;from benchmarks.bench_cluster import _replay_task_cost as f;"
            "print(json.dumps(f(sys.argv[1], json.loads(sys.argv[2]))))")
    here = subprocess.run([sys.executable, "-c", code, str(device), json.dumps(batches)],
                          capture_output=True, text=True, check=True)
    show("fresh process (run_ops)", json.loads(here.stdout.strip().splitlines()[-1]))
    with dask_client("local:1") as client:
        client.run(_warm_replay_worker)
        show("Dask worker, --cluster local:1", client.submit(
            _replay_task_cost, str(device.resolve()), batches, pure=False).result())


def _spin(kind: str, seconds: float = 3.0) -> float:
    """Work units done in `seconds`: in-cache arithmetic ("cpu") or streaming over 256 MB
    ("memory"), in one thread with single-threaded numpy."""
    import numpy as np

    a = np.ones(32 << 10 if kind == "cpu" else 32 << 20)  # 256 KiB (in L2) or 256 MiB
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a *= 1.0000001
        n += 1
    return n * a.nbytes / (time.perf_counter() - t0)


def scaling(quiet: bool = False, seconds: float = 3.0) -> dict[str, float]:
    """Whether 2 processes get 2x the work of 1 on this machine: in-cache arithmetic (the
    cores) and streaming over memory (the memory bandwidth), 1 vs 2 processes at once, each
    for `seconds`. Returns {"cpu": 2 vs 1, "memory": 2 vs 1}; quiet: no table."""
    from concurrent.futures import ProcessPoolExecutor

    if not quiet:
        print(f"\nscaling of 1 vs 2 concurrent processes ({_load()})")
        print("| work | 1 process GB/s | 2 processes GB/s (sum) | 2 vs 1 |")
        print("| --- | --- | --- | --- |")
    out = {}
    for kind in ("cpu", "memory"):
        with ProcessPoolExecutor(2) as ex:
            list(ex.map(_spin, [kind] * 2, [0.3] * 2))  # started, numpy imported
            one = ex.submit(_spin, kind, seconds).result()
            two = sum(ex.map(_spin, [kind] * 2, [seconds] * 2))
        out[kind] = two / one
        if not quiet:
            print(f"| {kind} | {one / 1e9:.2f} | {two / 1e9:.2f} | {two / one:.2f}x |")
    return out


def against_ceiling(speedup: float, ceiling: float, goal: float = 0.9) -> tuple[float, bool]:
    """local:2 / local:1 as a share of what the machine allows two processes (`ceiling`: its
    memory streaming 2 vs 1, `scaling()`); met at `goal` of it or more. A ceiling below 1
    (a busy machine slowed the pair) counts as 1: two workers are never asked to beat one."""
    share = speedup / max(1.0, ceiling)
    return share, share >= goal


def print_ceiling(rounds: list[list[dict]], ceilings: list[dict[str, float]]) -> None:
    """local:2 / local:1 judged against the memory-bandwidth ceiling measured right after it
    in the same round (a shared machine's load moves both alike): the median of the rounds'
    shares."""
    shares, speedups = [], []
    for runs, c in zip(rounds, ceilings, strict=True):
        by = {r["how"]: r for r in runs}
        speedups.append(by["--cluster local:1"]["wall"] / by["--cluster local:2"]["wall"])
        shares.append(against_ceiling(speedups[-1], c["memory"])[0])
    share = statistics.median(shares)
    judged = verdict(share, 0.9, lower_is_better=False, what=">= 0.9 of the ceiling")
    busiest = max(float(r["load"].split()[1]) for runs in rounds for r in runs)
    if busiest >= (os.cpu_count() or 1):  # a saturated machine streams no faster on two
        judged += f"; NOT judgeable: load {busiest:.1f} on {os.cpu_count()} cores"
    mem = ", ".join(f"{c['memory']:.2f}x" for c in ceilings)
    cpu = ", ".join(f"{c['cpu']:.2f}x" for c in ceilings)
    per = ", ".join(f"{x:.2f}x / ceiling = {y:.2f}" for x, y in zip(speedups, shares, strict=True))
    print(f"local:2 / local:1 against this machine's ceiling, measured after it in each round "
          f"(memory streaming 2 vs 1 processes: {mem}; in-cache arithmetic {cpu}): per round "
          f"{per}; median {share:.2f} of it ({judged}; {_load()})")


# -- the plan of N workers x G GB, simulated from what one worker does here ----------------

def _noop(i: int) -> int:
    return i


def model_inputs(device: Path, golden: Path, probes: int = 500) -> dict[str, float]:
    """What the N-worker simulation is built from, measured on local:1: the compared bytes,
    the worker's task busy seconds (its rate), the mean idle gap between its tasks (scheduling
    and result transfer per task), the client's serial seconds (before the first task and
    after the last), and the cluster's cost per task (`probes` no-op tasks, wall / count)."""
    from distributed import get_task_stream

    from accuracy.cluster import dask_client
    from accuracy.compare import compare
    from accuracy.compare.cluster import DaskRunner

    with dask_client("local:1") as client:
        client.run(lambda: __import__("accuracy.compare.cluster") and None)
        compare(device, golden, runner=DaskRunner(client))  # warm: files open, pages in
        t0 = time.time()
        with get_task_stream(client) as ts:
            rep = compare(device, golden, runner=DaskRunner(client))
        t1 = time.time()
        spans = sorted((s["start"], s["stop"]) for task in ts.data for s in task["startstops"]
                       if s["action"] == "compute")
        client.gather(client.map(_noop, range(20), pure=False))
        p0 = time.perf_counter()
        client.gather(client.map(_noop, range(probes), pure=False))
        per_task = (time.perf_counter() - p0) / probes
    busy = sum(b - a for a, b in spans)
    first, last = spans[0][0], max(b for _, b in spans)
    return {"bytes": float(rep.summary["bytes_compared"]), "busy": busy, "tasks": len(spans),
            "gap": max(0.0, (last - first - busy) / max(1, len(spans) - 1)),
            "serial": max(0.0, (first - t0) + (t1 - last)), "wall": t1 - t0,
            "per_task": per_task}


def simulate_plan(workers: int, gb_each: float, m: dict[str, float],
                  batch_bytes: int = 32 << 20, most: int = 16) -> dict[str, float]:
    """Wall seconds of a compare of `workers` x `gb_each` GB on `workers` workers and on one,
    from one worker's measured figures `m` (model_inputs): batches of `batch_bytes` grouped
    into tasks as compare groups them (accuracy.cluster.guided_groups, at most `most`), each
    task taking its bytes at the worker's rate plus the measured gap, handed to whichever
    worker is free first (Dask's queue); the client's serial part scaled with the bytes (same
    bytes per tensor row as the bench step); the scheduler, one process, busy `per_task` per
    task, is the floor when it cannot keep up. Each worker reads its own bytes (its own host):
    no memory shared between workers."""
    import heapq

    from accuracy.cluster import guided_groups

    rate = m["bytes"] / m["busy"]  # bytes per second of task time on one worker
    total = workers * gb_each * 1e9
    serial = m["serial"] * total / m["bytes"]

    def tasks_wall(n: int) -> tuple[float, int]:
        runs = guided_groups(-(-int(total) // batch_bytes), n, most)
        free = [0.0] * n
        for r in runs:
            heapq.heapreplace(free, free[0] + len(r) * batch_bytes / rate + m["gap"])
        return max(max(free), len(runs) * m["per_task"]), len(runs)

    many, tasks = tasks_wall(workers)
    one, _ = tasks_wall(1)
    return {"wall": serial + many, "one": serial + one, "speedup": (serial + one) / (serial + many),
            "efficiency": (serial + one) / (serial + many) / workers, "tasks": tasks,
            "serial": serial, "rate": rate, "tasks_speedup": one / many}


def print_plan(m: dict[str, float], workers: int, gb_each: float) -> None:
    """The simulated plan, and the same model at this run's size beside the measured sides."""
    print(f"\nmodel from local:1 ({_load()}): {m['bytes'] / 1e9:.2f} GB in {m['tasks']:.0f} "
          f"tasks, {m['bytes'] / m['busy'] / 1e9:.2f} GB per task-second, gap between tasks "
          f"{1000 * m['gap']:.1f} ms, client serial {m['serial']:.3f} s of {m['wall']:.2f} s, "
          f"cluster cost {1000 * m['per_task']:.2f} ms per task (no-op tasks)")
    here = {n: simulate_plan(n, m["bytes"] / n / 1e9, m) for n in (1, 2)}
    print(f"the model at this size: local:1 {here[1]['wall']:.2f} s, local:2 "
          f"{here[2]['wall']:.2f} s (two hosts: {here[1]['wall'] / here[2]['wall']:.2f}x)")
    p = simulate_plan(workers, gb_each, m)
    print(f"simulated plan, {workers} workers x {gb_each:g} GB ({workers * gb_each:g} GB, "
          f"{p['tasks']} tasks): {p['wall']:.0f} s against {p['one']:.0f} s on one worker: "
          f"{p['speedup']:.2f}x, efficiency {p['efficiency']:.2f}; the client's serial part, "
          f"{p['serial']:.0f} s when it grows with the bytes (as many bytes per row as here; "
          f"fewer rows per GB in a larger model), left out: {p['tasks_speedup']:.2f}x. Worker "
          f"rate {p['rate'] / 1e9:.2f} GB/s from the page cache: a disk slower than that sets "
          "the rate instead")


def contention(device: Path, golden: Path) -> None:
    """One compare batch (every pair of the step) on one local:2 worker alone, then on both
    workers at once: how much slower a worker's task gets when the other one runs too."""
    from accuracy.cluster import dask_client
    from accuracy.compare.metrics import resolve_algorithms

    batch, algs = _one_batch(device, golden), resolve_algorithms(None)
    gb = sum(m.nbytes + g.nbytes for m, g in batch) / 1e9
    print(f"\ncompare batch of {gb:.2f} GB, local:2: one worker alone vs both at once ({_load()})")
    print("| run | task CPU s per worker | wall s | GB/s (all workers) |")
    print("| --- | --- | --- | --- |")
    with dask_client("local:2") as client:
        ws = sorted(client.nthreads())
        client.gather([client.submit(_task_cost, batch, algs, True, workers=[w], pure=False)
                       for w in ws])  # files open, every page mapped, in each worker
        for who in ([ws[0]], ws):
            t0 = time.perf_counter()
            fs = [client.submit(_task_cost, batch, algs, True, workers=[w], pure=False)
                  for w in who]
            res = [f.result() for f in fs]
            wall = time.perf_counter() - t0
            print(f"| {len(who)} at once | {' / '.join(f'{r[0]:.2f}' for r in res)} | "
                  f"{wall:.2f} | {len(who) * gb / wall:.2f} |")


def _tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of this process (the client, and a local cluster's scheduler and nannies,
    which run on threads of it) and of its child processes (the Dask workers)."""
    import psutil

    me = psutil.Process(pid)
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        role = "client" if p.pid == pid else "workers" if "spawn_main" in cmd else "other"
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def split(device: Path, golden: Path) -> None:
    """Where compare's CPU goes on local:1 and local:2 (per process role) and how busy each
    worker was (Dask's task stream): the client's share, the workers' idle time, the tail."""
    from distributed import get_task_stream

    from accuracy.cluster import dask_client
    from accuracy.compare import compare
    from accuracy.compare.cluster import DaskRunner

    print(f"\ncompare CPU by process and worker busy time ({_load()})")
    print("| run | wall s | client+scheduler+nannies CPU s | workers CPU s | "
          "tasks | task busy s per worker | first finisher idle at end s | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in (1, 2):
        with dask_client(f"local:{n}") as client:
            client.run(lambda: __import__("accuracy.compare.cluster") and None)
            before, t0 = _tree_cpu(os.getpid()), time.perf_counter()
            with get_task_stream(client) as ts:
                compare(device, golden, runner=DaskRunner(client))
            wall, after = time.perf_counter() - t0, _tree_cpu(os.getpid())
            busy: dict[str, list[tuple[float, float]]] = {}
            for task in ts.data:
                for s in task["startstops"]:
                    if s["action"] == "compute":
                        busy.setdefault(task["worker"], []).append((s["start"], s["stop"]))
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        ends = sorted(max(b for _, b in iv) for iv in busy.values())
        print(f"| local:{n} | {wall:.2f} | {d.get('client', 0):.2f} | "
              f"{d.get('workers', 0):.2f} | "
              f"{sum(len(iv) for iv in busy.values())} | "
              f"{' / '.join(f'{sum(b - a for a, b in iv):.2f}' for iv in busy.values())} | "
              f"{ends[-1] - ends[0]:.2f} | {_load().removeprefix('load ')} |")


def idle_worker(seconds: float = 20.0) -> None:
    """CPU an idle local:1 worker uses per second of wall time (its housekeeping)."""
    from accuracy.cluster import dask_client

    with dask_client("local:1") as client:
        time.sleep(3)
        a, t0 = _workers_cpu(client), time.perf_counter()
        time.sleep(seconds)
        b, wall = _workers_cpu(client), time.perf_counter() - t0
    print(f"idle worker: {b - a:.3f} CPU s in {wall:.1f} s = {1000 * (b - a) / wall:.1f} ms "
          f"per s ({_load()})")


def print_table(title: str, runs: list[dict]) -> None:
    print(f"\n{title}: {runs[0]['bytes'] / 1e9:.2f} GB")
    print("| run | wall s | GB/s | speed-up vs local:1 | CPU s | GB per CPU s | identical | "
          "cluster start s | load (1/5/15 min) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    one = next(r for r in runs if r["how"].endswith("local:1"))
    for r in runs:
        gbps = r["bytes"] / r["wall"] / 1e9
        print(f"| {r['how']} | {r['wall']:.2f} | {gbps:.3f} | {one['wall'] / r['wall']:.2f}x | "
              f"{r['cpu']:.2f} | {r['bytes'] / r['cpu'] / 1e9:.3f} | "
              f"{'yes' if r['same'] else 'NO'} | {r.get('start', 0):.1f} | "
              f"{r['load'].removeprefix('load ')} |")
    if len(runs[0].get("walls", [])) > 1:
        one = next(r for r in runs if r["how"].endswith("local:1"))
        two = next(r for r in runs if r["how"].endswith("local:2"))
        per = [a / b for a, b in zip(one["walls"], two["walls"], strict=True)]
        print(f"{len(per)} rounds (medians above); local:2 / local:1 per round: "
              f"{', '.join(f'{x:.2f}x' for x in per)}; walls local:1 "
              f"{', '.join(f'{x:.2f}' for x in one['walls'])}, local:2 "
              f"{', '.join(f'{x:.2f}' for x in two['walls'])}")
    print_goals(runs)


def print_goals(runs: list[dict]) -> None:
    """The issue's wall-clock goals next to this run's figures (judge them on idle cores)."""
    by = {r["how"]: r for r in runs}
    inproc, one, two = by["in-process"], by["--cluster local:1"], by["--cluster local:2"]
    slower = one["wall"] / inproc["wall"] - 1
    speedup = one["wall"] / two["wall"]
    busiest = max(float(r["load"].split()[1]) for r in runs)
    busy = busiest >= (os.cpu_count() or 1)
    note = f"; NOT judgeable: load {busiest:.1f} on {os.cpu_count()} cores" if busy else ""
    print(f"local:1 against in-process: {100 * slower:+.1f}% "
          f"({verdict(100 * slower, 10, what='local:1 within 10% of in-process')}{note})")
    print(f"local:2 / local:1: {speedup:.2f}x "
          f"({verdict(speedup, 1.8, lower_is_better=False, what='local:2 >= 1.8x local:1')}"
          f"{note})")
    cores = one["cpu"] / one["wall"]  # a replay worker reads ahead on a second thread
    print(f"local:1 kept {cores:.2f} of {os.cpu_count()} cores busy (its workers' CPU s / wall "
          f"s): local:2 can be at most {(os.cpu_count() or 1) / cores:.2f}x it on this machine")
    print(f"CPU seconds of the same work vs in-process: local:1 {one['cpu'] / inproc['cpu']:.2f}x, "
          f"local:2 {two['cpu'] / inproc['cpu']:.2f}x (what load does not change)")
    print(f"rows identical in every run: {all(r['same'] for r in runs)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32, help="batch of the compared step")
    p.add_argument("--replay-batch", type=int, default=8, help="batch of the replayed step")
    p.add_argument("--workdir", help="keep dumps here (default: a temporary directory)")
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of the compare (each runs in-process, local:1 and local:2 on "
                   "fresh clusters); the table shows the medians")
    p.add_argument("--idle", action="store_true", help="only an idle worker's CPU per second")
    p.add_argument("--probe", action="store_true",
                   help="only one batch's task CPU and page faults, in-process vs workers")
    p.add_argument("--split", action="store_true",
                   help="only compare's CPU per process and worker busy time, local:1 and 2")
    p.add_argument("--scaling", action="store_true",
                   help="only 1 vs 2 concurrent processes on in-cache and streaming work, "
                   "and one compare batch on 1 vs 2 workers at once")
    p.add_argument("--plan", type=float, nargs=2, default=(8, 300), metavar=("N", "GB"),
                   help="simulate N workers x GB each from local:1's figures (0 0: skip)")
    p.add_argument("--two-tier", action="store_true",
                   help="only the two-tier flow's disk figures (batch 8 step)")
    add_threads_arg(p)
    args = p.parse_args()
    if args.threads == "both":
        return run_both_threads()
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_cl_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.idle:
            idle_worker()
            return 0
        if args.probe:
            probe(*make_dumps(work, args.replay_batch))
            probe_replay(make_dumps(work, args.replay_batch)[0])
            return 0
        if args.split:
            split(*make_dumps(work, args.batch))
            return 0
        if args.scaling:
            scaling()
            if args.plan[0]:
                print_plan(model_inputs(*make_dumps(work, args.batch)), int(args.plan[0]),
                           args.plan[1])
            contention(*make_dumps(work, args.replay_batch))
            return 0
        if args.two_tier:
            two_tier(work)
            return 0
        print(f"start: {_load()}, {os.cpu_count()} cores, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', 'unset')}", flush=True)
        t0 = time.perf_counter()
        device, golden = make_dumps(work, args.batch)
        print(f"dumps ready in {time.perf_counter() - t0:.0f} s: {device.stat().st_size / 1e9:.2f}"
              f" + {golden.stat().st_size / 1e9:.2f} GB; {os.cpu_count()} cores, {_load()}")
        print(warm_page_cache(device, golden), flush=True)
        rounds, ceilings = [], []
        for _ in range(max(1, args.repeat)):
            rounds.append(bench_compare(device, golden))
            ceilings.append(scaling(quiet=True, seconds=1.5))
        print_table("compare", median_rounds(rounds))
        print_ceiling(rounds, ceilings)
        if args.plan[0]:
            print_plan(model_inputs(device, golden), int(args.plan[0]), args.plan[1])
        if not args.skip_replay:
            rdev, _ = make_dumps(work, args.replay_batch)
            print(warm_page_cache(rdev), flush=True)
            print_table("replay --metrics-only (upcast fp64, torch on 1 thread)",
                        bench_replay(rdev, work))
        print(f"\nend: {_load()} (the goals need a quiet machine: load below the core count)")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
