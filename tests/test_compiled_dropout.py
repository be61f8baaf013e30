"""A compiled training step with dropout against the same step eager: under the dumper, the
compiled program draws its random numbers with eager's generator (Inductor's
`fallback_random`), so its dropout masks are eager's and the two runs compare like with like.
Before, a tiny GPT-2 in train mode (dropout 0.1, transformers' defaults) lost another loss
compiled, and the compare blamed an honest matmul (amplification 2e7) for the masks."""

from __future__ import annotations

import pytest
import torch
from _miscompile import inductor_cache

from accuracy import dumper, load_dump
from accuracy.compare import compare

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
