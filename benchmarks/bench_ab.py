"""A/B of dump, replay, compare and live-check speed between two checkouts, alternated in one run.

Each round runs, for each checkout in turn (A B A B ...), a fresh process whose `accuracy`
comes from that checkout: it times the bench step bare (median of 3) and then the measured
job once, and prints both wall and CPU seconds. Alternating processes lets a machine shared
with other work slow both sides alike; the load average is printed with every figure.

Jobs: `stats` and `tensor` (the bench step dumped in that mode), `replay` (figures-only, upcast
fp64, of a tensor dump of the bench step made once by checkout A, plain CPU or on `sim`),
`compare` (a second dump made on `sim(profile="bf16")`, the device under test, against that one
as golden, tensor metrics, no report files), `live` (the bench step under
`live_check(on="cpu")`, plain CPU or inside `sim`). The last lines give, per job, B's median
over A's median (of each run's time over its bare step's) and B's fastest CPU time over A's
(the figure a loaded machine disturbs least): a change that should cost nothing reads near 1.00
in both.

Run (e.g. an older commit against this tree; `git worktree add /tmp/old <commit>`):
    python benchmarks/bench_ab.py --a /tmp/old --b . --rounds 5 \
        --jobs stats,tensor,replay,compare [--threads 1]
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
from pathlib import Path

HERE = Path(__file__).resolve()
MODE_OF_JOB = {"stats": "statistics", "tensor": "tensor"}


def _child(args: argparse.Namespace) -> None:

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from _common import bare_step, on_device

    from accuracy.examples import bench_setup, bench_step

    model, batch = bench_setup()
    profile = None if args.profile == "none" else args.profile

    def device():
        return on_device(profile)

    def bare() -> None:
        bare_step(model, batch, profile)

    if args.job == "dump":
        from accuracy import dumper
        with device(), dumper(dump_path=args.dump, mode="tensor"):
            bench_step(model, batch)
        return
    if args.job in ("stats", "tensor"):
        from accuracy import dumper
        out = Path(args.dump).with_name(f"{args.job}-{os.getpid()}.h5")

        def job() -> object:
            with device(), dumper(dump_path=str(out), mode=MODE_OF_JOB[args.job]):
                bench_step(model, batch)
            model.zero_grad(set_to_none=True)
            size = out.stat().st_size
            out.unlink()
            return f"{size / 1e6:.0f} MB"
    elif args.job == "compare":
        from accuracy.compare import compare
        on_sim = Path(args.dump).with_name("sim-bf16.h5")

        def job() -> object:
            result = compare(str(on_sim), str(args.dump))
            return f"{len(result.rows)} rows"
    elif args.job == "replay":
        from accuracy.replay import replay
        out = Path(args.dump).with_name(f"replay-{os.getpid()}.h5")

        def job() -> object:
            r = replay(args.dump, out)
            out.unlink()
            return f"{r.ok} ok, {r.skipped} skipped, {r.failed} failed"
    else:
        from accuracy.live import live_check

        def job() -> object:
            with device(), live_check(on="cpu") as chk:
                bench_step(model, batch)
            model.zero_grad(set_to_none=True)
            return {str(k): v for k, v in chk.counts().items()}

    bare()
    job()  # warm-up of each
    bares = []
    for _ in range(3):
        t0 = time.perf_counter()
        bare()
        bares.append(time.perf_counter() - t0)
    c0, t0 = time.process_time(), time.perf_counter()
    what = job()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    c1 = time.process_time()
    bare()
    bare_cpu = time.process_time() - c1
    print(json.dumps({"bare": statistics.median(bares), "bare_cpu": bare_cpu, "wall": wall,
                      "cpu": cpu, "threads": torch.get_num_threads(), "what": what,
                      "load": os.getloadavg()[0]}))


def _run(checkout: Path, argv: list[str], threads: int | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, str(HERE), "--child", *argv], env=env,
                          capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{checkout}: {proc.stderr[-2000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--job", choices=["stats", "tensor", "replay", "compare", "live", "dump"],
                    default="replay")
    ap.add_argument("--dump", default="")
    ap.add_argument("--a", type=Path, help="checkout A (e.g. a copy of main)")
    ap.add_argument("--b", type=Path, help="checkout B (e.g. this branch)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS / torch threads (default: torch's)")
    ap.add_argument("--profile", default="none", help="sim profile, or none (plain CPU)")
    ap.add_argument("--jobs", default="replay,live")
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    assert args.a and args.b, "--a and --b are required"
    tmp = Path(tempfile.mkdtemp(prefix="bench_ab_"))
    dump = tmp / "tensor.h5"
    common = ["--profile", args.profile] + (["--threads", str(args.threads)]
                                            if args.threads else [])
    _run(args.a, ["--job", "dump", "--dump", str(dump), *common], args.threads)
    if "compare" in args.jobs.split(","):
        on_sim = ["--profile", "bf16"] + common[2:]
        _run(args.a, ["--job", "dump", "--dump", str(tmp / "sim-bf16.h5"), *on_sim], args.threads)
    print(f"profile {args.profile}, threads {args.threads or 'default'}; A={args.a} "
          f"B={args.b}; dump {dump.stat().st_size / 1e6:.0f} MB; load at start "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'job':7s} {'side':4s} {'round':>5s} {'bare s':>7s} {'job s':>7s} {'x bare':>7s} "
          f"{'CPU x bare':>10s} {'load':>5s}  result")
    summary: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for job in args.jobs.split(","):
        for i in range(args.rounds):
            for side, checkout in (("A", args.a), ("B", args.b)):
                r = _run(checkout, ["--job", job, "--dump", str(dump), *common], args.threads)
                x, xc = r["wall"] / r["bare"], r["cpu"] / r["bare_cpu"]
                summary.setdefault((job, side), []).append(x)
                cpu.setdefault((job, side), []).append(r["cpu"])
                print(f"{job:7s} {side:4s} {i:5d} {r['bare']:7.3f} {r['wall']:7.3f} {x:7.2f} "
                      f"{xc:10.2f} {r['load']:5.1f}  {r['what']}", flush=True)
    goal = {"replay": 3.0, "live": 2.0}
    for (job, side), xs in summary.items():
        m = statistics.median(xs)
        said = (f"; goal ≤ {goal[job]:g}x: {'met' if m <= goal[job] else 'not met'}"
                if job in goal else "")
        print(f"{job} {side}: median {m:.2f}x bare (min {min(xs):.2f}, max {max(xs):.2f})"
              f"{said}")
    for job in args.jobs.split(","):
        a, b = summary[(job, "A")], summary[(job, "B")]
        each = ", ".join(f"{y / x:.3f}" for x, y in zip(a, b, strict=True))
        print(f"{job}: B/A {statistics.median(b) / statistics.median(a):.3f} "
              f"(round by round: {each}); CPU seconds B/A, fastest of each side: "
              f"{min(cpu[(job, 'B')]) / min(cpu[(job, 'A')]):.3f}")
    print(f"load at end {os.getloadavg()[0]:.1f}")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()


if __name__ == "__main__":
    main()
