"""A compiled training step with dropout against the same step eager: under the dumper, the
compiled program draws its random numbers with eager's generator (Inductor's
`fallback_random`), so its dropout masks are eager's and the two runs compare like with like.
With Inductor's own generator a tiny GPT-2 in train mode (dropout 0.1, transformers' defaults)
gets other masks compiled, and the compare blames an honest matmul (amplification 2e7) for them."""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.compare.checks import OWN_RANDOM
from tests._support.miscompile import inductor_cache

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.filterwarnings("ignore:Using `torch.compile", "ignore::UserWarning"),
              pytest.mark.timeout(900)]


def _gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_head=2, n_layer=2, n_positions=32, vocab_size=64,
                                  bos_token_id=0, eos_token_id=0)  # dropout 0.1 everywhere
    return transformers.GPT2LMHeadModel(cfg).train(), torch.randint(0, 64, (2, 16))


def test_compiled_dropout_draws_eagers_masks_and_compares_clean(tmp_path):
    with inductor_cache(tmp_path):
        model, ids = _gpt2()
        losses = {}
        for side, run in (("eager", model), ("compiled", torch.compile(model))):
            torch.manual_seed(5)
            with dumper(tmp_path / f"{side}.h5", mode="tensor"):
                loss = run(ids, labels=ids).loss
                loss.backward()
            losses[side] = loss.item()
            model.zero_grad()
    # the same masks: equal to fp32 rounding (other masks moved the loss by 2e-3 relative)
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-6)
    with load_dump(tmp_path / "compiled.h5") as d:
        assert d.attrs["compiled_random"] == "eager"
        assert any(r.op.startswith("inductor.") for r in d.records)
    rep = compare(tmp_path / "compiled.h5", tmp_path / "eager.h5")
    assert rep.summary["counts"]["error"] == 0 and rep.culprit is None, rep.format()
    assert not any(OWN_RANDOM in m for m in rep.summary["refusals"])


def test_inductors_own_masks_are_said_first(tmp_path, monkeypatch):
    """With `ACCURACY_COMPILED_RANDOM=inductor` the kernels draw masks no eager run draws:
    the compare says so before its counts (terminal, summary warning the HTML shows), naming
    the first random kernel, so nobody reads the masks' difference as a numerics bug."""
    monkeypatch.setenv("ACCURACY_COMPILED_RANDOM", "inductor")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5),
                            torch.nn.Linear(8, 4)).train()
    x = torch.randn(4, 8)
    with inductor_cache(tmp_path):
        for side, run in (("eager", m), ("compiled", torch.compile(m))):
            torch.manual_seed(1)
            with dumper(tmp_path / f"{side}.h5", mode="tensor"):
                run(x).sum()
    rep = compare(tmp_path / "compiled.h5", tmp_path / "eager.h5")
    [said] = [m for m in rep.summary["refusals"] if OWN_RANDOM in m]
    assert "cpp_fused_native_dropout" in said and "Sequential.1" in said, said
    assert said in rep.summary["warning"]
    text = rep.format()
    assert text.count(OWN_RANDOM) == 1 and text.index(OWN_RANDOM) < text.index("rows "), text
    # the web UI's report page says it before the verdict cards
    from fastapi.testclient import TestClient

    from accuracy.server.app import create_app

    rep.write(tmp_path / "rep")
    app = create_app(tmp_path / "data", allowed_roots=[tmp_path])
    with TestClient(app, base_url="http://127.0.0.1",
                    headers={"X-Accuracy-Request": "1"}) as c:
        r = c.post("/api/reports/register", json={"path": str(tmp_path / "rep"), "name": "c"})
        assert r.status_code == 201, r.text
        page = c.get(f"/ui/reports/{r.json()['id']}").text
    said_at = page.index(OWN_RANDOM.split("'")[0])  # the apostrophe is escaped in HTML
    assert 'id="said-first"' in page and said_at < page.index("Verdicts")
    # the same compare the other way round names the golden side
    back = compare(tmp_path / "eager.h5", tmp_path / "compiled.h5")
    assert any(m.startswith("golden dump") and OWN_RANDOM in m
               for m in back.summary["refusals"])
