"""On a real CUDA GPU: what a dump costs there, how much it talks to the host, and a real
CUDA-against-CPU comparison (the job a user porting a model runs). Prints figures; needs a
GPU (`--device cuda`); `--device cpu` runs the same code on CPU (to check the script).

    python benchmarks/bench_cuda.py --workdir /tmp/cuda [--repeat 5] [--threads both]
        [--sizes 8x128,64x512] [--compile] [--skip time,traffic,compare]

1. The bench step (benchmarks/README.md) on the device at each batch x sequence size: bare,
   statistics dump and tensor dump, interleaved, each step ended by a synchronize.
2. Host traffic of one recorded step, counted by torch.profiler's CUDA runtime events:
   device-to-host copies and synchronisations (the budget the npu test device checks:
   statistics at most one sync per 64 ops).
3. The same step dumped on CPU (fp32, the golden side) and on the GPU in fp32 and under bf16
   autocast, compared with the CLI (`accuracy compare`), the bf16 one also with a CPU replay
   (`accuracy replay --on cpu`, then `compare -r`): verdict counts and culprit as a user sees
   them; no fault is injected, so any error is a false alarm.
4. `--compile`: the step compiled by Inductor (Triton kernels on the GPU), bare against under
   a statistics dump, and what the dump recorded of it.
"""

from __future__ import annotations

if __name__ == "__main__":
    from _common import threads_from_argv

    threads_from_argv()

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_threads_arg, interleaved, ratios, run_both_threads, spread  # noqa: E402

from accuracy import dumper, load_dump  # noqa: E402
from accuracy.examples import bench_setup, bench_step  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TENSOR_TOKENS = 2048  # larger steps time the statistics dump only (a tensor dump: GBs a step)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _setup(device: str, batch: int, seq: int):
    model, (x, y) = bench_setup(batch=batch, seq=seq)
    return model.to(device), (x.to(device), y.to(device))


