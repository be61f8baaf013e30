"""Runs whose dropout drew other masks (another backend's generator, another seed): the random
op is not a culprit, the compare says first that the numerics after it were not judged, and a
replay still finds a faulty kernel behind the masks. Models: transformers' GPT-2, random init,
train mode (its default dropout 0.1)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from accuracy.cli import main
from accuracy.compare import compare
from accuracy.compare.draws import DRAWS_DIFFER, judge_random_ops
from accuracy.compare.row import Row
from accuracy.compare.row import Verdict as V
from accuracy.device_backend import sim
from accuracy.dumper import dumper
from accuracy.dumpfile.reader import load_dump

transformers = pytest.importorskip("transformers")


def _gpt2_step(path: Path, draw_seed: int, mode: str = "tensor", fault: bool = False) -> Path:
    """One train step of a tiny GPT-2 (same weights and batch); `draw_seed` seeds its
    dropout; `fault`: on sim, a biased addmm in the second block's MLP."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32))
    model.train()
    ids = torch.randint(0, 100, (2, 16))
    torch.manual_seed(draw_seed)
    faults = [sim.fault("aten.addmm.default", module="transformer.h.1.mlp.c_fc", kind="bias",
                        value=0.05)] if fault else ()
    with sim(profile="exact", faults=faults), dumper(dump_path=str(path), mode=mode):
        model(ids, labels=ids).loss.backward()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("draws")
    return {"golden": _gpt2_step(d / "golden.h5", 2), "other": _gpt2_step(d / "other.h5", 1),
            "same": _gpt2_step(d / "same.h5", 2),
            "faulty": _gpt2_step(d / "faulty.h5", 1, fault=True),
            "stats_golden": _gpt2_step(d / "sg.h5", 2, "statistics"),
            "stats_other": _gpt2_step(d / "so.h5", 1, "statistics")}


def test_a_dropout_that_drew_other_masks_is_no_culprit(runs, capsys):
    r = compare(runs["other"], runs["golden"])
    s = r.summary
    assert s["culprit"] is None
    assert s["counts"][V.ERROR] == 0
    assert s["blind"][0].startswith(f"{DRAWS_DIFFER}: ")
    assert "seq 9 aten.bernoulli_.float in GPT2LMHeadModel.transformer.drop" in s["blind"][0]
    assert s["coverage"]["random_ops_differ"] == 7  # the embedding's and 3 per block
    assert s["first_divergence"]["op"] == "aten.bernoulli_.float"
    drawn = [x for x in r.rows if x.op == "aten.bernoulli_.float" and x.io == "output"]
    assert drawn and all(x.verdict == V.SKIPPED for x in drawn)
    # a CI gate does not pass it: the numerics after the masks were not judged
    assert r.exit_code("error") == 1
    code = main(["compare", "-m", str(runs["other"]), "-g", str(runs["golden"]),
                 "--fail-on", "error", "-o", str(runs["golden"].parent / "rep")])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[1].startswith(f"  BLIND: {DRAWS_DIFFER}:")
    assert "PASS over what was recorded only: random draws differ at 7 op(s)" in out


def test_runs_that_drew_the_same_masks_say_nothing_of_draws(runs):
    s = compare(runs["same"], runs["golden"]).summary
    assert s["verdict"] == V.PASS and not s.get("blind")
    assert "random_ops_differ" not in s["coverage"]
    assert s["first_divergence"] is None


def test_a_replay_finds_the_faulty_kernel_behind_other_masks(runs, tmp_path):
    without = compare(runs["faulty"], runs["golden"]).summary
    assert without["culprit"] is None  # hidden by the masks, and said so first
    assert without["blind"][0].startswith(DRAWS_DIFFER)
    replay = tmp_path / "replay.h5"
    assert main(["replay", str(runs["faulty"]), "-o", str(replay)]) == 0
    s = compare(runs["faulty"], runs["golden"], replay).summary
    assert s["culprit"]["op"] == "aten.addmm.default"
    assert s["culprit"]["module"] == "GPT2LMHeadModel.transformer.h.1.mlp.c_fc"
    assert not s.get("blind")  # each op judged on its own inputs: nothing unseen
    assert any(n.startswith(f"{DRAWS_DIFFER}: ") and "local error (replay)" in n
               for n in s["notes"])


