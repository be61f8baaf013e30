"""Fused and foreach optimizers (issue 25): one call updates every parameter, so its rows are
per parameter, a `sim` fault lands on the tensors it updates in place, and a fault in one
parameter's update is the culprit, named by that parameter."""

from __future__ import annotations

import pytest
import torch

from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumper import dumper
from accuracy.dumpfile import load_dump
from accuracy.replay import replay

transformers = pytest.importorskip("transformers")


def _llama(fused: bool):
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32,
                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                   max_position_embeddings=16, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg)
    kw = {"foreach": False, "fused": True} if fused else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kw)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    names = [f"LlamaForCausalLM.{n}" for n, _ in model.named_parameters()]

    def step() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()
    return step, names


def _run(tmp_path, fused: bool, faults=()):
    g, d, r = (str(tmp_path / n) for n in ("g.h5", "d.h5", "r.h5"))
    with dumper(g):
        _llama(fused)[0]()
    step, names = _llama(fused)
    with sim(profile="bf16", faults=list(faults)) as s, dumper(d):
        step()
    replay(d, r)
    return compare(d, g, replay=r), names, s, d


def test_fused_adamw_fault_is_the_culprit_named_by_its_parameter(tmp_path):
    fault = sim.fault("aten._fused_adamw_.default", kind="bias", value=1e-2, output=3)
    report, names, s, dev = _run(tmp_path, True, [fault])
    assert s.applied and s.applied[0]["output"] == 3  # applied, not dropped
    culprit = report.summary["culprit"]
    assert culprit["op"] == "aten._fused_adamw_.default" and culprit["tensor_index"] == 3
    assert culprit["module"] == names[3] and culprit["verdict"] == "error"
    rows = [r for r in report.rows if r["op"] == "aten._fused_adamw_.default"
            and r["io"] == "output"]
    # one row per updated tensor, each named by its parameter
    assert [r["module"] for r in rows[:len(names)]] == names
    with load_dump(dev) as d:
        rec = next(r for r in d.records if r.op == "aten._fused_adamw_.default")
        assert len(rec.outputs) >= len(names)


def test_clean_fused_adamw_has_no_error(tmp_path):
    report, _, _, _ = _run(tmp_path, True)
    assert report.summary["counts"]["error"] == 0


def test_foreach_update_fault_is_the_culprit_named_by_its_parameter(tmp_path):
    fault = sim.fault("aten._foreach_addcdiv_.ScalarList", kind="bias", value=1e-2, output=2)
    report, names, _, _ = _run(tmp_path, False, [fault])
    culprit = report.summary["culprit"]
    assert culprit["op"] == "aten._foreach_addcdiv_.ScalarList"
    assert culprit["module"] == names[2]
