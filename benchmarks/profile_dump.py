"""Where a dump's time goes, sampled: the bench step dumped under py-spy, samples sorted by part.

bench_dump_parts.py switches parts off one at a time, and wrappers around functions cost a
call each (they once put the recorder's `entry` at 17 µs a tensor, four times what it takes).
A sampling profiler changes nothing it measures: py-spy stops the process `--rate` times a
second and reads every thread's Python stack. Each sample of the training thread is sorted:

- the op itself: under the loop's `run_here`, with no frame of ours beneath it (torch's own
  work, which the bare step does too);
- ours: a frame of `accuracy` is the innermost frame of ours (counted under that function,
  and under every function of ours on the stack, for the inclusive table);
- the model's Python: inside the step, no frame of ours (module calls, autograd's Python);
- the dump's open and close: inside `dumper.__enter__` or `__exit__`, outside the step;
- other: the rest of the training thread outside the step (between dumps).

py-spy attaches once the child process has warmed up (imports, the C++ module, the first
dumps), so one-time costs are not counted.

Other threads' samples (the dump writer) are counted apart. Figures are milliseconds per step:
samples / rate / steps. py-spy is not a dependency: `pip install py-spy` into any
environment, or `--py-spy PATH`.

Run: .venv/bin/python benchmarks/profile_dump.py [--mode statistics] [--seconds 30]
     [--rate 100] [--threads both|N]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from _common import threads_from_argv

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

from _common import add_threads_arg, run_both_threads

OURS = "(accuracy/"  # py-spy names a frame "function (path/to/file.py:line)"
NOT_OURS = ("(accuracy/examples.py",)  # the bench model is the user's code
STEP = "bench_step"
OP = "run_here"
PARTS = ("the op itself", "ours", "the model's Python", "the dump's open and close", "other",
         "other threads")
IN_STEP = PARTS[:4]  # the training thread's time per dumped step


@dataclass
class Profile:
    """Samples of one py-spy raw file, sorted by part (see the module docstring)."""

    parts: collections.Counter = field(default_factory=collections.Counter)
    own: collections.Counter = field(default_factory=collections.Counter)  # innermost ours
    inclusive: collections.Counter = field(default_factory=collections.Counter)


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _ours(frame: str) -> bool:
    return OURS in frame and not frame.startswith(NOT_OURS, frame.find(" (") + 1)


def read_profile(lines: list[str]) -> Profile:
    """Sort py-spy's raw lines ("frame;frame;... count", outermost first) by part."""
    prof = Profile()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        names = [_name(f) for f in frames]
        if "Thread._bootstrap" in names[:2]:  # a thread Python started: the writer's
            prof.parts["other threads"] += n
            continue
        if STEP not in names:
            edge = "dumper.__enter__" in names or "dumper.__exit__" in names
            prof.parts["the dump's open and close" if edge else "other"] += n
            continue
        mine = [i for i, f in enumerate(frames) if _ours(f)]
        if not mine:
            prof.parts["the model's Python"] += n
        elif names[mine[-1]] == OP:
            prof.parts["the op itself"] += n
        else:
            prof.parts["ours"] += n
            prof.own[names[mine[-1]]] += n
            for name in {names[i] for i in mine if names[i] != OP}:
                prof.inclusive[name] += n
    return prof


def report(prof: Profile, rate: float, steps: int, top: int = 20) -> str:
    """The parts and our functions in milliseconds per step."""
    per = 1e3 / rate / max(1, steps)
    total = sum(prof.parts[p] for p in IN_STEP)
    out = [f"{steps} dumped steps, {sum(prof.parts.values())} samples at {rate:g} Hz; "
           "milliseconds per step (the training thread, then the rest; shares of the step "
           "with its open and close)"]
    for p in PARTS:
        share = f"{prof.parts[p] / total * 100:5.1f}%" if p in IN_STEP and total else ""
        out.append(f"  {p:24s} {prof.parts[p] * per:8.1f} ms {share}")
    for title, counter in (("ours, by innermost function", prof.own),
                           ("ours, inclusive", prof.inclusive)):
        out.append(f"{title}:")
        out += [f"  {name:44s} {n * per:7.2f} ms" for name, n in counter.most_common(top)]
    return "\n".join(out)


