"""`accuracy demo`: the whole story on the emulated accelerator, in about a minute.

1. a small transformer LM (built in) runs one training step on CPU in fp32: the golden run;
2. the same step runs on `sim` with the fp16-cube profile and one injected fault deep in the
   model (a device GELU kernel using the tanh approximation, by default);
3. the device dump is replayed on CPU and compared with the golden run: verdict counts, the
   first divergence and the top suspects, each with module path and source line;
4. an fp16 step that overflows is checked, and the op where inf was born is named;
5. the device step runs again under a live check (no dump): it stops at the first op whose
   own kernel is wrong, with its module, source line and figures;
6. proof by substitution: the culprit op runs on the CPU reference and the step's loss and
   gradients come back to those of a healthy device at the same precision; a random control
   of as many other ops does not;
7. the static HTML report is written and (unless --no-serve) served by `accuracy serve`.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accuracy.cliargs import add_progress_flags, port, progress_wanted
from accuracy.dumper import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm

DEMO_LAYERS = 4


@dataclass
class DemoResult:
    golden: Path
    device: Path
    replay: Path
    report_dir: Path
    overflow_dump: Path
    fault: Any  # the injected sim.fault(...)
    summary: dict[str, Any]
    overflow: Any
    live_stop: Any = None  # the live check's OpResult where it stopped (None: it did not)
    proof: Any = None  # accuracy.live.prove's Proof
    seconds: dict[str, float] = field(default_factory=dict)

    def format(self) -> str:
        return format_result(self)


OVERFLOW_MODULE = "encoder.layers.1.linear2"


def overflow_step(path: Path) -> None:
    """Run the demo's LM in fp16 with one badly scaled projection (`OVERFLOW_MODULE`: outputs
    reach ~1e5, fine in fp32, inf in fp16) under overflow checking. Its causal mask's -inf is
    intended, not a birth, so overflow_nums=1 stops at the projection."""
    model = tiny_lm(layers=DEMO_LAYERS).half()
    with torch.no_grad():
        model.get_submodule(OVERFLOW_MODULE).weight.mul_(2e5)
    x, y = lm_batch(batch=2, seq=16)
    with dumper(dump_path=path, overwrite=True, check_overflow=True, overflow_nums=1):
        logits = model(x).float()
        nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                    y.reshape(-1)).backward()


def _check_fault_names(golden: Path, fault_op: str, fault_module: str | None) -> None:
    """The fault's op and module patterns against the step's own names (the golden run's
    dump), before the device run: a fault that meets no call leaves a clean run, and the demo
    would end 'no culprit' minutes later."""
    from accuracy.dumpfile import load_dump
    from accuracy.errors import NoMatchError
    from accuracy.patterns import closest, module_matches, no_op_message, unmatched_ops

    with load_dump(golden) as d:
        sites = {(r.op, r.module) for r in d.records}
    ops = {op for op, _ in sites}
    if unmatched_ops([fault_op], ops):
        raise NoMatchError("--fault-op: " + no_op_message(fault_op, ops, "the demo's step"))
    modules = {m for op, m in sites if m and unmatched_ops([fault_op], [op]) == []}
    if fault_module and not any(module_matches(fault_module, m) for m in modules):
        near = ", ".join(closest(fault_module, modules, 5)) or "none"
        raise NoMatchError(f"--fault-module: {fault_module!r} matches no module running "
                           f"{fault_op!r} in the demo's step; those modules, closest first: "
                           f"{near}")


def run_demo(
    out_dir: str | Path = "demo_out",
    *,
    profile: str = "fp16-cube",
    fault_op: str = "aten.gelu.default",
    fault_module: str = "encoder.layers.2",
    fault_kind: str = "replace",
    fault_value: Any = "gelu-tanh",
    progress: Callable[[str], None] = lambda _msg: None,
    show_bars: bool = False,
) -> DemoResult:
    """Run every step of the demo into `out_dir`; `progress` receives one line per step."""
    from accuracy.compare import compare
    from accuracy.device_backend import sim
    from accuracy.device_backend.profiles import get_profile
    from accuracy.live import LiveCheckError, live_check, prove
    from accuracy.overflow import scan
    from accuracy.replay import replay

    get_profile(profile)  # an unknown name is refused before the first run (UsageError)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    golden, device, rep = out / "golden_cpu.h5", out / "device_sim.h5", out / "replay.h5"
    report_dir, ovf = out / "report", out / "overflow_fp16.h5"
    batch = lm_batch()
    seconds: dict[str, float] = {}

    def timed(name: str, msg: str, fn: Callable[[], Any]) -> Any:
        progress(msg)
        t0 = time.perf_counter()
        result = fn()
        seconds[name] = time.perf_counter() - t0
        return result

    def golden_run() -> None:
        model = tiny_lm(layers=DEMO_LAYERS)
        with dumper(dump_path=golden, overwrite=True):
            lm_step(model, batch)

    fault = sim.fault(fault_op, module=fault_module, kind=fault_kind, value=fault_value)

    def device_run() -> None:
        model = tiny_lm(layers=DEMO_LAYERS)  # same seed: the same weights as the golden run
        with sim(profile=profile, faults=[fault]):
            with dumper(dump_path=device, overwrite=True):
                lm_step(model, batch)

    def live_run() -> Any:
        model = tiny_lm(layers=DEMO_LAYERS)
        try:
            with sim(profile=profile, faults=[fault]), live_check(on="cpu", stop_on="error"):
                lm_step(model, batch)
        except LiveCheckError as stop:
            return stop.result
        return None

    def step() -> tuple[torch.Tensor, nn.Module]:
        model = tiny_lm(layers=DEMO_LAYERS)
        return lm_step(model, batch), model

    def healthy_device() -> tuple[torch.Tensor, nn.Module]:
        with sim(profile=profile):  # the same device without the fault: the gap is the fault's
            return step()

    timed("golden", "[1/6] golden run: CPU fp32, one training step, tensor dump", golden_run)
    _check_fault_names(golden, fault_op, fault_module)
    timed("device", f"[2/6] device run: sim profile {profile}, fault {fault_kind} in "
                    f"{fault_op} @ {fault_module}", device_run)
    timed("replay", "[3/6] replaying the device dump on CPU (same dtype and fp64)",
          lambda: replay(device, rep, overwrite=True, progress=show_bars))
    report = timed("compare", "[4/6] comparing device vs golden, with the replay",
                   lambda: compare(device, golden, replay=rep, progress=show_bars))
    report.write(report_dir)
    timed("overflow", "[5/6] overflow check of an fp16 step", lambda: overflow_step(ovf))
    overflow = scan(ovf)
    live_stop = timed("live", "[6/6] live check of the device step (no dump), then proof by "
                              "substitution", live_run)
    culprit = report.summary.get("culprit")
    proof = None
    if culprit:
        proof = timed("prove", "      proving the culprit: substituted by the CPU reference, "
                               "and a random control",
                      lambda: prove(step, culprits=f"{culprit['op']}@{culprit['module']}",
                                    golden=healthy_device,
                                    context=lambda: sim(profile=profile, faults=[fault]),
                                    report=report_dir / "proof"))
    return DemoResult(golden=golden, device=device, replay=rep, report_dir=report_dir,
                      overflow_dump=ovf, fault=fault, summary=report.summary,
                      overflow=overflow, live_stop=live_stop, proof=proof, seconds=seconds)


def _where(row: dict[str, Any]) -> str:
    return (f"{row['op']}  [{row['phase']}]  {row.get('module') or '-'}\n"
            f"        at {row.get('source') or '?'}   ({row.get('my_address')})")


def _figure(v: Any, digits: int) -> str:
    """A figure with `digits` significant digits (cosine needs 8 to show how far from 1)."""
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def format_result(res: DemoResult) -> str:
    """What the demo found, as the text `accuracy demo` prints."""
    s = res.summary
    counts = s["counts"]
    judged = s.get("judged_counts") or {}
    lines = ["", "verdicts: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
             "tensors judged where produced: "
             + ", ".join(f"{k} {judged.get(k, 0)}" for k in ("pass", "warning", "error"))]
    first = s.get("first_divergence")
    if first:
        lines.append(f"first divergence: {_where(first)}")
    culprit = s.get("culprit")
    if culprit:
        ratio = culprit.get("local_error_ratio")
        lines.append(f"CULPRIT: {_where(culprit)}\n        "
                     + (f"local error ratio {ratio:.3g} (its own kernel), " if ratio else "")
                     + f"cosine {_figure(culprit.get('cosine'), 8)}, max abs err "
                       f"{_figure(culprit.get('max_abs_err'), 3)}")
    else:
        lines.append("no culprit found")
    lines.append("top suspects:")
    lines += [f"  - {row['op']} in {row.get('module') or '-'} ({row.get('phase')}) "
              f"score {row.get('score', 0):.3g}" for row in s.get("suspects", [])[:5]]
    ovf = res.overflow
    if ovf.births:
        b = ovf.births[0]
        lines.append(f"\noverflow: inf/nan born in {b.op}  [{b.phase}]  {b.module or '-'}  "
                     f"at {b.source or '?'}  ({len(ovf.births)} birth op(s))")
    else:
        lines.append("\noverflow: no birth found")
    lines.append(f"\nlive check stopped at {res.live_stop.describe()}"
                 if res.live_stop is not None else "\nlive check: no op judged an error")
    if res.proof is not None:
        lines.append(f"proof: {res.proof.sentence}  "
                     f"({res.report_dir / 'proof' / 'proof.html'})")
    lines.append(f"\nreport: {res.report_dir / 'index.html'}   timings: "
                 + ", ".join(f"{k} {v:.1f}s" for k, v in res.seconds.items()))
    return "\n".join(lines)


def _cmd(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    res = run_demo(args.out, profile=args.profile, fault_op=args.fault_op,
                   fault_module=args.fault_module, fault_kind=args.fault_kind,
                   fault_value=args.fault_value, progress=lambda m: print(m, flush=True),
                   show_bars=progress_wanted(args))
    print(res.format())
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    if args.no_serve:
        return 0
    from accuracy.server import serve

    print("\nserving the report (Ctrl-C to stop)")
    data = Path(args.out) / "server"
    shutil.rmtree(data, ignore_errors=True)  # a fresh index: one copy of this demo's runs
    serving = serve(data, port=args.port, runs=[str(res.device), str(res.golden)],
                    reports=[str(res.report_dir)], verbose=args.verbose)
    print(serving.format())
    print("Ctrl-C stops the server (`make demo SERVE=0` or `accuracy demo --no-serve`: the demo "
          "without serving)", flush=True)
    serving.run()
    return 0


def _value(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("demo", help="run the end-to-end demo on the emulated accelerator")
    s.add_argument("--out", default="demo_out", help="folder for the demo's files")
    s.add_argument("--no-serve", action="store_true", help="don't start the server at the end")
    s.add_argument("--port", type=port, default=8000)
    s.add_argument("--profile", default="fp16-cube", help="sim numerics profile")
    s.add_argument("--fault-op", default="aten.gelu.default", help="op to inject a fault into")
    s.add_argument("--fault-module", default="encoder.layers.2",
                   help="module pattern where the fault applies")
    s.add_argument("--fault-kind", default="replace",
                   help="replace, bias, noise, nan, inf, eps, arg (see docs/backends.md)")
    s.add_argument("--fault-value", default="gelu-tanh", type=_value,
                   help="the fault's value (replacement name, relative bias, eps...)")
    add_progress_flags(s)
    s.set_defaults(func=_cmd)
