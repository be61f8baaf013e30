"""The checks before a compare (`accuracy/compare/checks.py`): kernels that drew their own
random numbers said first; inputs that cannot be compared (another model, a replay given as a
dump, swapped sides) refused in one line, wrappers of the same model not."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from accuracy.cli import main
from accuracy.compare import compare
from accuracy.compare.checks import OWN_RANDOM, model_root, own_random
from accuracy.dumper.core import dumper
from accuracy.errors import NotComparableError
from accuracy.examples import lm_batch, lm_step, tiny_lm


def _kernel(name: str, orig: str, ref_ops: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(op=f"inductor.{name}", module="Net.drop", extra={
        "compiled": "inductor",
        "outputs": [{"op": "aten.mul.Tensor", "orig": orig}],
        "reference": {"nodes": [{"op": o} for o in ref_ops]}})


def _dump(random: str | None, *records: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(path="c.h5", attrs={"compiled_random": random}, records=records)


def test_a_dropout_kernel_drawn_with_inductors_generator_is_named():
    d = _dump("inductor", _kernel("cpp_fused_add_0", "aten.add.Tensor"),
              _kernel("cpp_fused_native_dropout_1", "aten.native_dropout.default"),
              _kernel("cpp_fused_2", "aten.mul.Tensor", ("prims.inductor_random.default",)))
    said = own_random(d, "my")
    assert said is not None and OWN_RANDOM in said
    assert said.startswith("my dump c.h5: 2 compiled kernel(s)")
    assert "first: inductor.cpp_fused_native_dropout_1 in Net.drop" in said


def test_kernels_without_random_ops_or_with_eagers_generator_say_nothing():
    plain = _kernel("cpp_fused_add_0", "aten.add.Tensor",
                    ("aten.native_layer_norm.default", "aten.operand.default"))
    assert own_random(_dump("inductor", plain), "my") is None
    drop = _kernel("cpp_fused_native_dropout_1", "aten.native_dropout.default")
    assert own_random(_dump("eager", drop), "my") is None
    assert own_random(_dump(None, drop), "golden") is None


# -- inputs that cannot be compared: refused in one line ----------------------------------------

def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _seq_step(path, model: nn.Module, x: torch.Tensor, **kw) -> None:
    with dumper(str(path), **kw):
        model(x).sum().backward()


def _conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(4, 8, 3), nn.Tanh(), nn.Flatten(), nn.Linear(48, 2))


def test_another_models_dump_is_refused_in_one_line(tmp_path, capsys):
    """The demo's LM against an LSTM's dump read 'PASS over what was recorded only', exit 0:
    their root modules share nothing, so the user gave the wrong file."""
    torch.manual_seed(0)
    rnn, head = nn.LSTM(8, 16, num_layers=2, batch_first=True), nn.Linear(16, 4)
    with dumper(str(tmp_path / "rnn.h5")):
        out, _ = rnn(torch.randn(2, 5, 8))
        head(out).sum().backward()
    with dumper(str(tmp_path / "lm.h5")):
        lm_step(tiny_lm(), lm_batch())
    with pytest.raises(NotComparableError, match="record different models") as e:
        compare(tmp_path / "rnn.h5", tmp_path / "lm.h5")
    assert "LSTM, Linear against TinyTransformerLM" in str(e.value)
    rc, out, err = _cli(capsys, "compare", "-m", str(tmp_path / "rnn.h5"), "-g",
                        str(tmp_path / "lm.h5"), "-o", str(tmp_path / "rep"))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("accuracy compare: error: ") and "--mapping" in err
    assert not (tmp_path / "rep" / "summary.json").exists()


def test_two_models_under_one_root_name_that_hardly_pair_are_refused(tmp_path, capsys):
    """Two `nn.Sequential`s of other layers: the root name is the same, but none of my run's
    tensors (scalars aside) pairs with a golden tensor of its size."""
    _seq_step(tmp_path / "conv.h5", _conv(), torch.randn(2, 4, 8))
    emb = nn.Sequential(nn.Embedding(10, 8), nn.LayerNorm(8), nn.GELU())
    _seq_step(tmp_path / "emb.h5", emb, torch.randint(0, 10, (2, 5)))
    with pytest.raises(NotComparableError, match=r"hardly pair: 0 of \d+ tensors"):
        compare(tmp_path / "conv.h5", tmp_path / "emb.h5")
    rc, _, err = _cli(capsys, "compare", "-m", str(tmp_path / "conv.h5"), "-g",
                      str(tmp_path / "emb.h5"))
    assert rc == 2 and "fewer than 1 in 10" in err and len(err.strip().splitlines()) == 1


def test_a_filtered_dump_is_compared_not_refused(tmp_path):
    """A golden dump of one linear layer pairs with a sliver of a whole LM step by design:
    said (BLIND), not refused as another model's."""
    batch = lm_batch()
    with dumper(str(tmp_path / "all.h5")):
        lm_step(tiny_lm(), batch)
    with dumper(str(tmp_path / "part.h5"), modules="encoder.layers.0.linear1"):
        lm_step(tiny_lm(), batch)
    rep = compare(tmp_path / "all.h5", tmp_path / "part.h5")
    assert 0 < rep.summary["coverage"]["compared"] < rep.summary["coverage"]["my_tensors"] / 10
    assert rep.exit_code("error") == 1


