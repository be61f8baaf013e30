"""Do two versions of the code give the same replay figures and replay-based verdicts?

A check for changes to replay's speed: they must not change what compare concludes. The
benchmark step (bench_dump.py's transformer, forward + backward) is dumped once on plain CPU
(golden) and once on `sim` (a numerics profile, optionally with an injected fault: the device);
then each code tree replays the device dump and compares it with the golden one, in its own
process. Every record's `extra["replay"]` (status, reason, per-output figures) and every
report row's local error ratio and verdicts must be equal, floats bit for bit.

    python benchmarks/replay_verdicts.py --base /tmp/replay-base      # base: an older checkout
    python benchmarks/replay_verdicts.py --base OLD --profile bf16 --no-fault --upcast none
    python benchmarks/replay_verdicts.py --base OLD --model llama --profile bf16

Exit status 1 when anything differs (the differences are printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROW_KEYS = ("index", "op", "io", "tensor_index", "seq_my", "replay_status", "local_error_ratio",
            "local_error", "local_bound", "local_excess", "local_verdict", "verdict")


def _llama_step() -> Any:
    """A tiny random-init transformers Llama, forward + backward + AdamW step."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=256, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).train()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def step() -> None:
        model.load_state_dict(state)  # both runs start from the same weights
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _dump(golden: Path, device: Path, profile: str, fault: bool, small: bool,
          model_name: str) -> None:
    """Golden on plain CPU, device on sim(profile) with one biased matmul if `fault`."""
    from accuracy.device_backend import sim
    from accuracy.dumper import dumper
    from accuracy.examples import bench_setup, bench_step

    if model_name == "llama":
        step = _llama_step()
        op, where = "aten.mm.default", "*layers.1.mlp.down_proj*"
    else:
        model, batch = bench_setup(**({"batch": 2, "seq": 32} if small else {}))

        def step() -> None:
            bench_step(model, batch)
            model.zero_grad(set_to_none=True)
        op, where = "aten.addmm.default", "*layers.1.*"
    step()  # warm-up: lazy initialisation stays out of both dumps
    with dumper(dump_path=golden, mode="tensor"):
        step()
    faults = [sim.fault(op, module=where, kind="bias", value=1e-2, occurrence=0)] if fault else []
    with sim(profile=profile, faults=faults), dumper(dump_path=device, mode="tensor"):
        step()


def _emit(device: str, golden: str, out: str, upcast: str, metrics_only: bool,
          result: str) -> None:
    """Run by each code tree: replay, compare, and write the figures and verdicts as JSON."""
    from accuracy.compare import compare
    from accuracy.dumpfile import load_dump
    from accuracy.replay import replay

    replay(device, out, upcast=upcast, overwrite=True, metrics_only=metrics_only)
    with load_dump(out) as d:
        figures = {str(r.seq): r.extra["replay"] for r in d.records}
    report = compare(device, golden, out)
    rows = [{k: r.get(k) for k in ROW_KEYS} for r in report.rows]
    culprit = report.culprit
    Path(result).write_text(json.dumps({"replay": figures, "rows": rows,
                                        "culprit": dict(culprit) if culprit else None},
                                       allow_nan=True, default=str))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _run_tree(tree: Path, args: argparse.Namespace, work: Path, tag: str) -> dict[str, Any]:
    result = work / f"{tag}.json"
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(HERE / "replay_verdicts.py"), "--emit", str(work / "device.h5"),
           str(work / "golden.h5"), str(work / f"replay-{tag}.h5"), str(result),
           "--upcast", args.upcast] + (["--metrics-only"] if args.metrics_only else [])
    subprocess.run(cmd, env=env, check=True, cwd=tree)
    return json.loads(result.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="the code tree to compare with (a checkout)")
    ap.add_argument("--new", type=Path, default=HERE.parent,
                    help="the code tree under test (default: this one)")
    ap.add_argument("--profile", default="fp16-cube", help="sim profile of the device run")
    ap.add_argument("--no-fault", action="store_true", help="no injected fault")
    ap.add_argument("--model", default="bench", choices=["bench", "llama"],
                    help="bench: the benchmark step; llama: a tiny random-init transformers "
                         "Llama, forward + backward + AdamW step (needs transformers)")
    ap.add_argument("--small", action="store_true", help="batch 2, seq 32 (a quick check)")
    ap.add_argument("--upcast", default="fp64", choices=["fp64", "fp32", "none"])
    ap.add_argument("--metrics-only", action="store_true", help="replay with metrics_only")
    ap.add_argument("--workdir", type=Path, help="keep the dumps here (default: a temp dir)")
    ap.add_argument("--emit", nargs=4, metavar=("DEVICE", "GOLDEN", "OUT", "RESULT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.emit:
        _emit(*args.emit[:3], args.upcast, args.metrics_only, args.emit[3])
        return 0
    if args.base is None:
        ap.error("--base DIR is required (e.g. git archive <commit> | tar -x -C DIR)")
    with tempfile.TemporaryDirectory(prefix="replay_verdicts_") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if not (work / "device.h5").exists():
            sys.path.insert(0, str(args.new))
            _dump(work / "golden.h5", work / "device.h5", args.profile, not args.no_fault,
                  args.small, args.model)
        base = _run_tree(args.base.resolve(), args, work, "base")
        new = _run_tree(args.new.resolve(), args, work, "new")
    diffs = [f"replay figures of seq {s}: {base['replay'].get(s)} vs {new['replay'].get(s)}"
             for s in sorted(set(base["replay"]) | set(new["replay"]), key=int)
             if not _same(base["replay"].get(s), new["replay"].get(s))]
    if len(base["rows"]) != len(new["rows"]):
        diffs.append(f"report rows: {len(base['rows'])} vs {len(new['rows'])}")
    diffs += [f"row {a['index']}: {a} vs {b}" for a, b in zip(base["rows"], new["rows"],
                                                               strict=False) if not _same(a, b)]
    if not _same(base.get("culprit"), new.get("culprit")):
        diffs.append(f"culprit: {base.get('culprit')} vs {new.get('culprit')}")
    verdicts: dict[str, int] = {}
    for r in new["rows"]:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
    n_ops = len(new["replay"])
    c = new.get("culprit") or {}
    print(f"{n_ops} replayed ops, {len(new['rows'])} report rows (verdicts {verdicts}), culprit "
          f"{c.get('my_address') or c.get('address') or c}; "
          f"{len(diffs)} differences between {args.base} and {args.new}")
    for line in diffs[:40]:
        print("  " + line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
