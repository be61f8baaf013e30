"""Detection quality: false alarms on clean runs, culprit hits on faulty runs.

A matrix of runs on small models (a transformer LM, a CNN with BatchNorm in train mode, an MLP
with dropout and AdamW inside the dump, and tiny random-init `transformers` models when that
package is installed). Each case dumps a golden CPU fp32 step and a device step (`sim` with a
numerics profile, or CPU autocast bf16), with or without one injected fault, replays the device
dump, and compares twice: with the replay and without it.

Figures: errors and warnings on clean runs (per row), and for faulty runs whether the injected
op is the culprit (top-1) or among the first three suspects (top-3), per fault size, with and
without replay.

    python benchmarks/bench_detection.py            # the full matrix
    python benchmarks/bench_detection.py --quick    # a small subset (the test suite runs it)
    python benchmarks/bench_detection.py --stacks   # LSTM, GRU, depthwise CNN, fused AdamW,
                                                    # fp16 autocast under bf16, masks (issue 25)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy.compare import compare  # noqa: E402
from accuracy.device_backend import sim  # noqa: E402
from accuracy.dumper import dumper  # noqa: E402
from accuracy.examples import lm_batch, lm_step, tiny_lm  # noqa: E402
from accuracy.replay import replay  # noqa: E402

# -- models -------------------------------------------------------------------------------


class ConvBlock(nn.Module):
    """conv-bn-relu-conv-bn + identity, then relu (a ResNet basic block)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(self.act(self.bn1(self.conv1(x))))))


class SmallResNet(nn.Module):
    """A ResNet-style CNN with BatchNorm, trained in train mode."""

    def __init__(self, width: int = 8, blocks: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.blocks = nn.Sequential(*(ConvBlock(width) for _ in range(blocks)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.stem(x)))
        h = self.blocks(h)
        return self.head(h.mean((2, 3)))


class DropoutMLP(nn.Module):
    def __init__(self, d: int = 32, hidden: int = 64, layers: int = 3, p: float = 0.1) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [nn.Linear(d if i == 0 else hidden, hidden), nn.GELU(), nn.Dropout(p)]
        self.body = nn.Sequential(*mods)
        self.out = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x))


def _cnn_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = SmallResNet()
    model.train()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g)

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
    return step


def _mlp_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = DropoutMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)

    def step() -> None:
        torch.manual_seed(5)  # the same dropout masks on both sides
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _lm_step() -> Callable[[], None]:
    model, batch = tiny_lm(layers=2), lm_batch(batch=2, seq=16)
    return lambda: lm_step(model, batch) and None


def _hf_step(kind: str) -> Callable[[], None] | None:
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128,
                                      n_positions=32, attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
                                       intermediate_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=32, attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg)
    model.train()
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()
    return step


MODELS: dict[str, Callable[[], Callable[[], None] | None]] = {
    "lm": _lm_step,
    "cnn": _cnn_step,
    "mlp": _mlp_step,
    "gpt2": lambda: _hf_step("gpt2"),
    "llama": lambda: _hf_step("llama"),
}

# -- faults -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultSpec:
    """Where a fault goes (op pattern, module pattern, occurrence) and what it does."""

    target: str  # matmul / conv / norm / softmax / activation
    phase: str  # forward / backward
    op: str
    module: str | None
    kind: str
    value: float
    occurrence: int | None = 0

    def fault(self) -> Any:
        return sim.fault(self.op, self.module, kind=self.kind, value=self.value,
                         occurrence=self.occurrence)


