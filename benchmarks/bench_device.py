"""Host traffic of each flow on an accelerator, counted by the npu test device.

A copy from an accelerator to the host, and each wait for its queue, stalls the device (tens
of µs on a GPU or NPU) where a CPU benchmark shows nothing. The test device counts them
(`accuracy.testdevice.counting`): for one training step (forward, backward, AdamW) of a
small MLP on `npu`, this prints the copies to the host, their bytes and the
synchronisations of the bare step and of the same step under a statistics dump, a tensor
dump, the live check (reference on CPU) and the monitor (its defaults), in total and per
recorded op (the statistics dump's row count), and for the dumps the bytes per tensor row and
the bytes the dump stores (a tensor dump copies each once). Counts, not times: the device's
kernels are CPU's. The budget (statistics: at most one synchronisation per 64 ops and 64
bytes a tensor; tensor mode: each stored byte copied once, non-blocking, no wait per op) is
kept by the statistics window (accuracy/dumper/stats_window.py): one copy of the figures and
one wait per window of 64 ops. The step's ~60 ops make one window, whose wait is counted only
when the writer reaches it before the device finished it (here the step's own
`synchronize()` comes first).

    python benchmarks/bench_device.py --threads both
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import threads_from_argv

    threads_from_argv()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

KEYS = ("d2h_copies", "d2h_bytes", "syncs")


def _model_and_step(device: str):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                                torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 64, generator=g).to(device)
    y = torch.randint(0, 10, (32,), generator=g).to(device)

    def step(*_: object) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


def _count(flow: str, folder: Path) -> tuple[dict[str, int], tuple[int, int, int] | None]:
    """One step of `flow` after a warm-up step (AdamW's states made): its counters, and the
    rows its dump holds, its tensor rows and its stored bytes (dumps only)."""
    import accuracy.testdevice as td
    from accuracy import dumper, live_check, load_dump

    model, opt, step = _model_and_step("npu")
    step()
    import torch

    torch.npu.synchronize()
    path = folder / f"{flow}.h5"
    if flow == "monitor":
        import accuracy.monitor as am

        step = am.watch(step, model, opt, path=folder / "run.monitor.h5")
        step()  # its first step sets up the figures
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    if flow in ("statistics", "tensor"):
        ctx = dumper(str(path), mode=flow)
    elif flow == "live check":
        ctx = live_check(on="cpu")
    with td.counting() as c, ctx:
        step()
        torch.npu.synchronize()
    if flow == "monitor":
        step.monitor.close()
    counts = {"d2h_copies": c["d2h_copies"], "d2h_bytes": c["d2h_bytes"],
              "d2h_nonblocking": c["d2h_nonblocking"],
              "syncs": c["syncs_implicit"] + c["syncs_explicit"] - 1}  # less our own wait
    rows = None
    if flow in ("statistics", "tensor"):
        with load_dump(path) as d:
            tensors = [t for r in d.records for t in (*r.inputs, *r.outputs)]
            stored = sum(n for _, n in {(t.offset, t.nbytes) for t in tensors
                                        if t.nbytes > 0 and t.offset >= 0})
            rows = (len(d.records), len(tensors), stored)
    return counts, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from _common import add_threads_arg, run_both_threads

    add_threads_arg(ap)
    args = ap.parse_args()
    if args.threads == "both":
        return run_both_threads()
    import torch

    import accuracy.testdevice as td

    td.load()
    print(f"torch threads {torch.get_num_threads()}; load {os.getloadavg()[0]:.1f}")
    flows = ("bare", "statistics", "tensor", "live check", "monitor")
    with tempfile.TemporaryDirectory() as tmp:
        results = {f: _count(f, Path(tmp)) for f in flows}
    ops = results["statistics"][1][0] or 1
    print(f"one step (forward, backward, AdamW) of Linear-GELU-LayerNorm-Linear on npu: "
          f"{ops} recorded ops")
    print(f"{'flow':<12} {'copies':>7} {'bytes':>9} {'syncs':>6} | per op: {'copies':>7} "
          f"{'bytes':>8} {'syncs':>6}")
    for flow, (c, _rows) in results.items():
        print(f"{flow:<12} {c['d2h_copies']:>7} {c['d2h_bytes']:>9} {c['syncs']:>6} | "
              f"{'':8} {c['d2h_copies'] / ops:>7.2f} {c['d2h_bytes'] / ops:>8.1f} "
              f"{c['syncs'] / ops:>6.2f}")
    for flow in ("statistics", "tensor"):
        c, (_ops, tensors, stored) = results[flow]
        print(f"{flow} dump: {tensors} tensor rows, {c['d2h_bytes'] / tensors:.1f} bytes copied "
              f"a tensor row; {stored} bytes stored; {c['d2h_nonblocking']} of "
              f"{c['d2h_copies']} copies non-blocking")
    return 0


if __name__ == "__main__":
    sys.exit(main())