class _Paths:
    """A fresh dump path per run (a dumper never overwrites unasked), removed outside the
    clock."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name, self.n = folder, name, 0

    def next(self) -> Path:
        self.n += 1
        return self.folder / f"{self.name}{self.n}.h5"

    def clean(self) -> None:
        for p in self.folder.glob(f"{self.name}*.h5"):
            p.unlink()


def time_dumps(device: str, batch: int, seq: int, repeat: int, work: Path) -> None:
    model, data = _setup(device, batch, seq)
    paths = {m: _Paths(work, m) for m in ("statistics", "tensor")}

    def bare() -> None:
        bench_step(model, data)
        model.zero_grad(set_to_none=True)
        _sync(device)

    def dumped(mode: str):
        def run() -> None:
            with dumper(dump_path=str(paths[mode].next()), mode=mode):
                bench_step(model, data)
            model.zero_grad(set_to_none=True)
            _sync(device)
        return run

    modes = ("statistics", "tensor") if batch * seq <= TENSOR_TOKENS else ("statistics",)
    times = interleaved({"bare": bare, **{m: dumped(m) for m in modes}}, repeat=repeat,
                        before={m: paths[m].clean for m in modes})
    ops = len(load_dump(next(work.glob("statistics*.h5"))).records)
    size = next(work.glob("tensor*.h5")).stat().st_size if "tensor" in modes else 0
    for p in paths.values():
        p.clean()
    b = times["bare"]
    print(f"  batch {batch} x seq {seq} on {device}: bare step {spread(b, '{:.4f}')} s; "
          f"{ops} ops recorded")
    for mode in modes:
        r = ratios(times[mode], b)
        per_op = (statistics.median(times[mode]) - statistics.median(b)) / max(ops, 1) * 1e6
        print(f"    {mode:10s} {spread(times[mode], '{:.4f}')} s = {statistics.median(r):.2f}x "
              f"bare (rounds {min(r):.2f}-{max(r):.2f}), {per_op:.0f} us per op"
              + (f", {size / 1e6:.0f} MB" if mode == "tensor" else ""))


def host_traffic(device: str, batch: int, seq: int, work: Path) -> None:
    """Device-to-host copies and synchronisations of one recorded step, from the CUDA runtime
    calls torch.profiler sees (the bare step's own counted apart)."""
    if device != "cuda":
        print("  host traffic: counted on CUDA only")
        return
    from torch.profiler import ProfilerActivity, profile

    model, data = _setup(device, batch, seq)
    bench_step(model, data)  # warm
    model.zero_grad(set_to_none=True)

    def count(mode: str | None) -> dict[str, int]:
        _sync(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            if mode is None:
                bench_step(model, data)
            else:
                with dumper(dump_path=str(work / f"traffic-{mode}.h5"), mode=mode):
                    bench_step(model, data)
            _sync(device)
        model.zero_grad(set_to_none=True)
        got = {"DtoH copies": 0, "syncs": 0}
        for e in prof.events():
            name = e.name
            if "Memcpy" in name and "DtoH" in name and e.device_type.name == "CUDA":
                got["DtoH copies"] += 1
            elif name in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                          "cudaEventSynchronize"):
                got["syncs"] += 1
        return got

    base = count(None)
    print(f"  host traffic, batch {batch} x seq {seq} (torch.profiler's CUDA runtime events): "
          f"bare step {base}")
    for mode in ("statistics", "tensor"):
        got = count(mode)
        ops = len(load_dump(work / f"traffic-{mode}.h5").records)
        extra = {k: got[k] - base[k] for k in got}
        print(f"    {mode:10s} {got} for {ops} ops: {extra['syncs'] / ops:.3f} syncs and "
              f"{extra['DtoH copies'] / ops:.3f} copies per op beyond the bare step")


def _cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "accuracy.cli", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    return f"(exit {out.returncode})\n" + out.stdout + out.stderr[-2000:]


def _summary(text: str) -> str:
    keep = [ln for ln in text.splitlines()
            if re.search(r"exit|verdict|rows|pass|error|warning|culprit|first divergence|"
                         r"PASS|FAIL|BLIND|not compared", ln)]
    return "\n".join("      " + ln.strip() for ln in keep[:14])


def compare_with_cpu(device: str, batch: int, seq: int, work: Path) -> None:
    """Golden: the step on CPU in fp32. Mine: the same weights and batch on the device, in
    fp32 and under bf16 autocast."""
    runs = {}
    for side, dev, amp in (("cpu", "cpu", False), ("gpu-fp32", device, False),
                           ("gpu-bf16", device, True)):
        model, data = _setup(dev, batch, seq)
        path = work / f"{side}.h5"
        if path.exists():
            path.unlink()
        ctx = torch.autocast(dev, dtype=torch.bfloat16) if amp else torch.autocast(
            dev, enabled=False)
        with dumper(dump_path=str(path), mode="tensor"):
            with ctx:
                loss = bench_step(model, data)
        runs[side] = path
        print(f"  {side}: loss {loss.item():.6f}")
    for side in ("gpu-fp32", "gpu-bf16"):
        print(f"  accuracy compare -m {side}.h5 -g cpu.h5")
        print(_summary(_cli("compare", "-m", str(runs[side]), "-g", str(runs["cpu"]),
                            "-out", str(work / f"report-{side}"))))
    rep = work / "replay" / "replay.h5"
    shutil.rmtree(rep.parent, ignore_errors=True)
    rep.parent.mkdir()
    t0 = time.perf_counter()
    print("  accuracy replay gpu-bf16.h5 --on cpu -o replay/replay.h5 "
          f"{_summary(_cli('replay', str(runs['gpu-bf16']), '--on', 'cpu', '-o', str(rep)))}")
    print(f"    replay took {time.perf_counter() - t0:.1f} s")
    print("  accuracy compare -m gpu-bf16.h5 -g cpu.h5 -r replay/replay.h5")
    print(_summary(_cli("compare", "-m", str(runs["gpu-bf16"]), "-g", str(runs["cpu"]),
                        "-r", str(rep), "-out", str(work / "report-bf16-replay"))))


def compiled(device: str, batch: int, seq: int, repeat: int, work: Path) -> None:
    model, data = _setup(device, batch, seq)
    step = torch.compile(model)
    t0 = time.perf_counter()
    bench_step(step, data)
    model.zero_grad(set_to_none=True)
    _sync(device)
    print(f"  compiled: first step (compile) {time.perf_counter() - t0:.1f} s")
    paths = _Paths(work, "compiled")

    def bare() -> None:
        bench_step(step, data)
        model.zero_grad(set_to_none=True)
        _sync(device)

    def dumped() -> None:
        with dumper(dump_path=str(paths.next()), mode="statistics"):
            bench_step(step, data)
        model.zero_grad(set_to_none=True)
        _sync(device)

    times = interleaved({"bare": bare, "statistics": dumped}, repeat=repeat,
                        before={"statistics": paths.clean})
    dump = load_dump(next(work.glob("compiled*.h5")))
    kinds: dict[str, int] = {}
    for r in dump.records:
        k = r.op.split(".", 1)[0]
        kinds[k] = kinds.get(k, 0) + 1
    r = ratios(times["statistics"], times["bare"])
    print(f"    bare compiled step {spread(times['bare'], '{:.4f}')} s; statistics dump "
          f"{statistics.median(r):.2f}x; recorded by namespace: {kinds}")
    blind = dump.attrs.get("blind") or dump.attrs.get("not_recorded")
    if blind:
        print(f"    the dump says: {blind}")
    paths.clean()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="8x128,64x512",
                    help="batch x sequence, comma-separated; the tensor dump is timed up to "
                         f"{TENSOR_TOKENS} tokens a step, compared at the first size")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--skip", default="", help="parts to skip: time,traffic,compare")
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        return run_both_threads()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here (torch.cuda.is_available() is False); "
              "--device cpu runs the script on CPU")
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}; {torch.get_num_threads()} CPU threads "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    skip = set(args.skip.split(",")) - {""}
    if "time" not in skip:
        print("dump cost (interleaved rounds, each step synchronized):")
        for b, s in sizes:
            time_dumps(args.device, b, s, args.repeat, args.workdir)
    if "traffic" not in skip:
        host_traffic(args.device, *sizes[0], args.workdir)
    if "compare" not in skip:
        print(f"{args.device} against CPU, batch {sizes[0][0]} x seq {sizes[0][1]}:")
        compare_with_cpu(args.device, *sizes[0], args.workdir)
    if args.compile:
        compiled(args.device, *sizes[-1], args.repeat, args.workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