# Per model: (target, phase) -> (op pattern, module pattern); depth picks the layer.
SITES: dict[str, dict[tuple[str, str], tuple[str, str | None]]] = {
    "lm": {
        ("matmul", "forward"): ("aten.addmm.default", "*encoder.layers.{d}.linear1"),
        ("matmul", "backward"): ("aten.mm.default", "*encoder.layers.{d}.linear2"),
        ("norm", "forward"): ("aten.native_layer_norm.default", "*encoder.layers.{d}.norm1"),
        ("norm", "backward"): ("aten.native_layer_norm_backward.default",
                               "*encoder.layers.{d}.norm2"),
        # nn.TransformerEncoderLayer runs softmax inside CPU flash attention
        ("softmax", "forward"): ("aten._scaled_dot_product_flash_attention_for_cpu.default",
                                 "*encoder.layers.{d}.self_attn"),
        ("activation", "forward"): ("aten.gelu.default", "*encoder.layers.{d}*"),
        ("activation", "backward"): ("aten.gelu_backward.default", "*encoder.layers.{d}*"),
    },
    "cnn": {
        ("conv", "forward"): ("aten.convolution.default", "*blocks.{d}.conv2"),
        ("conv", "backward"): ("aten.convolution_backward.default", "*blocks.{d}.conv1"),
        ("norm", "forward"): ("aten.native_batch_norm.default", "*blocks.{d}.bn1"),
        ("norm", "backward"): ("aten.native_batch_norm_backward.default", "*blocks.{d}.bn2"),
        ("activation", "forward"): ("aten.relu.default", "*blocks.{d}.act"),
        ("matmul", "forward"): ("aten.addmm.default", "*head"),
    },
    "mlp": {
        ("matmul", "forward"): ("aten.addmm.default", "*body.{l}"),
        ("matmul", "backward"): ("aten.mm.default", "*body.{l}"),
        ("activation", "forward"): ("aten.gelu.default", "*body.{a}"),
    },
    "gpt2": {
        ("matmul", "forward"): ("aten.addmm.default", "*h.{d}.mlp.c_proj"),
        ("matmul", "backward"): ("aten.mm.default", "*h.{d}.mlp.c_fc"),
        ("norm", "forward"): ("aten.native_layer_norm.default", "*h.{d}.ln_2"),
        ("softmax", "forward"): ("aten._softmax.default", "*h.{d}.attn"),
        ("softmax", "backward"): ("aten._softmax_backward_data.default", "*h.{d}.attn"),
        ("activation", "forward"): ("aten.tanh.default", "*h.{d}.mlp*"),
    },
    "llama": {
        ("matmul", "forward"): ("aten.mm.default", "*layers.{d}.mlp.down_proj"),
        ("softmax", "forward"): ("aten._softmax.default", "*layers.{d}.self_attn"),
        ("activation", "forward"): ("aten.silu.default", "*layers.{d}.mlp*"),
    },
}


def _site(model: str, target: str, phase: str, depth: int) -> tuple[str, str | None] | None:
    site = SITES[model].get((target, phase))
    if site is None:
        return None
    op, mod = site
    if mod is not None:
        mod = mod.format(d=depth, l=3 * depth, a=3 * depth + 1)
    return op, mod


# -- one case -----------------------------------------------------------------------------


@dataclass
class Case:
    model: str
    profile: str  # a sim profile, or "autocast-bf16"
    fault: FaultSpec | None = None

    @property
    def name(self) -> str:
        if self.fault is None:
            return f"{self.model}/{self.profile}/clean"
        f = self.fault
        return (f"{self.model}/{self.profile}/{f.target}-{f.phase}-{f.kind}-{f.value:g}"
                f"@{f.module}")


@dataclass
class Outcome:
    case: Case
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # "replay" / "no-replay" -> count
    warnings: dict[str, int] = field(default_factory=dict)
    top1: dict[str, bool] = field(default_factory=dict)
    top3: dict[str, bool] = field(default_factory=dict)
    fault_seq: int | None = None
    note: str = ""


def _warm_up(case: Case) -> dict | None:
    """fp8-delayed's amax histories, warmed by one step of a fresh copy of the model (run
    before the dumped step's model is built: that one starts from golden's weights and RNG
    state, dropout included)."""
    if case.profile != "fp8-delayed":
        return None
    history: dict = {}
    warm = _step_of(case.model)
    assert warm is not None
    with sim(profile=case.profile, amax_history=history):
        warm()
    return history


@contextlib.contextmanager
def _device(case: Case, history: dict | None = None) -> Iterator[None]:
    """The device a case runs on: a `sim` profile (fp8-delayed with the amax `history` of
    `_warm_up`), CPU bf16 autocast, or fp16 autocast on a bf16 device."""
    profile, faults = case.profile, [case.fault.fault()] if case.fault else []
    if profile == "autocast-bf16":
        with sim(profile="exact", faults=faults), \
                torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    elif profile == "autocast-fp16-bf16":  # an fp16 autocast model on a bf16 device
        with sim(profile="bf16", faults=faults), torch.autocast("cpu", dtype=torch.float16):
            yield
    elif history is not None:
        with sim(profile=profile, faults=faults, amax_history=history):
            yield
    else:
        with sim(profile=profile, faults=faults):
            yield


def _step_of(model: str) -> Callable[[], None] | None:
    return (MODELS.get(model) or STACKS_MODELS[model])()


def _golden(model: str, work: Path) -> Path | None:
    path = work / f"{model}-golden.h5"
    if not path.exists():
        step = _step_of(model)
        if step is None:
            return None
        with dumper(str(path)):
            step()
    return path


def _fault_seq(dev: Path) -> int | None:
    from accuracy.dumpfile import load_dump

    with load_dump(dev) as d:
        for r in d.records:
            if r.extra.get("faults"):
                return r.seq
    return None


def _hit(report: Any, seq: int | None, k: int) -> bool:
    if seq is None:
        return False
    if k == 1:
        c = report.summary.get("culprit")
        return bool(c) and c.get("seq_my") == seq
    return any(s.get("seq_my") == seq for s in report.suspects[:k])


