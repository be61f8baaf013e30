"""Multi-rank compare cost: the benchmark step under DDP on 2 gloo ranks (started with
torchrun), golden on CPU and device on `sim` fp16-cube; times `compare_ranks()` over both ranks
against the sum of the two single-rank `compare()` calls, and the merged report's writing.

    .venv/bin/python benchmarks/bench_multirank.py [--repeat 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD = 2


def worker(out: str, device: bool) -> None:
    """One rank (run by torchrun): a DDP step of the benchmark model inside the dumper."""
    from contextlib import nullcontext

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from accuracy.device_backend import sim
    from accuracy.dumper.core import dumper
    from accuracy.examples import bench_setup, bench_step

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model, _ = bench_setup()
    _, batch = bench_setup(seed=rank)  # same weights, each rank its own batch
    model = DDP(model)
    with sim(profile="fp16-cube") if device else nullcontext(), dumper(out):
        bench_step(model, batch)
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_dumps(work: Path) -> None:
    for side in ("golden", "device"):
        if all((work / side / f"run_{r}.h5").exists() for r in range(WORLD)):
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}",
               "--master_addr=127.0.0.1", f"--master_port={_port()}", __file__, "--worker",
               str(work / side / "run_{rank}.h5")] + (["--device"] if side == "device" else [])
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"torchrun failed for the {side} run")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def _median(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", help="keep dumps here (reused when present)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--device", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.device)
        return 0
    from accuracy.compare import compare
    from accuracy.compare.multirank import compare_ranks

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.workdir or tmp)
        make_dumps(work)
        dev, gold = work / "device", work / "golden"
        singles = []
        for r in range(WORLD):
            t, rep = _median(lambda r=r: compare(dev / f"run_{r}.h5", gold / f"run_{r}.h5"),
                             a.repeat)
            singles.append(t)
            print(f"rank {r} alone: compare() {t:.2f} s, "
                  f"{rep.summary['bytes_compared'] / 1e6:.0f} MB")
        t_multi, rep = _median(lambda: compare_ranks(dev / "run_{rank}.h5", gold), a.repeat)
        t_write, _ = _median(lambda: rep.write(work / "report", ("json", "csv", "html")), 1)
        print(f"sum of single-rank compares: {sum(singles):.2f} s")
        print(f"compare_ranks() over {WORLD} ranks: {t_multi:.2f} s "
              f"({t_multi / sum(singles):.2f}x the sum); "
              f"{rep.summary['bytes_compared'] / 1e6:.0f} MB; merged report written in "
              f"{t_write:.2f} s (json, csv, html, and each rank's own)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
