"""msprobe's own monitor (`msprobe.pytorch.TrainerMon`) on the tiny Qwen2 of bench_monitor.py
(`--model qwen2`): the bare step and the monitored one interleaved, median of per-step times.

Runs in msprobe's virtualenv (benchmarks/README.md), never with this project's packages:

    OMP_NUM_THREADS=1 benchmarks/.msprobe-venv/bin/python benchmarks/msprobe_monitor_runner.py \
        --steps 20 [--forward-only]

Its config asks for what ours records every step: module outputs (`xy_distribution`; without
`--forward-only` msprobe also takes inputs and the gradients w.r.t. them, which ours does not),
parameter gradients (`wg`), optimizer moments (`mv`), update ratios (`ur`) and parameters,
each as norm, min, max and NaN count, written as CSV.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--forward-only", action="store_true",
                    help="module outputs only (closest to ours)")
    args = ap.parse_args()
    out = tempfile.mkdtemp()
    os.environ.setdefault("MONITOR_OUTPUT_DIR", out)
    import torch
    import transformers
    from msprobe.pytorch import TrainerMon

    def model_opt():
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=128)
        m = transformers.Qwen2ForCausalLM(cfg)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (4, 64), generator=g)
    cfg_path = os.path.join(out, "monitor.json")
    with open(cfg_path, "w") as fh:
        json.dump({"targets": {}, "all_xy": True, "xy_distribution": True,
                   "forward_only": args.forward_only, "wg_distribution": True,
                   "mv_distribution": True, "ur_distribution": True,
                   "param_distribution": True, "ops": ["norm", "min", "max", "nans"],
                   "format": "csv"}, fh)

    def step(m, o):
        o.zero_grad()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        o.step()

    bare, monitored = model_opt(), model_opt()
    mon = TrainerMon(cfg_path, params_have_main_grad=False)
    mon.set_monitor(*monitored)
    for _ in range(3):
        step(*bare)
        step(*monitored)
    times: dict[str, list[float]] = {"bare": [], "msprobe": []}
    arms = [("bare", bare), ("msprobe", monitored)]
    for i in range(args.steps):
        for name, mo in arms if i % 2 == 0 else arms[::-1]:
            t0 = time.perf_counter()
            step(*mo)
            times[name].append(time.perf_counter() - t0)
    b, p = statistics.median(times["bare"]), statistics.median(times["msprobe"])
    what = "outputs only" if args.forward_only else "inputs, outputs and their gradients"
    print(f"msprobe TrainerMon every step ({what}; gradients, moments, update ratios, "
          f"parameters): bare {b * 1e3:.1f} ms, monitored {p * 1e3:.1f} ms, ratio "
          f"{p / b:.3f}x, threads {torch.get_num_threads()}, load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