def _score(out: Any, label: str, summary: dict[str, Any], hit: Callable[[], dict[str, bool]]
           ) -> None:
    """One compare's figures into an outcome (single-rank or distributed): rows, error and
    warning counts, and the hits `hit()` gives (top1/top3/first -> bool) for a faulty case."""
    out.rows = summary["rows_judged"] if "rows_judged" in summary else summary["rows"]
    out.errors[label] = summary["counts"].get("error", 0)
    out.warnings[label] = summary["counts"].get("warning", 0)
    if out.case.fault is not None:
        for key, value in hit().items():
            getattr(out, key)[label] = value


def run_case(case: Case, work: Path) -> Outcome:
    """Dump golden (once per model) and the case's device step, replay it, compare with and
    without the replay. The one runner of the main matrix, `--stacks` and `--fp8`."""
    out = Outcome(case)
    golden = _golden(case.model, work)
    if golden is None:
        out.note = "skipped: transformers not installed"
        return out
    dev, rep = work / "device.h5", work / "replay.h5"
    for p in (dev, rep):
        p.unlink(missing_ok=True)
    history = _warm_up(case)
    step = _step_of(case.model)
    assert step is not None
    with _device(case, history), dumper(str(dev)):
        step()
    if case.fault is not None:
        out.fault_seq = _fault_seq(dev)
        if out.fault_seq is None:
            out.note = "fault matched no op"
    replay(dev, rep)
    for label, r in (("replay", rep), ("no-replay", None)):
        report = compare(dev, golden, replay=r)
        judged = [x for x in report.rows if x["verdict"] in ("pass", "warning", "error")]
        _score(out, label, {**report.summary, "rows_judged": len(judged)},
               lambda report=report: {"top1": _hit(report, out.fault_seq, 1),
                                      "top3": _hit(report, out.fault_seq, 3)})
    return out


def run_cases(cases: list[Case], verbose: bool, overflow: list[str] | None = None
              ) -> tuple[list[Outcome], str]:
    """Every case of a family in one scratch folder (golden dumps shared): the outcomes, and
    for `overflow` families the `accuracy overflow` line on their clean golden dumps."""
    outs = []
    line = ""
    with tempfile.TemporaryDirectory(prefix="bench_detection_") as tmp:
        for case in cases:
            o = run_case(case, Path(tmp))
            outs.append(o)
            if verbose:
                print(f"{case.name}: rows {o.rows} errors {o.errors} warnings {o.warnings} "
                      f"top1 {o.top1} top3 {o.top3} {o.note}", flush=True)
        if overflow:
            line = _stacks_clean_overflow(Path(tmp), overflow)
    return outs, line


# -- the matrix ---------------------------------------------------------------------------

PROFILES = ("bf16", "fp16-cube", "tf32", "autocast-bf16")
SIZES = (1e-3, 1e-2, 5e-2)


def matrix(quick: bool, models: list[str] | None = None) -> list[Case]:
    """Every case: each model x profile clean, then faults per size, kind, site and depth."""
    names = models or list(MODELS)
    cases: list[Case] = []
    if quick:
        return [
            Case("cnn", "bf16"),
            Case("lm", "fp16-cube", FaultSpec("matmul", "forward", "aten.addmm.default",
                                              "*encoder.layers.1.linear1", "bias", 1e-2)),
        ]
    for m in names:
        for p in PROFILES:
            cases.append(Case(m, p))
    # Faults: every site and size; kind, depth and profile rotate so that each kind, depth
    # and profile meets every model and size (the full product would take hours here).
    for m in names:
        for i, (target, phase) in enumerate(SITES[m]):
            kinds = ["bias", "noise"] + (["eps"] if (target, phase) == ("norm", "forward")
                                         else [])
            for j, size in enumerate(SIZES):
                for k, kind in enumerate(kinds):
                    if kind != "eps" and (i + j + k) % 2 and len(kinds) == 2:
                        continue
                    depth = (i + j) % 2
                    site = _site(m, target, phase, depth)
                    assert site is not None
                    profile = PROFILES[(i + j + k) % len(PROFILES)]
                    cases.append(Case(m, profile, FaultSpec(target, phase, site[0], site[1],
                                                            kind, size)))
    return cases