def test_statistics_after_other_masks_name_no_culprit(runs):
    """From statistics a mask looks almost the same (its mean is 1/(1-p) either way), so
    `x * mask` "amplified 35.8x": every op computed from the masks is at most a warning."""
    r = compare(runs["stats_other"], runs["stats_golden"])
    assert r.summary["culprit"] is None
    assert r.summary["counts"][V.ERROR] == 0
    assert r.summary["blind"][0].startswith(DRAWS_DIFFER)


def test_a_random_op_given_other_inputs_is_at_most_a_warning():
    """Its inputs already differed: whether it drew other numbers is unknown, and its
    amplification mixes both; a mask (bool output) that differs did draw differently."""
    def rows(mask_differs: bool) -> tuple[list[Row], list[Row]]:
        x = Row(0, "op", io="input", seq_my=5, seq_golden=5, rel_euc_dist=0.02,
                max_abs_err=0.1, accumulated_verdict=V.WARNING)
        y = Row(1, "op", io="output", seq_my=5, seq_golden=5, dtype_my="float32",
                rel_euc_dist=0.5, max_abs_err=2.0, accumulated_verdict=V.ERROR,
                verdict=V.ERROR)
        m = Row(2, "op", io="output", tensor_index=1, seq_my=5, seq_golden=5, dtype_my="bool",
                max_abs_err=float(mask_differs),
                accumulated_verdict=V.ERROR if mask_differs else V.PASS)
        return [x], [y, m]

    ins, outs = rows(mask_differs=False)
    assert judge_random_ops([(ins, outs)], {5}) == []
    assert outs[0].verdict == V.WARNING and "random op" in outs[0].message
    ins, outs = rows(mask_differs=True)
    assert judge_random_ops([(ins, outs)], {5}) == outs
    assert all(o.verdict == V.SKIPPED for o in outs)
    ins, outs = rows(mask_differs=True)
    assert judge_random_ops([(ins, outs)], {6}) == []  # not a random op: judged as before
    assert outs[0].verdict == V.ERROR


def _bert_step(path: Path, draw_seed: int) -> Path:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, attn_implementation="eager"))
    model.train()
    ids = torch.randint(0, 100, (2, 8))
    torch.manual_seed(draw_seed)
    with dumper(dump_path=str(path)):
        model(input_ids=ids, labels=torch.tensor([0, 1])).loss.backward()
    return path


def test_a_classifier_given_other_masks_is_no_culprit(tmp_path):
    """Two clean CPU runs of BERT: its classifier, given pooled vectors dropped differently,
    "amplified" them 2.5x (an ill-conditioned product, not a wrong kernel) and was the culprit.
    Without a replay, ops computed from other draws are at most a warning."""
    r = compare(_bert_step(tmp_path / "a.h5", 1), _bert_step(tmp_path / "b.h5", 2))
    assert r.summary["culprit"] is None
    assert r.summary["counts"][V.ERROR] == 0
    assert r.summary["blind"][0].startswith(DRAWS_DIFFER)
    classifier = [x for x in r.rows if x.io == "output" and x.module
                  == "BertForSequenceClassification.classifier" and x.op == "aten.addmm.default"]
    assert classifier and "computed from random draws" in classifier[0].message


def test_a_rank_whose_masks_differ_diverged(runs):
    """Merged over ranks, a rank whose dropout drew other masks is where the runs part, not
    "deviations within precision only": its tensors all pass because none is judged."""
    from accuracy.compare.multirank import merge

    reports = {0: compare(runs["same"], runs["golden"]), 1: compare(runs["other"], runs["golden"])}
    with load_dump(runs["golden"]) as d:
        epochs = {r.seq: r.epoch for r in d.records}
    s = merge(reports, {0: epochs, 1: epochs}, {"my": "my", "golden": "golden", "replay": None,
                                               "bytes_compared": 0, "seconds": 0.0}).summary
    assert s["first_rank"] == 1
    assert [e["label"] for e in s["ranks"]] == ["clean", "diverged"]
    assert s["blind"][0].startswith(f"rank 1: {DRAWS_DIFFER}: ")
