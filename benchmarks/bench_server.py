"""Load benchmark of the report service: a 100,000-row report, 16 concurrent clients paging,
sorting and filtering rows for 20 seconds against uvicorn on 127.0.0.1. Prints requests/s and
p50/p99 latency (goal: p99 < 100 ms).

The report's rows are real: a compare of two real dumps (golden CPU step vs. the `sim`
accelerator with a noisy matmul), repeated and renumbered to reach 100,000 rows, because
recording 100k ops would take the benchmark's whole budget.

    .venv/bin/python benchmarks/bench_server.py [--rows 100000] [--clients 16] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx

log = logging.getLogger("bench_server")


def build_report(work: Path, n_rows: int) -> tuple[Path, str]:
    """Dump, compare, tile to n_rows and index into a fresh data dir; returns (data, report)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _server_data import make_runs

    from accuracy.compare import load_report
    from accuracy.server.reportindex import index_report
    from accuracy.server.storage import Storage

    files = make_runs(work / "runs")
    data = load_report(files["report"])
    base = data["rows"]
    rows = []
    for i in range(n_rows):
        r = dict(base[i % len(base)])
        r["index"] = i
        rows.append(r)
    storage = Storage(work / "data")
    t = time.perf_counter()
    rep = index_report(storage, data["summary"], rows, name=f"{n_rows} rows")
    log.info("indexed %d rows in %.1f s", n_rows, time.perf_counter() - t)
    storage.close()
    return work / "data", rep.id


FILTERS = [{}, {"verdict": "error"}, {"phase": "backward"}, {"op": "aten.mm"},
           {"module": "encoder.layers.0"}, {"verdict": "warning", "phase": "forward"},
           {"op": "aten.*norm*"}]
SORTS = [("idx", "asc"), ("cosine", "asc"), ("max_abs_err", "desc"), ("max_rel_err", "desc")]


async def client_loop(base: str, rid: str, total: int, stop: float, lat: list[float],
                      errors: list[int], seed: int) -> None:
    rnd = random.Random(seed)
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        while time.perf_counter() < stop:
            params = dict(rnd.choice(FILTERS))
            params["sort"], params["order"] = rnd.choice(SORTS)
            params["limit"] = 50
            # most users look at the first pages; some jump deep into the table
            params["offset"] = (rnd.randrange(0, 10) * 50 if rnd.random() < 0.7
                                else rnd.randrange(0, max(1, total // 4)))
            t = time.perf_counter()
            r = await c.get(f"/api/reports/{rid}/rows", params=params)
            lat.append(time.perf_counter() - t)
            if r.status_code != 200:
                errors.append(r.status_code)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        data, rid = build_report(Path(tmp), args.rows)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "accuracy.cli", "serve", "--data",
                                 str(data), "--host", "127.0.0.1", "--port", str(port)])
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    urllib.request.urlopen(f"{base}/api/health", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.2)
            lat: list[float] = []
            errors: list[int] = []
            stop = time.perf_counter() + args.seconds

            async def run() -> None:
                await asyncio.gather(*(client_loop(base, rid, args.rows, stop, lat, errors, i)
                                       for i in range(args.clients)))

            t0 = time.perf_counter()
            asyncio.run(run())
            wall = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(10)
    lat.sort()
    n = len(lat)
    q = statistics.quantiles(lat, n=100) if n > 1 else [0.0] * 99
    print(f"report rows {args.rows}, clients {args.clients}, {wall:.1f} s")
    print(f"requests {n} ({len(errors)} errors), {n / wall:.1f} requests/s")
    print(f"latency p50 {q[49] * 1000:.1f} ms, p90 {q[89] * 1000:.1f} ms, "
          f"p99 {q[98] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms")
    print("goal p99 < 100 ms:", "met" if q[98] < 0.1 else "NOT met")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