def summarise(outs: list[Outcome]) -> str:
    lines = []
    clean = [o for o in outs if o.case.fault is None and not o.note]
    lines.append("## Clean runs (false alarms)\n")
    lines.append("| model | profile | rows | errors (replay) | warnings (replay) | "
                 "errors (no replay) | warnings (no replay) |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    tot = defaultdict(int)
    for o in clean:
        lines.append(f"| {o.case.model} | {o.case.profile} | {_count_cells(o)}")
        tot["rows"] += o.rows
        for k in ("replay", "no-replay"):
            tot["e" + k] += o.errors[k]
            tot["w" + k] += o.warnings[k]
    rows = max(tot["rows"], 1)
    lines.append(f"| **total** | {len(clean)} runs | {tot['rows']} | {tot['ereplay']} | "
                 f"{tot['wreplay']} ({100 * tot['wreplay'] / rows:.2f}%) | "
                 f"{tot['eno-replay']} | {tot['wno-replay']} "
                 f"({100 * tot['wno-replay'] / rows:.2f}%) |")
    faulty = [o for o in outs if o.case.fault is not None and not o.note]
    lines.append("\n## Faulty runs (culprit hits)\n")
    lines.append("| fault size | runs | top-1 (replay) | top-3 (replay) | top-1 (no replay) | "
                 "top-3 (no replay) |")
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in SIZES:
        grp = [o for o in faulty if o.case.fault and o.case.fault.value == size]
        if not grp:
            continue
        n = len(grp)

        def pct(key: str, label: str, grp: list[Outcome] = grp, n: int = n) -> str:
            hits = sum(getattr(o, key)[label] for o in grp)
            return f"{hits}/{n} ({100 * hits / n:.0f}%)"
        lines.append(f"| {size:g} | {n} | {pct('top1', 'replay')} | {pct('top3', 'replay')} | "
                     f"{pct('top1', 'no-replay')} | {pct('top3', 'no-replay')} |")
    missed = [o for o in faulty if not o.top1["replay"]]
    if missed:
        lines.append("\nMissed with replay (top-1): " + ", ".join(o.case.name for o in missed))
    skipped = [o for o in outs if o.note]
    if skipped:
        lines.append("\nNot run: " + ", ".join(f"{o.case.name} ({o.note})" for o in skipped))
    return "\n".join(lines)


def _count_cells(o: Any) -> str:
    """A clean run's table cells: rows, then errors and warnings with and without replay."""
    return (f"{o.rows} | {o.errors['replay']} | {o.warnings['replay']} | "
            f"{o.errors['no-replay']} | {o.warnings['no-replay']} |")


def goals_met(outs: list[Outcome]) -> list[str]:
    """The goals this benchmark measures, as sentences for each one missed."""
    missed = []
    clean = [o for o in outs if o.case.fault is None and not o.note]
    faulty = [o for o in outs if o.case.fault is not None and not o.note]
    if any(o.errors["replay"] or o.errors["no-replay"] for o in clean):
        missed.append("an error on a clean run")
    rows = sum(o.rows for o in clean)
    if rows and sum(o.warnings["replay"] for o in clean) >= 0.01 * rows:
        missed.append("warnings on clean runs reach 1% of rows")
    big = [o for o in faulty if o.case.fault and o.case.fault.value >= 1e-2]
    if any(not o.top1["replay"] for o in big):
        missed.append("a fault >= 1e-2 not the culprit with replay")
    small = [o for o in faulty if o.case.fault and o.case.fault.value < 1e-2]
    if small and sum(o.top1["replay"] for o in small) < 0.9 * len(small):
        missed.append("under 90% of 1e-3 faults the culprit with replay")
    if big and sum(o.top3["no-replay"] for o in big) < 0.9 * len(big):
        missed.append("under 90% of faults >= 1e-2 in the top 3 without replay")
    return missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (used by the tests)")
    ap.add_argument("--models", nargs="*", help=f"subset of {list(MODELS)}")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--stacks", nargs="*", metavar="FAMILY",
                    help="the issue-25 families instead (lstm gru dwcnn llama-fused lm-fp16 "
                         "masks; none named: all)")
    ap.add_argument("--fp8", action="store_true", help="the fp8/MX rows only (issue 29)")
    ap.add_argument("--dist", action="store_true",
                    help="only the distributed families (FSDP2, tensor parallel; 2 gloo ranks)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.dist:
        return dist_main(args.verbose, args.check)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # called as a function (tests/scenarios/test_verdicts_on_trial_models.py): the caller's
    # thread count comes back
    try:
        return _one_thread_main(args)
    finally:
        torch.set_num_threads(threads)


def _one_thread_main(args: argparse.Namespace) -> int:
    if args.fp8:
        fp8_main(args.verbose)
        return 0
    stacks = None if args.stacks is None else (args.stacks or list(STACKS_MODELS))
    cases = stacks_matrix(stacks) if stacks is not None else matrix(args.quick, args.models)
    t0 = time.perf_counter()
    outs, overflow_line = run_cases(cases, args.verbose, stacks)
    print(summarise(outs))
    if stacks is not None:
        print("\n" + overflow_line)
    print(f"\n{len(cases)} cases in {time.perf_counter() - t0:.0f} s")
    missed = goals_met(outs)
    print("goals: " + ("all met" if not missed else "missed: " + "; ".join(missed)))
    return 1 if args.check and missed else 0


# -- issue 25 families: RNNs, depthwise CNN, fused AdamW, fp16 autocast under bf16, masks ----
# (`--stacks`; separate from the matrix above so its figures stay comparable)


class _RNNLM(nn.Module):
    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.rnn = cell(16, 24, num_layers=2, batch_first=True)
        self.head = nn.Linear(24, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])