def test_a_part_of_the_model_run_on_its_own_is_compared(tmp_path):
    """`model[3](x)` (root `Linear`) against the whole model (root `Sequential`): no root in
    common, but its tensors pair with the whole step's: a part of the same model."""
    x = torch.ones(2, 4, 8)
    _seq_step(tmp_path / "whole.h5", _conv(), x)
    with torch.no_grad():
        features = _conv()[:3](x)
    _seq_step(tmp_path / "part.h5", _conv()[3], features)
    rep = compare(tmp_path / "part.h5", tmp_path / "whole.h5")
    assert rep.summary["coverage"]["compared"] >= rep.summary["coverage"]["my_tensors"] / 2


@pytest.mark.parametrize("path,root", [
    ("DistributedDataParallel.module.layers.0", None),  # DDP's `module.`: the class is hidden
    ("DataParallel.module.0", None),
    ("FullyShardedDataParallel._fsdp_wrapped_module.layers.0._fsdp_wrapped_module.fc", None),
    ("OptimizedModule._orig_mod.fc1", None),  # torch.compile's wrapper
    ("Net._orig_mod.blocks.0", "Net"),
    ("FSDPTinyLM.layers.0", "TinyLM"),  # fully_shard's class
    ("Qwen2ForCausalLM.model.layers.1.mlp", "Qwen2ForCausalLM"),
    ("", None),
])
def test_wrappers_are_seen_through_to_the_models_root(path, root):
    assert model_root(path) == root


@pytest.fixture
def cpu_data_parallel(monkeypatch):
    """`nn.DataParallel` as on a machine with no accelerator: once a worker process has
    loaded the `npu` test device, DataParallel would move the model onto it."""
    module = sys.modules["torch.nn.parallel.data_parallel"]  # the name is also a function
    monkeypatch.setattr(module, "_get_available_device_type", lambda: None)


def test_data_parallel_against_the_bare_model_is_compared(tmp_path, cpu_data_parallel):
    """`nn.DataParallel` (on CPU it calls its module) names every op
    `DataParallel.module.<layer>`: the same model as the bare run, not another, also where
    little pairs (a golden dump of its Tanh only: the root rule has its say)."""
    from accuracy.compare.align import Mapping
    from accuracy.compare.checks import paired_share
    from accuracy.compare.pairs import pair_specs
    from accuracy.dumpfile import load_dump

    x = torch.ones(2, 4, 8)
    _seq_step(tmp_path / "bare.h5", _conv(), x)
    _seq_step(tmp_path / "tanh.h5", _conv(), x, modules="Sequential.1")
    _seq_step(tmp_path / "dp.h5", nn.DataParallel(_conv()), x)
    for my, golden in (("dp.h5", "bare.h5"), ("bare.h5", "dp.h5"), ("dp.h5", "tanh.h5")):
        rep = compare(tmp_path / my, tmp_path / golden)
        assert rep.summary["counts"]["error"] == 0, rep.format()
    with load_dump(tmp_path / "dp.h5") as dm, load_dump(tmp_path / "tanh.h5") as dg:
        n, paired = paired_share(pair_specs(dm, dg, Mapping()))
    assert 0 < paired < n / 2, (paired, n)


def test_a_wrapped_model_beside_a_loss_module_is_compared(tmp_path, cpu_data_parallel):
    """A wrapped model hides its class; the loss module's root beside it tells nothing alone
    (the golden script calls the functional loss and dumped the last layer only)."""
    x, y = torch.ones(2, 4, 8), torch.tensor([0, 1])
    with dumper(str(tmp_path / "dp.h5")):
        nn.CrossEntropyLoss()(nn.DataParallel(_conv())(x), y).backward()
    with dumper(str(tmp_path / "last.h5"), modules="Sequential.3"):
        nn.functional.cross_entropy(_conv()(x), y).backward()
    c = compare(tmp_path / "dp.h5", tmp_path / "last.h5").summary["coverage"]
    assert 0 < c["compared"] < c["my_tensors"] / 2


