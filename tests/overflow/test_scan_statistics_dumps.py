"""The offline overflow scan gives a statistics dump the verdict of a tensor dump: attention
masks followed by `values_key`, not by the row a tensor dump links a later use to (a
statistics dump gives every use its own row); and a check_overflow dump, which holds only
the births, reports the ops the check judged, not "0 ops scanned"."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accuracy.cli import main
from accuracy.dumper import dumper
from accuracy.dumpfile import load_dump
from accuracy.overflow import scan

pytestmark = pytest.mark.filterwarnings("ignore::accuracy.overflow.OverflowWarning")


def _masked_scores() -> torch.Tensor:
    scores = (torch.randn(4, 4) - 100).half()
    mask = torch.full((4, 4), torch.finfo(torch.float16).min, dtype=torch.float16).triu(1)
    return scores + mask  # finfo.min + -100 overflows to -inf where masked: intended


def _real_fp16_overflow() -> torch.Tensor:
    x = torch.full((4,), 300.0, dtype=torch.float16)
    return x * x  # 90000 > 65504: inf born here


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_scores_plus_a_finfo_min_mask_is_intended_in_both_dump_modes(tmp_path, capsys, mode):
    path = tmp_path / f"{mode}.h5"
    with dumper(path, mode=mode):
        kept = _masked_scores()
    assert torch.isneginf(kept).any()
    rep = scan(path)
    assert rep.births == [] and rep.inherited == []
    assert [f.op for f in rep.intended] == ["aten.add.Tensor"]
    assert main(["overflow", str(path), "--fail-on-birth"]) == 0
    out = capsys.readouterr().out
    assert "no op produced inf/nan from finite inputs" in out
    assert "intended non-finite values (1 ops" in out and "born here" not in out


def test_a_real_overflow_beside_a_mask_is_still_born_in_a_statistics_dump(tmp_path):
    path = tmp_path / "s.h5"
    with dumper(path, mode="statistics"):
        _masked_scores()
        _real_fp16_overflow()
    rep = scan(path)
    assert [b.op for b in rep.births] == ["aten.mul.Tensor"]
    assert [f.op for f in rep.intended] == ["aten.add.Tensor"]


def _hf_model(name: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    if name == "bert":
        return transformers.BertModel(transformers.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64))
    if name == "gpt2":
        return transformers.GPT2Model(transformers.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=16,
            bos_token_id=0, eos_token_id=0))
    return transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=16))


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_a_clean_transformers_step_has_the_same_verdict_in_both_dump_modes(tmp_path, name):
    """Each layer's mask ops (`where`, scores + mask) are intended in a statistics dump too,
    not inherited from a birth nobody reported."""
    torch.manual_seed(0)
    model = _hf_model(name).eval()  # no dropout: both dumps see the same values
    ids = torch.randint(0, 64, (2, 8))
    attention = torch.ones(2, 8, dtype=torch.long)
    attention[1, -3:] = 0  # padding: a masked key in every layer
    reports = {}
    for mode in ("tensor", "statistics"):
        path = tmp_path / f"{mode}.h5"
        with dumper(path, mode=mode):
            model(input_ids=ids, attention_mask=attention).last_hidden_state.sum().backward()
        reports[mode] = scan(path)
    tensor, stats = reports["tensor"], reports["statistics"]
    assert tensor.intended, "the dump holds no mask: nothing was checked"
    assert stats.births == [] and stats.inherited == [], [f.op for f in stats.inherited]
    assert [(f.seq, f.op) for f in stats.intended] == [(f.seq, f.op) for f in tensor.intended]


def test_a_check_overflow_dump_reports_the_ops_it_checked(tmp_path, capsys):
    path = tmp_path / "online.h5"
    with dumper(path, check_overflow=True):
        _masked_scores()
    with load_dump(path) as d:
        checked = d.attrs["overflow"]["ops_checked"]
        assert checked > 0 and len(d.records) == 0  # no birth: nothing recorded
    rep = scan(path)
    assert rep.to_dict()["ops_scanned"] == checked
    assert main(["overflow", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{checked} ops checked (tensor mode, recorded by check_overflow)" in out
    assert "0 ops scanned" not in out


def test_a_full_dump_still_reports_the_ops_scanned(tmp_path):
    path = Path(tmp_path) / "full.h5"
    with dumper(path, mode="statistics"):
        _real_fp16_overflow()
    with load_dump(path) as d:
        n = len(d.records)
    assert scan(path).format().splitlines()[0] == f"{path}: {n} ops scanned (statistics mode)"