def _rnn_step(cell: type[nn.Module]) -> Callable[[], None]:
    torch.manual_seed(0)
    model = _RNNLM(cell)
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        out = model(tokens)
        nn.functional.cross_entropy(out.reshape(-1, 64), tokens.reshape(-1)).backward()
    return step


class _DepthwiseCNN(nn.Module):
    """Depthwise-separable blocks (3x3 depthwise, GroupNorm, ReLU, 1x1 pointwise, GroupNorm)."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.GroupNorm(4, c), nn.ReLU(),
            nn.Conv2d(c, c, 1, bias=False), nn.GroupNorm(4, c), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def _dwcnn_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = _DepthwiseCNN()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g)
    return lambda: nn.functional.cross_entropy(model(x), y).backward()


def _llama_fused_step() -> Callable[[], None] | None:
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=128, max_position_embeddings=32,
                                   attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False, fused=True)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()
    return step


class _MaskedAttention(nn.Module):
    """Self-attention written out with a -inf causal mask (masked_fill) and a finfo.min
    padding mask (added), as hand-written and `transformers` models build them."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        seq = x.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        scores = scores + torch.where(pad[:, None, :], torch.finfo(scores.dtype).min, 0.0)
        return self.out(torch.softmax(scores, -1) @ v)


class _MaskLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.attn = nn.ModuleList(_MaskedAttention() for _ in range(2))
        self.head = nn.Linear(32, 64)

    def forward(self, tokens: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for a in self.attn:
            h = h + a(h, pad)
        return self.head(h)


def _masks_step() -> Callable[[], None]:
    torch.manual_seed(0)
    model = _MaskLM()
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, -3:] = True

    def step() -> None:
        out = model(tokens, pad)
        nn.functional.cross_entropy(out.reshape(-1, 64), tokens.reshape(-1)).backward()
    return step


STACKS_MODELS: dict[str, Callable[[], Callable[[], None] | None]] = {
    "lstm": lambda: _rnn_step(nn.LSTM),
    "gru": lambda: _rnn_step(nn.GRU),
    "dwcnn": _dwcnn_step,
    "llama-fused": _llama_fused_step,
    "lm-fp16": _lm_step,  # the LM under fp16 autocast on a bf16 device
    "masks": _masks_step,
}
# family -> its device profiles (the first is used for faults at even positions)
STACKS_PROFILES: dict[str, tuple[str, ...]] = {
    "lstm": ("bf16", "fp16-cube"), "gru": ("bf16", "fp16-cube"),
    "dwcnn": ("bf16", "fp16-cube"), "llama-fused": ("bf16", "fp16-cube"),
    "lm-fp16": ("autocast-fp16-bf16",), "masks": ("bf16", "fp16-cube"),
}
# (target, phase) -> (op, module pattern, occurrence or output index via {d})
STACKS_SITES: dict[str, dict[tuple[str, str], tuple[str, str | None]]] = {
    "lstm": {
        ("rnn", "forward"): ("aten.mkldnn_rnn_layer.default", "*rnn"),
        ("rnn", "backward"): ("aten.mkldnn_rnn_layer_backward.default", "*rnn"),
        ("matmul", "forward"): ("aten.mm.default", "*head"),
    },
    "gru": {
        ("matmul", "forward"): ("aten.addmm.default", "*rnn"),
        ("matmul", "backward"): ("aten.mm.default", "*rnn"),
        ("activation", "backward"): ("aten.sigmoid_backward.default", "*rnn"),
    },
    "dwcnn": {
        ("conv", "forward"): ("aten.convolution.default", "*blocks.{d}.0"),
        ("conv", "backward"): ("aten.convolution_backward.default", "*blocks.{d}.0"),
        ("pointwise", "forward"): ("aten.convolution.default", "*blocks.{d}.3"),
        ("norm", "forward"): ("aten.native_group_norm.default", "*blocks.{d}.1"),
        ("norm", "backward"): ("aten.native_group_norm_backward.default", "*blocks.{d}.4"),
    },
    "llama-fused": {
        ("optimizer", "optimizer"): ("aten._fused_adamw_.default", None),
        ("matmul", "forward"): ("aten.mm.default", "*layers.{d}.mlp.down_proj"),
    },
    "lm-fp16": {k: SITES["lm"][k] for k in (("matmul", "forward"), ("matmul", "backward"),
                                              ("norm", "forward"), ("activation", "forward"))},
    "masks": {
        ("softmax", "forward"): ("aten._softmax.default", "*attn.{d}"),
        ("matmul", "forward"): ("aten.bmm.default", "*attn.{d}"),
        ("matmul", "backward"): ("aten.mm.default", "*attn.{d}.qkv"),
    },
}