def test_swapped_sides_are_refused_saying_which_is_which(tmp_path, capsys):
    """-g a sim fp16-cube run and -m a CPU run: once a WARNING among the counts, or nothing."""
    from accuracy.device_backend import sim

    x = torch.ones(2, 4, 8)
    _seq_step(tmp_path / "cpu.h5", _conv(), x)
    with sim(profile="fp16-cube"):
        _seq_step(tmp_path / "dev.h5", _conv(), x)
    with pytest.raises(NotComparableError, match="swap them"):
        compare(tmp_path / "cpu.h5", tmp_path / "dev.h5")
    rc, out, err = _cli(capsys, "compare", "-m", str(tmp_path / "cpu.h5"), "-g",
                        str(tmp_path / "dev.h5"))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "is a sim run (profile fp16-cube) and -m" in err and "a CPU run" in err
    assert compare(tmp_path / "dev.h5", tmp_path / "cpu.h5").summary["rows"] > 0


def test_a_replay_given_as_a_dump_is_refused(tmp_path, capsys):
    """`accuracy replay` writes the reference's figures of another dump's ops: as -m or -g
    it is no run."""
    from accuracy.replay import replay

    _seq_step(tmp_path / "d.h5", _conv(), torch.ones(2, 4, 8))
    replay(tmp_path / "d.h5", tmp_path / "r.h5")
    for flags in (("-m", "r.h5", "-g", "d.h5"), ("-m", "d.h5", "-g", "r.h5")):
        argv = [f if f.startswith("-") else str(tmp_path / f) for f in flags]
        rc, out, err = _cli(capsys, "compare", *argv)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        side = "-m" if flags[1] == "r.h5" else "-g"
        assert f"{side} {tmp_path / 'r.h5'} is a replay of" in err
    with pytest.raises(NotComparableError, match="give the dump itself as -m and its replay"):
        compare(tmp_path / "r.h5", tmp_path / "d.h5")


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """(compiled.h5, eager.h5) of one small MLP step (tests/_support/compiled_mlp.py)."""
    from tests._support.compiled_mlp import compiled_and_eager

    return compiled_and_eager(tmp_path_factory.mktemp("compiled"))


@pytest.mark.compiled  # its fixture compiles the model in a helper module
def test_a_compiled_run_against_its_eager_golden_is_compared(compiled_runs):
    """Compiled kernels fuse most eager values away and name no eager op: still the same
    model (its kernels pair by origin), never refused."""
    comp, eager = compiled_runs
    rep = compare(comp, eager)
    assert rep.summary["counts"]["error"] == 0 and rep.summary["counts"]["pass"] > 0


def _scaled_step(path, scaler_on: bool, init_scale: float = 2.0 ** 16) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # unscales inside
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=scaler_on)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    with dumper(str(path)):
        scaler.scale(model(x).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
    return str(path)


def test_a_loss_scaled_on_one_side_only_is_said_before_the_counts(tmp_path):
    """A bf16 LSTM/GRU with GradScaler against its fp32 run without one: every gradient
    before the unscale was 65536x golden's, the backward's accumulated figures were all
    errors and the first divergence was nll_loss_backward, with no word on why."""
    gold = _scaled_step(tmp_path / "gold.h5", scaler_on=False)
    dev = _scaled_step(tmp_path / "dev.h5", scaler_on=True)
    rep = compare(dev, gold)
    lines = [m for m in rep.summary["refusals"] if m.startswith("loss scales differ")]
    assert len(lines) == 1, rep.summary["refusals"]
    assert "scaled the loss by 65536, golden's by 1 (no GradScaler)" in lines[0]
    text = rep.format()
    assert text.index("loss scales differ") < text.index("  rows ")
    assert text.count("loss scales differ") == 1
    assert rep.summary["warning"].startswith("loss scales differ")  # the page's warning box
    rep.write(tmp_path / "rep", ("html",))
    assert "loss scales differ" in (tmp_path / "rep" / "index.html").read_text()
    same = compare(dev, _scaled_step(tmp_path / "dev2.h5", scaler_on=True))
    assert not any("loss scales" in m for m in same.summary["refusals"])
    other = compare(dev, _scaled_step(tmp_path / "dev3.h5", True, init_scale=1024.0))
    assert any("by 65536, golden's by 1024:" in m for m in other.summary["refusals"])