def _child(mode: str, folder: str) -> None:
    """The profiled process: warms up, says `ready`, then dumps the bench step, one dump a
    step, from `go` until `stop` appears in `folder`; writes how many steps into `steps`."""
    import time

    from accuracy import dumper
    from accuracy.examples import bench_setup, bench_step

    signals = Path(folder)
    model, batch = bench_setup()
    dumps = tempfile.mkdtemp(prefix="profile_dump_",
                             dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    path = Path(dumps) / "p.h5"

    def step() -> None:
        with dumper(dump_path=path, mode=mode, overwrite=True):
            bench_step(model, batch)

    for _ in range(3):  # warm: imports and the C++ module's load are not the step's
        step()
    (signals / "ready").touch()
    while not (signals / "go").exists():
        time.sleep(0.01)
    steps = 0
    while not (signals / "stop").exists():
        step()
        steps += 1
    (signals / "steps").write_text(str(steps))
    shutil.rmtree(dumps, ignore_errors=True)


def find_py_spy(given: str) -> str:
    """The py-spy executable `given` names (a path, or a name on PATH); else exit with one
    line saying what to do, before the profiled process is started."""
    found = shutil.which(given) if given else None
    if not found:
        where = f" at {given!r}" if given else ""
        sys.exit(f"py-spy not found{where}: `pip install py-spy` (any environment), or "
                 f"--py-spy PATH to its executable")
    return found


def record(py_spy: str, pid: int, rate: int, seconds: float, raw: Path) -> None:
    """Sample `pid` into `raw` (py-spy's raw format); a py-spy that fails (no permission to
    read another process's memory, say) ends the run with its own last words."""
    # blocking samples (py-spy's default): the stacks it reads are whole
    done = subprocess.run([py_spy, "record", "--pid", str(pid), "-r", str(rate), "--duration",
                           str(max(1, round(seconds))), "-f", "raw", "-o", str(raw)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        said = (done.stderr or "").strip().splitlines()
        sys.exit(f"py-spy failed (exit {done.returncode}): {said[-1] if said else 'no message'}"
                 f" (it must be allowed to read another process: run as its owner, or with "
                 f"CAP_SYS_PTRACE)")


def _profile(py_spy: str, mode: str, seconds: float, rate: int) -> tuple[Profile, int]:
    """Start the child, let it warm up, sample it for `seconds`; its profile and steps."""
    import time

    with tempfile.TemporaryDirectory() as tmp:
        signals, raw = Path(tmp), Path(tmp) / "raw.txt"
        child = subprocess.Popen([sys.executable, __file__, "--child", tmp, "--mode", mode])
        try:
            while not (signals / "ready").exists():
                if child.poll() is not None:
                    sys.exit(f"the profiled process ended early (exit {child.returncode})")
                time.sleep(0.05)
            (signals / "go").touch()
            record(py_spy, child.pid, rate, seconds, raw)
            (signals / "stop").touch()
            child.wait(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
        return read_profile(raw.read_text().splitlines()), int((signals / "steps").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="statistics", choices=["statistics", "tensor"])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or "",
                    help="the py-spy executable (default: the one on PATH)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.child:
        _child(args.mode, args.child)
        return
    if args.threads == "both":
        sys.exit(run_both_threads())
    prof, steps = _profile(find_py_spy(args.py_spy), args.mode, args.seconds, args.rate)
    print(f"{args.mode} dump of the bench step, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.2f}")
    print(report(prof, args.rate, steps, args.top))


if __name__ == "__main__":
    main()