@dataclass(frozen=True)
class StackFaultSpec(FaultSpec):
    """A fault with an output index (a fused optimizer's i-th parameter)."""

    output: int = 0

    def fault(self) -> Any:
        return sim.fault(self.op, self.module, kind=self.kind, value=self.value,
                         occurrence=self.occurrence, output=self.output)


def stacks_matrix(families: list[str] | None = None) -> list[Case]:
    """Each family clean on each of its profiles, then every site x size, kind and depth
    rotating (bias/noise, layer 0/1; the RNN layers by occurrence, fused AdamW by output)."""
    names = families or list(STACKS_MODELS)
    cases: list[Case] = []
    for m in names:
        for p in STACKS_PROFILES[m]:
            cases.append(Case(m, p))
    for m in names:
        profiles = STACKS_PROFILES[m]
        for i, (target, phase) in enumerate(STACKS_SITES[m]):
            op, mod = STACKS_SITES[m][(target, phase)]
            for j, size in enumerate(SIZES):
                depth = (i + j) % 2
                kind = ("bias", "noise")[(i + j) % 2]
                profile = profiles[(i + j) % len(profiles)]
                module = mod.format(d=depth) if mod else None
                occurrence = depth if target == "rnn" or m == "gru" else 0
                output = (3, 12)[depth] if target == "optimizer" else 0
                cases.append(Case(m, profile, StackFaultSpec(
                    target, phase, op, module, kind, size, occurrence, output)))
    return cases


def _stacks_clean_overflow(work: Path, families: list[str]) -> str:
    """Births `accuracy overflow` reports on each family's clean golden dump (masks: 0)."""
    from accuracy.overflow import scan

    parts = []
    for m in families:
        path = work / f"{m}-golden.h5"
        if path.exists():
            rep = scan(path)
            parts.append(f"{m} {len(rep.births)} births ({len(rep.intended)} intended)")
    return "overflow births on clean golden dumps: " + ", ".join(parts)



# -- fp8 and MX (issue 29) ------------------------------------------------------------------
# Clean runs under the fp8 profiles, and three faults per model: a 10% bias in one GEMM's
# output, a scale off by 4x in one GEMM (a backward one: its gradient operand, e5m2) and a
# saturating cast (8x beyond its scale) in one layer's forward GEMM. fp8-delayed runs one
# warm-up step (a fresh copy of the model) to fill its amax histories first.

FP8_PROFILES = ("fp8", "fp8-delayed", "mxfp8")
FP8_SITES: dict[str, dict[str, tuple[str, str]]] = {
    "lm": {"forward": ("aten.addmm.default", "*encoder.layers.1.linear1"),
           "backward": ("aten.mm.default", "*encoder.layers.0.linear2")},
    "gpt2": {"forward": ("aten.addmm.default", "*h.1.mlp.c_proj"),
             "backward": ("aten.mm.default", "*h.0.mlp.c_fc")},
}
FP8_FAULTS = (("forward", "bias", 0.1), ("backward", "scale", 4.0), ("forward", "saturate", 8.0))


def fp8_matrix() -> list[Case]:
    """Each model x fp8 profile: clean, then each fp8 fault."""
    cases = []
    for m in FP8_SITES:
        for p in FP8_PROFILES:
            cases.append(Case(m, p))
            for phase, kind, value in FP8_FAULTS:
                op, mod = FP8_SITES[m][phase]
                cases.append(Case(m, p, FaultSpec("matmul", phase, op, mod, kind, value)))
    return cases


def fp8_main(verbose: bool = False) -> list[Outcome]:
    """Run the fp8 rows; print their table (the goals: 0 errors clean, every fault top-1)."""
    t0 = time.perf_counter()
    outs, _ = run_cases(fp8_matrix(), verbose)
    print("## fp8 / MX\n")
    print("| model | profile | case | rows | errors (replay) | warnings (replay) | "
          "top-1 (replay) | top-1 (no replay) |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- | --- |")
    for o in outs:
        f = o.case.fault
        what = "clean" if f is None else f"{f.kind} {f.value:g} {f.phase} @{f.module}"
        top = ("" if f is None else str(o.top1.get("replay")))
        top_nr = ("" if f is None else str(o.top1.get("no-replay")))
        print(f"| {o.case.model} | {o.case.profile} | {what} | {o.rows} | "
              f"{o.errors.get('replay')} | {o.warnings.get('replay')} | {top} | {top_nr} |")
    missed = [o.case.name for o in outs if not o.note and (
        (o.case.fault is None and (o.errors.get("replay") or o.errors.get("no-replay")))
        or (o.case.fault is not None and not o.top1.get("replay")))]
    print(f"\n{len(outs)} cases in {time.perf_counter() - t0:.0f} s")
    print("fp8 goals: " + ("all met" if not missed else "missed: " + ", ".join(missed)))
    return outs

