"""What this machine allows: the floors under issue 31's statistics and tensor dump goals.

Each floor is work a dump of the bench step cannot avoid, timed on the step without the rest:

- `empty mode`: a TorchDispatchMode that only runs each op (torch's own cost of a Python mode);
- `dumper, nothing recorded`: our dumper with no observer (its mode, module scope, source
  lookup, the file's open and close), i.e. every cost of the dumper but the recording;
- `statistics pass`: the empty mode plus the statistics (`tensor_stats`, the C pass where it
  applies) of every new tensor state, as the recorder takes them (each output, and each input
  state not seen before), with no bookkeeping; a view of an op's input and an `empty*`
  output are no new state (on the bench step: 310 MB in ~200 tensors; the tensor dump stored
  568 MB until schema 6, the transposed views of weights and activations (`t`, `transpose`,
  `squeeze`: 258 MB) again in their own order, and stores 326.5 MB since: each storage
  version once, views read through their strides);
- `copy once`: the empty mode plus one private contiguous copy of every new tensor state: the
  issue's own yardstick for a tensor dump ("the step slowed by no more than copying its bytes
  once");
- `copy, hash, write`: `copy once` plus the XXH3-64 of each copy and its write into a file in
  the dump folder, on the same thread: the CPU a tensor dump's bytes need at the least.

The floor of a statistics dump is `dumper, nothing recorded` plus what the statistics pass
adds to the empty mode; the floor of a tensor dump is the same frame plus what `copy, hash,
write` adds. Sides run interleaved (bare, empty mode, ... bare, ...), as in bench_dump.py, and
the real dumps run beside them, so every figure shares one window. msprobe's L1 tensor dump
runs in the same command where it is installed (the tensor goal is half its ratio).

Run: .venv/bin/python benchmarks/bench_floors.py [--repeat 7] [--threads both|N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import weakref
from pathlib import Path

from _common import threads_from_argv

if __name__ == "__main__":
    threads_from_argv()  # before torch reads OMP_NUM_THREADS

import torch
import xxhash
from _common import (
    add_threads_arg,
    interleaved,
    msprobe_available,
    ratios,
    run_both_threads,
    run_msprobe,
    spread,
    verdict,
)
from torch.utils._python_dispatch import TorchDispatchMode

from accuracy import dumper
from accuracy.aten import plan_of
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.identity import same_memory
from accuracy.dumpfile.stats import tensor_stats
from accuracy.examples import bench_setup, bench_step

_TMPFS = "/dev/shm"
_OPS = 559  # ATen ops of the bench step (forward and backward)


class _EveryNewState(TorchDispatchMode):
    """Runs each op and hands `work` every tensor state not seen before (inputs before the
    op, outputs after it, but for a view of one of its inputs), as the recorder meets them;
    `work` None: only runs the op."""

    def __init__(self, work=None) -> None:
        super().__init__()
        self.work = work
        # id -> (the tensor, weakly, its version): an id is reused once its tensor is freed
        self.seen: dict[int, tuple[weakref.ref, int]] = {}

    def _new(self, tensors: list[torch.Tensor], stored: bool = True) -> None:
        """`stored` False: remember the states without work (views of what was stored)."""
        for t in tensors:
            if type(t) is not torch.Tensor or t.layout != torch.strided:
                continue
            hit = self.seen.get(id(t))
            if hit is None or hit[0]() is not t or hit[1] != t._version:
                self.seen[id(t)] = (weakref.ref(t), t._version)
                if stored:
                    self.work(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.work is None:
            return func(*args, **kwargs)
        inputs = tensors_in(kwargs, tensors_in(args))
        with torch._C._DisableTorchDispatch():
            self._new(inputs)
        out = func(*args, **kwargs)
        outputs, views = tensors_in(out), []
        if plan_of(func).uninitialised:  # empty*: no values yet, never stored
            outputs = []
        elif not func._schema.is_mutable:  # a view of an input holds no new bytes
            views = [o for o in outputs if any(same_memory(o, i) for i in inputs)]
            outputs = [o for o in outputs if all(o is not v for v in views)]
        with torch._C._DisableTorchDispatch():
            self._new(outputs)
            self._new(views, stored=False)
        return out


def _copy(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-msprobe", action="store_true")
    ap.add_argument("--dir", default=_TMPFS if os.path.isdir(_TMPFS) else None,
                    help="folder for the dumps (default: tmpfs /dev/shm where there is one)")
    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        sys.exit(run_both_threads())
    model, batch = bench_setup()
    tmp = Path(tempfile.mkdtemp(prefix="bench_floors_", dir=args.dir))
    sink_path = tmp / "bytes.bin"

    def with_mode(work=None):
        def run():
            with _EveryNewState(work):
                bench_step(model, batch)
        return run

    def nothing_recorded():
        d = dumper(dump_path=tmp / "frame.h5", mode="statistics", overwrite=True)
        with d:
            # the dumper's mode, loop (numbering, placing), scope and file; no observer
            # sees an op. (`d._observers = ()`, what this did before the one loop of issue
            # 45, took no observer away after it: the side recorded the whole dump.)
            loop = d._loop
            loop._shown = loop._every = ()
            bench_step(model, batch)

    def copy_hash_write():
        fd = os.open(sink_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

        def work(t: torch.Tensor) -> None:
            c = _copy(t)
            if c.numel():
                raw = c.reshape(-1).view(torch.uint8).numpy()
                xxhash.xxh3_64_intdigest(raw.data)
                os.write(fd, raw.data)
        try:
            with_mode(work)()
        finally:
            os.close(fd)

    def dump(mode: str):
        def run():
            with dumper(dump_path=tmp / f"{mode}.h5", mode=mode, overwrite=True):
                bench_step(model, batch)
        return run

    sides = {
        "bare": lambda: bench_step(model, batch),
        "empty mode": with_mode(),
        "dumper, nothing recorded": nothing_recorded,
        "statistics pass": with_mode(lambda t: tensor_stats(t)),
        "copy once": with_mode(_copy),
        "copy, hash, write": copy_hash_write,
        "accuracy statistics": dump("statistics"),
        "accuracy tensor": dump("tensor"),
    }
    # each side's last files are removed before the clock starts (as msprobe_runner.py does)
    files = {"copy, hash, write": sink_path, "accuracy statistics": tmp / "statistics.h5",
             "accuracy tensor": tmp / "tensor.h5", "dumper, nothing recorded": tmp / "frame.h5"}
    t = interleaved(sides, repeat=args.repeat, warmup=args.warmup,
                    before={k: (lambda p=p: p.unlink(missing_ok=True)) for k, p in files.items()})
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; {args.repeat} interleaved rounds, "
          f"median (min–max); load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    bare = statistics.median(t["bare"])
    for name, secs in t.items():
        print(f"  {name:26s} {spread(secs):>28s}   x bare "
              f"{spread(ratios(secs, t['bare']), '{:.2f}')}")

    def added(side: str, base: str) -> float:
        return statistics.median(t[side]) - statistics.median(t[base])

    frame = added("dumper, nothing recorded", "bare")  # torch's mode and ours together

    def side(name: str) -> float:
        return statistics.median(ratios(t[name], t["bare"]))
    # torch's own floor: a Python dispatch mode over the step plus the work on the bytes;
    # "with the frame": plus the dumper's own loop, scope and file, which are ours to cut
    stats_torch, copy_torch, bytes_torch = (side("statistics pass"), side("copy once"),
                                            side("copy, hash, write"))
    stats_floor = (bare + frame + added("statistics pass", "empty mode")) / bare
    copy_floor = (bare + frame + added("copy once", "empty mode")) / bare
    bytes_floor = (bare + frame + added("copy, hash, write", "empty mode")) / bare
    stats_real = side("accuracy statistics")
    tensor_real = side("accuracy tensor")
    per_op = added("statistics pass", "bare") / _OPS * 1e6
    print(f"statistics dump: ours {stats_real:.2f}x bare ({verdict(stats_real, 1.3)}); torch's "
          f"floor (a Python dispatch mode + the statistics pass) {stats_torch:.2f}x, "
          f"{per_op:.0f} us per op (goal 60 us: the floor "
          f"{'allows it' if per_op <= 60 else 'is above it'}); with the dumper's frame (its "
          f"mode, loop, module scope and file, {frame * 1e3:.1f} ms: ours to cut, no floor) "
          f"{stats_floor:.2f}x; goal 1.3x: torch's floor "
          f"{'allows it' if stats_torch <= 1.3 else 'is above it'}")
    print(f"tensor dump: ours {tensor_real:.2f}x bare; torch's floor copying the bytes once "
          f"{copy_torch:.2f}x, copying, hashing and writing them on one thread "
          f"{bytes_torch:.2f}x; with the dumper's frame {copy_floor:.2f}x and "
          f"{bytes_floor:.2f}x")
    if msprobe_available() and not args.no_msprobe:
        m = run_msprobe("interleaved", str(args.repeat), str(tmp / "msprobe"), timeout=3600)
        ms_ratio = statistics.median(ratios(m["tensor"], m["bare"]))
        goal = 0.5 * ms_ratio
        print(f"msprobe L1 tensor {ms_ratio:.2f}x its bare step (same command): the goal, half "
              f"its time, is {goal:.2f}x bare; the copy-once floor (with the frame) "
              f"{'allows it' if copy_floor <= goal else 'is above it'}, the copy-hash-write "
              f"floor {'allows it' if bytes_floor <= goal else 'is above it'}; ours "
              f"{verdict(tensor_real, goal)}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
