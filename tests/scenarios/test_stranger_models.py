"""Models this project did not write, dumped, compared and judged end to end: a random-init
transformers GPT-2 (nothing downloaded)."""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.device_backend import sim


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, attn_implementation="eager")

    def make():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(cfg).eval()

    return make


def _gpt2_step(model) -> torch.Tensor:
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(3))
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.loss


def test_transformers_gpt2_dump_compare_and_culprit(gpt2, tmp_path):
    with dumper(str(tmp_path / "g.h5")):
        loss = _gpt2_step(gpt2())
    fault = sim.fault("aten.addmm.default", module="*h.1.mlp.c_fc", kind="bias", value=0.1)
    with sim(profile="exact", faults=[fault]), dumper(str(tmp_path / "d.h5")):
        _gpt2_step(gpt2())
    with load_dump(tmp_path / "g.h5") as d:
        mods = {r.module for r in d.records}
        assert any(m.endswith("transformer.h.1.attn.c_attn") for m in mods), sorted(mods)[:20]
        assert {r.phase for r in d.records} == {"forward", "backward"}
        nll = [r for r in d.records if r.op.startswith("aten.nll_loss") and r.phase == "forward"]
        assert nll and torch.equal(nll[-1].outputs[0].load(), loss.detach())
    same = compare(tmp_path / "g.h5", tmp_path / "g.h5")
    counts = same.summary["counts"]
    assert counts["pass"] > 0 and counts["pass"] + counts["skipped"] == len(same.rows)
    rep = compare(tmp_path / "d.h5", tmp_path / "g.h5")
    c = rep.summary["culprit"]
    assert c is not None, rep.summary["counts"]
    assert c["op"] == "aten.addmm.default" and c["module"].endswith("h.1.mlp.c_fc")
    assert c["phase"] == "forward"
    before = [r for r in rep.rows if r["index"] < c["index"]]
    assert before and all(r["verdict"] in ("pass", "skipped") for r in before)