# -- distributed families: FSDP2 and tensor parallel on 2 gloo ranks ------------------------
# One pair of rank processes (benchmarks/_dist_rank.py) dumps every run; this process replays
# and compares each against the CPU fp32 golden run of its family, every rank at once. A fault
# is on one rank only: top-1 means the merged culprit is that op on that rank, and "first"
# that the merged report names that rank as the one that diverged first.

DIST_WORLD = 2
DIST_SITES = {  # family -> (op, occurrence): forward and backward ops on plain and DTensor data
    "fsdp2": (("aten.native_layer_norm.default", 0), ("aten.addmm.default", 1),
              ("aten.mm.default", 1)),
    "tp": (("aten.gelu.default", 0), ("aten.addmm.default", 0),
           ("aten.native_layer_norm.default", 0)),
}
DIST_PROFILES = ("fp16-cube", "bf16")


@dataclass
class DistCase:
    family: str
    profile: str | None  # None: CPU fp32 (a second golden run)
    fault: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        f = self.fault
        what = "clean" if f is None else (f"{f['op'].split('.')[1]}#{f['occurrence']} "
                                          f"{f['kind']} {f['value']:g} on rank {f['rank']}")
        return f"{self.family}/{self.profile or 'cpu (gold vs gold)'}/{what}"


@dataclass
class DistOutcome:
    case: DistCase
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    top1: dict[str, bool] = field(default_factory=dict)
    first: dict[str, bool] = field(default_factory=dict)
    inherited: dict[str, bool] = field(default_factory=dict)
    note: str = ""


def dist_matrix() -> list[DistCase]:
    cases: list[DistCase] = []
    for fam, sites in DIST_SITES.items():
        cases.append(DistCase(fam, None))
        cases += [DistCase(fam, p) for p in DIST_PROFILES]
        for i, (op, occ) in enumerate(sites):
            for j, size in enumerate(SIZES):
                cases.append(DistCase(fam, DIST_PROFILES[(i + j) % 2], {
                    "rank": (i + j) % DIST_WORLD, "op": op, "occurrence": occ,
                    "kind": ("bias", "noise")[(i + j + 1) % 2], "value": size}))
    return cases


