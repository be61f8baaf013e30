"""Verdicts users can trust (issue 14): no false alarms on clean runs, a culprit for real
faults, one verdict per tensor, refusals of what cannot be right, and the fixes found on the
way. Models come from benchmarks/bench_detection.py (a CNN with BatchNorm in train mode, a
transformer LM, an MLP with dropout and AdamW, tiny random-init `transformers` models)."""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from accuracy.cli import main
from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumper import dumper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_detection as bench  # noqa: E402


def _case(tmp_path: Path, model: str, profile: str, fault: bench.FaultSpec | None = None,
          keep: str | None = None) -> bench.Outcome:
    """Run one benchmark case; keep its dumps under tmp_path/keep when asked."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    out = bench.run_case(bench.Case(model, profile, fault), work)
    if keep:
        dest = tmp_path / keep
        dest.mkdir()
        for name in ("device.h5", "replay.h5", f"{model}-golden.h5"):
            shutil.copy(work / name, dest / name.replace(f"{model}-", ""))
    return out


def test_cnn_batchnorm_bf16_clean_run_has_no_error(tmp_path, capsys):
    out = _case(tmp_path, "cnn", "bf16", keep="cnn")
    assert out.errors == {"replay": 0, "no-replay": 0}, out
    assert out.warnings["replay"] <= 0.01 * out.rows, out
    d = tmp_path / "cnn"
    args = ["compare", "-m", str(d / "device.h5"), "-g", str(d / "golden.h5"), "-r",
            str(d / "replay.h5"), "--fail-on", "error"]
    assert main(args) == 0
    assert "culprit: none" in capsys.readouterr().out


def test_transformer_clean_run_has_few_warnings(tmp_path):
    """A GPT-2-like LM (tiny `transformers` models are in the benchmark: slower to build)."""
    out = _case(tmp_path, "lm", "fp16-cube")
    assert out.errors["replay"] == 0 and out.errors["no-replay"] == 0, out
    assert out.warnings["replay"] <= 0.01 * out.rows, out


def test_backward_matmul_noise_in_fp16_cube_is_the_culprit(tmp_path):
    fault = bench.FaultSpec("matmul", "backward", "aten.mm.default",
                            "*encoder.layers.1.linear2", "noise", 1e-2)
    out = _case(tmp_path, "lm", "fp16-cube", fault)
    assert out.fault_seq is not None
    assert out.top1["replay"], out
    assert out.top3["no-replay"], out


def test_cnn_conv_bias_in_bf16_is_the_culprit_and_inputs_inherit(tmp_path):
    fault = bench.FaultSpec("conv", "forward", "aten.convolution.default", "*blocks.1.conv2",
                            "bias", 5e-2)
    out = _case(tmp_path, "cnn", "bf16", fault, keep="cnn")
    assert out.top1["replay"] and out.top3["no-replay"], out
    d = tmp_path / "cnn"
    rep = compare(d / "device.h5", d / "golden.h5", replay=d / "replay.h5")
    culprit = rep.summary["culprit"]
    assert culprit["seq_my"] == out.fault_seq and culprit["local_verdict"] == "error"
    # one verdict per tensor: every row reading the faulty output carries its verdict
    readers = [r for r in rep.rows if r["produced_by"] == culprit["my_address"]]
    assert readers and all(r["verdict"] == "error" for r in readers)
    assert rep.summary["judged_counts"]["error"] == 1
    # modules summarise their ops: the block holding the conv is an error, the others not
    mods = {r["module"]: r["verdict"] for r in rep.rows if r["kind"] == "module"
            and r["phase"] == "forward"}
    assert mods["SmallResNet.blocks.1.conv2"] == "error"
    assert mods["SmallResNet.blocks.0"] == "pass"


def test_quick_benchmark_meets_its_goals(capsys):
    """CNN with BatchNorm, bf16, clean: no error; the LM under fp16-cube with a 1% bias in one
    addmm: that addmm is the culprit with a replay and a top-3 suspect without."""
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--check"]) == 0, capsys.readouterr().out
    finally:  # main sets one CPU thread for its process: the next test's programs need ours
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "## Clean runs" in out and "## Faulty runs" in out


# -- statistics-only ranking ------------------------------------------------------------------


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _mlp_dump(path: Path, mode: str = "tensor", faults: list | None = None) -> Path:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with sim(profile="exact", faults=faults or []) if faults is not None else \
            _nullcontext(), dumper(str(path), mode=mode):
        _MLP()(x).sum().backward()
    return path


class _nullcontext:  # noqa: N801
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def test_statistics_only_compare_ranks_suspects_and_says_replay_confirms(tmp_path):
    gold = _mlp_dump(tmp_path / "g.h5", "statistics")
    fault = sim.fault("aten.addmm.default", "fc2", kind="bias", value=0.05)
    dev = _mlp_dump(tmp_path / "d.h5", "statistics", [fault])
    rep = compare(dev, gold)
    assert rep.suspects, "statistics-only compare must still rank suspects"
    top = rep.suspects[0]
    assert top["op"] == "aten.addmm.default" and top["module"].endswith("fc2")
    assert rep.summary["ranking"] == "amplification of statistics"
    assert any("replay" in n for n in rep.summary["notes"])


def test_statistics_only_compare_is_an_error_where_nan_appears_on_one_side(tmp_path):
    """Statistics of a tensor holding NaN are NaN and compare nothing; the exact non-finite
    counts still do: a run whose loss went NaN is never PASS in statistics mode."""
    gold = _mlp_dump(tmp_path / "g.h5", "statistics")
    fault = sim.fault("aten.addmm.default", "fc2", kind="nan")
    dev = _mlp_dump(tmp_path / "d.h5", "statistics", [fault])
    rep = compare(dev, gold)
    assert rep.summary["verdict"] == "error"
    first = next(r for r in rep.rows if r["verdict"] == "error")
    assert first["op"] == "aten.addmm.default" and first["module"].endswith("fc2")
    assert "non-finite values differ" in first["message"]
    clean = compare(_mlp_dump(tmp_path / "d2.h5", "statistics", []), gold)
    assert clean.summary["verdict"] == "pass"


def test_mask_fills_do_not_swamp_the_figures_of_masked_scores(tmp_path):
    """Scores + a finfo.min causal mask (T5, GPT-2's attention): the fills would make the
    scores' deviation read as 1e-41 and the softmax after them a 1e4x suspect. Left out of the
    figures, the softmax inherits the scores' deviation and the GEMM before them is the
    suspect."""
    def attn(path: Path, faults: list) -> Path:
        g = torch.Generator().manual_seed(0)
        q, k = torch.randn(2, 8, 16, generator=g), torch.randn(2, 8, 16, generator=g)
        mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)
        with sim(profile="exact", faults=faults), dumper(str(path)):
            torch.softmax(torch.bmm(q, k.transpose(1, 2)) + mask, -1)
        return path

    noisy = [sim.fault("aten.bmm.default", kind="noise", value=1e-3)]
    rep = compare(attn(tmp_path / "d.h5", noisy), attn(tmp_path / "g.h5", []))
    out = {r["op"]: r for r in rep.rows if r["io"] == "output"}
    scores, soft = out["aten.add.Tensor"], out["aten._softmax.default"]
    assert scores["rel_euc_dist"] > 1e-4 and "56 mask values" in scores["message"]
    assert soft["amplification"] < 2 and soft["verdict"] == "pass"
    assert rep.suspects[0]["op"] == "aten.bmm.default"


def test_the_report_says_which_matrix_products_a_profile_left_unrounded(tmp_path):
    """Flash attention holds matrix products but is not in the bf16 profile's rules: it ran at
    full precision on the emulated device, and a clean verdict over it is no evidence."""
    def run(path: Path, profile: str) -> Path:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
        w = torch.randn(16, 16, generator=g)
        with sim(profile=profile), dumper(str(path)):
            torch.nn.functional.scaled_dot_product_attention(q, k, v).matmul(w)
        return path

    gold = run(tmp_path / "g.h5", "exact")
    notes = compare(run(tmp_path / "d.h5", "bf16"), gold).summary["notes"]
    gap = [n for n in notes if "ran unrounded" in n]
    assert len(gap) == 1 and "aten._scaled_dot_product_flash_attention_for_cpu.default x1" in gap[0]
    assert "'bf16'" in gap[0] and "x1)" in gap[0]  # the GEMM after it is in the rules
    exact = compare(run(tmp_path / "e.h5", "exact"), gold).summary["notes"]
    assert not [n for n in exact if "ran unrounded" in n]


# -- refusals -----------------------------------------------------------------------------------


def test_replay_of_another_dump_is_refused_naming_both(tmp_path, capsys):
    from accuracy.replay import replay

    gold = _mlp_dump(tmp_path / "g.h5")
    other = _mlp_dump(tmp_path / "other.h5", faults=[])
    replay(other, tmp_path / "r.h5")
    with pytest.raises(ValueError, match="other.h5") as e:
        compare(gold, gold, replay=tmp_path / "r.h5")
    assert "g.h5" in str(e.value)
    assert main(["compare", "-m", str(gold), "-g", str(gold), "-r",
                 str(tmp_path / "r.h5")]) == 2
    err = capsys.readouterr().err
    assert "other.h5" in err and "g.h5" in err


def test_swapped_sides_are_refused(tmp_path, capsys):
    from accuracy.errors import NotComparableError

    gold = _mlp_dump(tmp_path / "g.h5")
    dev = _mlp_dump(tmp_path / "d.h5", faults=[])
    with pytest.raises(NotComparableError, match="swap them"):
        compare(gold, dev)  # -m is the CPU reference, -g the sim device
    assert compare(dev, gold).summary["rows"] > 0  # the right way round
    assert main(["compare", "-m", str(gold), "-g", str(dev)]) == 2
    assert "swap them" in capsys.readouterr().err


def test_incomplete_dump_is_said_first(tmp_path, capsys):
    gold = _mlp_dump(tmp_path / "g.h5")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError), dumper(str(tmp_path / "cut.h5")):
        _MLP().fc1(x)
        raise RuntimeError("the training step died")
    rep = compare(tmp_path / "cut.h5", gold)
    assert rep.summary["warning"].startswith("my dump")
    assert "incomplete" in rep.summary["warning"]
    main(["compare", "-m", str(tmp_path / "cut.h5"), "-g", str(gold)])
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "incomplete" in ln or "rows" in ln]
    assert "incomplete" in lines[0]


def test_sim_entered_inside_dumper_warns_at_once(tmp_path):
    with dumper(str(tmp_path / "d.h5")):
        with pytest.warns(UserWarning, match="inside dumper"):
            with sim(profile="fp16-cube"):
                pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sim(profile="fp16-cube"), dumper(str(tmp_path / "ok.h5"), overwrite=True):
            pass


# -- fixes --------------------------------------------------------------------------------------


class _DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.drop, self.fc2 = nn.Linear(8, 8), nn.Dropout(0.0), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.fc1(x)))


def test_sim_module_fault_in_backward_hits_only_that_modules_ops():
    net, x = _DropNet(), torch.randn(4, 8)
    with sim(faults=[sim.fault("aten.mm.default", "drop", kind="bias", value=0.1)]) as s:
        net(x).sum().backward()
    assert s.applied == []  # Dropout(p=0) has no matmul of its own
    with sim(faults=[sim.fault("aten.mm.default", "fc1", kind="bias", value=0.1)]) as s:
        net(x).sum().backward()
    assert [a["module"].rsplit(".", 1)[-1] for a in s.applied] == ["fc1"]


def test_torchvision_and_other_torch_packages_are_user_code():
    from accuracy.dumper import source

    site = "/venv/lib/python3.11/site-packages/"
    assert source.is_internal(site + "torch/nn/modules/conv.py")
    assert not source.is_internal(site + "torchvision/models/resnet.py")
    assert not source.is_internal(site + "torchaudio/models/wav2vec2.py")


def test_replay_skips_profiler_markers_with_a_reason():
    from accuracy.replay.ops import Unreplayable, _kernel

    rec = SimpleNamespace(op="profiler._record_function_exit._RecordFunction", extra={})
    with pytest.raises(Unreplayable, match="profiler marker"):
        _kernel(rec)


def test_optimizer_rows_carry_the_parameter_name(tmp_path):
    from accuracy.dumpfile import load_dump

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with dumper(str(tmp_path / "d.h5")):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    with load_dump(tmp_path / "d.h5") as d:
        names = {r.module for r in d.records if r.phase == "optimizer"}
    assert {"Sequential.0.weight", "Sequential.0.bias", "Sequential.2.weight",
            "Sequential.2.bias"} <= names


@pytest.mark.parametrize("k", [16, 256, 4096, 16384])
def test_honest_bound_tracks_long_reductions(k):
    """An honest bf16-input matmul on fp32 tensors stays near its bound at every reduction
    length: the fp32 reference sums in blocks, so its error grows far slower than sqrt(K)
    (a sqrt(K) bound made honest K=4096 matmuls look 3.6x, K=16384 6x, their real error)."""
    from accuracy.compare.numerics import expected_ratio
    from accuracy.replay.metrics import compare as rel_error
    from accuracy.replay.metrics import error_ratio

    torch.manual_seed(0)
    a, b = torch.randn(64, k), torch.randn(k, 64)
    high = a.double() @ b.double()
    device = a.bfloat16().float() @ b.bfloat16().float()  # bf16 inputs, fp32 accumulation
    ratio = error_ratio(rel_error(device, high)[0], rel_error(a @ b, high)[0], 2.0 ** -24)
    assert 0.4 <= ratio / expected_ratio("bfloat16", "float32", k) <= 2.0


def test_clean_bert_classifier_in_bf16_has_no_false_error(tmp_path):
    """A model this project did not write (transformers BERT, random init, AdamW in the
    dump): in its last layer only the [CLS] token carries gradient, so the backward weight
    gradients are sums that one term dominates and the fp32 reference is nearly exact there.
    An honest bf16 kernel must not be called wrong for that."""
    from transformers import BertConfig, BertForSequenceClassification

    from accuracy.replay import replay

    cfg = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    x, y = torch.randint(0, 200, (4, 16)), torch.tensor([0, 1, 2, 1])

    def step(path: Path) -> None:
        torch.manual_seed(0)
        model = BertForSequenceClassification(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with dumper(dump_path=path, overwrite=True):
            model(input_ids=x, labels=y).loss.backward()
            opt.step()

    step(tmp_path / "gold.h5")
    with sim(profile="bf16"):
        step(tmp_path / "dev.h5")
    replay(tmp_path / "dev.h5", tmp_path / "rep.h5")
    rep = compare(tmp_path / "dev.h5", tmp_path / "gold.h5", replay=tmp_path / "rep.h5")
    assert rep.summary["judged_counts"].get("error", 0) == 0, rep.summary["suspects"][:3]
    assert rep.summary["culprit"] is None
