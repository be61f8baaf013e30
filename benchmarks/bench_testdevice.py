"""The npu test device's costs: its first build, a cached load, and the time an op takes on it.

Prints:
- the first build of the device into an empty cache (`--build`; about a minute on 2 cores),
- a cached load: `accuracy.testdevice.load()` in a fresh process whose cache holds the build
  (median of `--repeat` processes; torch's own import is not counted),
- the host's time per op: a chain of small element-wise ops issued to the device (queued)
  against the same ops on CPU, and a small MLP training step (forward, backward, AdamW) on both
  with its kernel and sync counts; the device's figure includes the wait at the end.

    python benchmarks/bench_testdevice.py --build --threads both
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import threads_from_argv

    threads_from_argv()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

LOAD = """
import json, time, torch
started = time.perf_counter()
import accuracy.testdevice as td
td.load()
print(json.dumps({"load_s": time.perf_counter() - started}))
"""


def _load_seconds(cache: str) -> float:
    env = {**os.environ, "ACCURACY_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True,
                          timeout=1800, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["load_s"])


def _per_op(device: str, n: int, repeat: int) -> float:
    """Median host seconds per op for a chain of `n` small element-wise ops, waits included."""
    import torch

    x = torch.randn(256, device=device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        y = x
        for _ in range(n):
            y = y * 1.0001 + 0.5
        y.sum().item()
        times.append((time.perf_counter() - t0) / (2 * n + 2))
    return statistics.median(times)


def _step(device: str, repeat: int) -> tuple[float, dict]:
    import torch

    import accuracy.testdevice as td

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                                torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def one() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if device != "cpu":
            torch.npu.synchronize()

    one()
    times = []
    counts: dict = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        if device == "cpu":
            one()
        else:
            with td.counting() as counts:
                one()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), counts


def main() -> int:
    from _common import add_threads_arg, run_both_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="time a first build in an empty cache")
    ap.add_argument("--repeat", type=int, default=5)
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        return run_both_threads()
    import torch

    import accuracy.testdevice as td
    from accuracy.native import cache_dir

    print(f"torch threads: {torch.get_num_threads()}")
    if args.build:
        with tempfile.TemporaryDirectory(prefix="npu-build-") as empty:
            first = _load_seconds(empty)
            again = _load_seconds(empty)
        print(f"first build and load (empty cache): {first:.1f} s; the next load: {again:.2f} s")
    loads = [_load_seconds(str(cache_dir())) for _ in range(args.repeat)]
    print(f"cached load (median of {args.repeat} processes): {statistics.median(loads):.2f} s "
          f"(min {min(loads):.2f}, max {max(loads):.2f})")
    td.load()
    cpu, npu = _per_op("cpu", 200, args.repeat), _per_op("npu", 200, args.repeat)
    print(f"element-wise op, 256 floats: cpu {cpu * 1e6:.1f} us, npu {npu * 1e6:.1f} us "
          f"({npu / cpu:.1f}x)")
    cpu_step, _ = _step("cpu", args.repeat)
    npu_step, counts = _step("npu", args.repeat)
    print(f"MLP training step (AdamW): cpu {cpu_step * 1e3:.1f} ms, npu {npu_step * 1e3:.1f} ms "
          f"({npu_step / cpu_step:.1f}x); npu: {counts['kernels_queued']} kernels queued, "
          f"{counts['kernels_sync']} run after a drain, "
          f"{counts['syncs_explicit'] + counts['syncs_implicit']} syncs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