def _dist_dump(plans: list[dict[str, Any]], work: Path, timeout: int = 1200) -> None:
    """Both ranks dump every plan (one process per rank, its own session, bounded)."""
    import json
    import os
    import signal
    import socket
    import subprocess

    plan_file = work / "plans.json"
    plan_file.write_text(json.dumps(plans))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=os.pathsep.join([str(root), env.get("PYTHONPATH", "")]),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(DIST_WORLD),
               OMP_NUM_THREADS="1")
    procs = []
    try:
        for rank in range(DIST_WORLD):
            procs.append(subprocess.Popen(
                [sys.executable, str(root / "benchmarks" / "_dist_rank.py"), str(plan_file)],
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
        for p in procs:
            text = p.communicate(timeout=timeout)[0].decode(errors="replace")
            if p.returncode:
                raise RuntimeError(f"a rank failed:\n{text[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)


def _dist_fault_seq(folder: Path, rank: int) -> int | None:
    return _fault_seq(folder / f"run_{rank}.h5")


def run_dist_case(case: DistCase, folder: Path, golden: Path) -> DistOutcome:
    from accuracy.compare.multirank import compare_ranks
    from accuracy.replay.collectives import replay_ranks

    out = DistOutcome(case)
    dev = folder / "run_{rank}.h5"
    seq = None
    if case.fault is not None:
        seq = _dist_fault_seq(folder, case.fault["rank"])
        if seq is None:
            out.note = "fault matched no op"
    rp = folder / "replay"
    rp.mkdir(exist_ok=True)
    replay_ranks(dev, rp / "r_{rank}.h5")
    for label, r in (("replay", rp / "r_{rank}.h5"), ("no-replay", None)):
        s = compare_ranks(dev, golden, r).summary
        _score(out, label, s, lambda s=s: _dist_hits(case, s, seq))
        if case.fault is None:  # a clean run names no rank as diverged first
            out.first[label] = s.get("first_rank") is None
    return out


def _dist_hits(case: DistCase, s: dict[str, Any], seq: int | None) -> dict[str, bool]:
    """top1: the faulted op on the faulted rank is the culprit; first: that rank is named
    first; inherited: every other rank is labelled inherited (or clean), none diverged."""
    assert case.fault is not None
    rank = case.fault["rank"]
    c = s.get("culprit") or {}
    others = [e["label"] for e in s.get("ranks", []) if e["rank"] != rank]
    return {"top1": seq is not None and c.get("rank") == rank and c.get("seq_my") == seq,
            "first": s.get("first_rank") == rank,
            "inherited": all(lb in ("inherited", "clean") for lb in others)}


def summarise_dist(outs: list[DistOutcome]) -> str:
    lines = ["## Distributed families (2 gloo ranks): clean runs\n",
             "| family | my run | rows | errors (replay) | warnings (replay) | "
             "errors (no replay) | warnings (no replay) | diverged first (replay / no replay) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for o in outs:
        if o.case.fault is None:
            lines.append(f"| {o.case.family} | {o.case.profile or 'cpu fp32 (gold vs gold)'} | "
                         f"{_count_cells(o)} {_first_cell(o)} |")
    lines += ["\n## Distributed families: a fault on one rank\n",
              "| family | fault size | runs | top-1 (replay) | faulted rank first (replay) | "
              "other rank inherited (replay) | top-1 (no replay) | "
              "faulted rank first (no replay) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    faulty = [o for o in outs if o.case.fault is not None and not o.note]
    for fam in DIST_SITES:
        for size in SIZES:
            grp = [o for o in faulty if o.case.family == fam and o.case.fault
                   and o.case.fault["value"] == size]
            if not grp:
                continue
            n = len(grp)

            def pct(key: str, label: str, grp: list[DistOutcome] = grp, n: int = n) -> str:
                hits = sum(getattr(o, key)[label] for o in grp)
                return f"{hits}/{n}"
            lines.append(f"| {fam} | {size:g} | {n} | {pct('top1', 'replay')} | "
                         f"{pct('first', 'replay')} | {pct('inherited', 'replay')} | "
                         f"{pct('top1', 'no-replay')} | {pct('first', 'no-replay')} |")
    missed = [o for o in faulty if not (o.top1["replay"] and o.first["replay"]
                                        and o.inherited["replay"])]
    if missed:
        lines.append("\nMissed with replay (top-1, rank or the other rank's label): "
                     + ", ".join(o.case.name for o in missed))
    skipped = [o for o in outs if o.note]
    if skipped:
        lines.append("\nNot judged: " + ", ".join(f"{o.case.name} ({o.note})" for o in skipped))
    return "\n".join(lines)


def _first_cell(o: DistOutcome) -> str:
    return " / ".join("none" if o.first.get(k) else "a rank" for k in ("replay", "no-replay"))


def dist_goals_met(outs: list[DistOutcome]) -> list[str]:
    missed = []
    if any(o.errors["replay"] or o.errors["no-replay"] for o in outs if o.case.fault is None):
        missed.append("an error on a clean distributed run")
    if any(not all(o.first.values()) for o in outs if o.case.fault is None):
        missed.append("a clean distributed run names a rank as diverged first")
    if any(not o.inherited.get("replay", True) for o in outs if o.case.fault and not o.note):
        missed.append("a rank without a fault labelled diverged (not inherited) with replay")
    big = [o for o in outs if o.case.fault and o.case.fault["value"] >= 1e-2]
    if any(o.note or not (o.top1["replay"] and o.first["replay"]) for o in big):
        missed.append("a fault >= 1e-2 on one rank not the culprit, or its rank not first")
    small = [o for o in outs if o.case.fault and o.case.fault["value"] < 1e-2 and not o.note]
    if small and sum(o.top1["replay"] for o in small) < 0.9 * len(small):
        missed.append("under 90% of 1e-3 faults on one rank the culprit with replay")
    return missed


def dist_main(verbose: bool = False, check: bool = False) -> int:
    cases = dist_matrix()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_detection_dist_") as tmp:
        work = Path(tmp)
        plans = [{"family": fam, "profile": None, "fault": None, "out": str(work / fam / "gold")}
                 for fam in DIST_SITES]
        folders = []
        for i, c in enumerate(cases):
            folders.append(work / c.family / f"case{i}")
            plans.append({"family": c.family, "profile": c.profile, "fault": c.fault,
                          "out": str(folders[-1])})
        _dist_dump(plans, work)
        t1 = time.perf_counter()
        outs = []
        for c, folder in zip(cases, folders, strict=True):
            o = run_dist_case(c, folder, work / c.family / "gold")
            outs.append(o)
            if verbose:
                print(f"{c.name}: rows {o.rows} errors {o.errors} warnings {o.warnings} "
                      f"top1 {o.top1} first {o.first} {o.note}", flush=True)
    print(summarise_dist(outs))
    print(f"\n{len(cases)} distributed cases: dumps {t1 - t0:.0f} s, replay and compare "
          f"{time.perf_counter() - t1:.0f} s")
    missed = dist_goals_met(outs)
    print("goals: " + ("all met" if not missed else "missed: " + "; ".join(missed)))
    return 1 if check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
