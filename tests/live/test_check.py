"""Live experiments: live check, substitution and proof, on the built-in LM, a CNN with
BatchNorm, and a tiny random-init transformers GPT-2, under the `sim` accelerator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import accuracy
from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumper import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.live import LiveCheckError, live_check, prove, substitute
from accuracy.live.cli import load_callable
from accuracy.live.select import COLLECTIVE_REASON, is_collective
from accuracy.replay import replay

FAULT = dict(op="aten.gelu.default", module="encoder.layers.1", kind="bias", value=0.02)


def _lm_step():
    model = tiny_lm(layers=2)
    return lm_step(model, lm_batch()), model


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Dump + replay + compare of the faulty sim step: compare's local verdicts per output."""
    d = tmp_path_factory.mktemp("offline")
    with dumper(dump_path=d / "golden.h5"):
        _lm_step()
    with sim(profile="fp16-cube", faults=[sim.fault(**FAULT)]):
        with dumper(dump_path=d / "device.h5"):
            _lm_step()
    replay(d / "device.h5", d / "replay.h5")
    report = compare(d / "device.h5", d / "golden.h5", replay=d / "replay.h5")
    verdicts = {(r["seq_my"], r["tensor_index"]): r["local_verdict"] for r in report.rows
                if r["kind"] == "op" and r["io"] == "output"}
    from accuracy.dumpfile import load_dump
    with load_dump(d / "device.h5") as dump:
        ops = {r.seq: r.op for r in dump.records}
    return verdicts, ops


def test_live_check_stops_at_the_sim_fault_with_module_source_and_figures():
    with pytest.raises(LiveCheckError) as err:
        with sim(profile="fp16-cube", faults=[sim.fault(**FAULT)]) as mode:
            with live_check(on="cpu", stop_on="error") as chk:
                _lm_step()
    r = err.value.result
    applied = mode.applied[0]
    assert (r.op, r.seq, r.phase) == ("aten.gelu.default", applied["call"], "forward")
    assert r.module.endswith("encoder.layers.1") and "examples.py:" in r.source
    assert r.verdict == "error" and r.outputs[0]["error_ratio"] > 10
    msg = str(err.value)
    assert "aten.gelu.default" in msg and "encoder.layers.1" in msg and "error ratio" in msg
    # it stopped at the first error: nothing before the faulty op was judged error
    assert [x.seq for x in chk.results if x.verdict == "error"] == [r.seq]
    assert chk.results[-1] is r


def test_live_check_agrees_with_offline_replay_verdicts(offline):
    verdicts, ops = offline
    with sim(profile="fp16-cube", faults=[sim.fault(**FAULT)]):
        with live_check() as chk:
            _lm_step()
    assert chk.calls == len(ops)
    judged = 0
    for r in chk.results:
        assert ops[r.seq] == r.op  # the same op stream as the dump
        for o in r.outputs:
            if o["verdict"] is None:
                continue
            judged += 1
            assert verdicts[(r.seq, o["idx"])] == o["verdict"], (r.op, r.seq, o)
    assert judged > 200
    errors = chk.errors()
    assert [(e.op, e.module.endswith("encoder.layers.1")) for e in errors] == [
        ("aten.gelu.default", True)]
    rep = chk.report()
    assert rep["profile"] == "fp16-cube" and rep["counts"]["error"] == 1
    json.dumps(rep, default=str)


def test_live_check_judges_sim_rounding_at_compute_precision_not_as_errors():
    # fp16-cube matmuls are far from fp32 but as good as fp16-input kernels: no error
    with sim(profile="fp16-cube"), live_check() as chk:
        _lm_step()
    assert not chk.errors()
    mm = [o for r in chk.results if "mm" in r.op for o in r.outputs
          if o["compute_precision"] == "float16"]
    assert mm and max(o["error_ratio"] for o in mm) > 10  # the scale made them pass


def test_live_check_outside_sim_warns_that_it_sees_ops_before_the_faults():
    with live_check() as chk, sim(faults=[sim.fault(**FAULT)]):
        _lm_step()
    assert chk.notes and "inside sim" in chk.notes[0]
    assert not chk.errors()  # it saw the clean op: the order matters


def test_live_check_skips_rng_and_collective_ops_with_reasons(tmp_path):
    with live_check() as chk:
        x = torch.ones(64, requires_grad=True)
        nn.functional.dropout(x, 0.5).sum().backward()
    reasons = {r.op: r.reason for r in chk.results if r.status == "skipped"}
    assert reasons["aten.bernoulli_.float"].startswith("rng op")
    assert is_collective("c10d.allreduce_.default")
    assert is_collective("_c10d_functional.all_gather_into_tensor.default")
    assert not is_collective("aten.add.Tensor")
    assert COLLECTIVE_REASON.startswith("collective")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_live_check_selects_ops_and_modules():
    with live_check(ops="aten.addmm", modules="encoder.layers.0") as chk:
        _lm_step()
    assert chk.results and all(r.op == "aten.addmm.default" for r in chk.results)
    assert all("encoder.layers.0" in r.module for r in chk.results)
    with live_check(ops="aten.addmm", modules="encoder.layers.0", keep="flagged") as quiet:
        _lm_step()
    assert quiet.results == [] and quiet.counts() == {"pass": len(chk.results)}
    with pytest.raises(ValueError, match="stop_on"):
        live_check(stop_on="sometimes")


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv1(x)))
        h = torch.relu(self.conv2(h)).mean(dim=(2, 3))
        return self.head(h)


def _cnn_step():
    torch.manual_seed(0)
    model = ConvNet().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss, model


def test_live_check_on_a_cnn_with_batchnorm_and_adamw_is_clean_on_cpu():
    with live_check(stop_on="warning") as chk:
        _cnn_step()
    phases = {r.phase for r in chk.results}
    assert {"forward", "backward", "optimizer"} <= phases
    assert any("batch_norm" in r.op for r in chk.results)
    assert all(r.status != "failed" for r in chk.results), [
        (r.op, r.reason) for r in chk.results if r.status == "failed"]


def test_substituting_clean_ops_changes_nothing_beyond_their_dtype_rounding():
    loss0, m0 = _lm_step()
    g0 = _grads(m0)
    # same dtype on the same kind of device: bit for bit
    with substitute(ops=["aten.gelu", "aten.addmm", "aten.native_layer_norm*"]) as s:
        loss1, m1 = _lm_step()
    assert len(s.substituted) > 10
    assert torch.equal(loss0, loss1) and all(map(torch.equal, g0, _grads(m1)))
    # at float64: within fp32 rounding, results back in float32
    with substitute(ops=["aten.gelu", "aten.addmm", "aten.mm"], dtype="float64") as s:
        loss2, m2 = _lm_step()
    assert loss2.dtype == torch.float32 and len(s.substituted) > 10
    for a, b in zip(g0, _grads(m2), strict=True):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    # at bfloat16: a bf16-sized change, no more
    with substitute(ops="aten.native_layer_norm.default", dtype="bfloat16"):
        loss3, _ = _lm_step()
    assert 0 < abs(loss3.item() - loss0.item()) / loss0.item() < 2 ** -7


def test_substitute_writes_in_place_results_back_and_keeps_views_and_layout():
    x = torch.randn(6, 4).t()  # non-contiguous
    y = x.clone()
    with substitute(ops=["aten.add_", "aten.transpose", "aten.mul"], dtype="float64") as s:
        x.add_(1.0)
        v = x.transpose(0, 1)
        z = x * 2
    assert torch.equal(x, y + 1.0)
    assert v.data_ptr() == x.data_ptr()  # the view still aliases
    assert z.stride() == (y * 2).stride() and z.dtype == torch.float32
    assert [c.op for c in s.substituted] == ["aten.add_.Tensor", "aten.mul.Tensor"]
    assert s.skipped[0].reason.startswith("view")
    with pytest.raises(ValueError, match="floating dtype"):
        substitute(ops="aten.mul", dtype="int8")


def test_substitute_runs_the_faulty_op_clean_under_sim(caplog):
    fault = sim.fault(**FAULT)
    loss0, _ = _lm_step()
    with sim(faults=[fault]):
        loss_dev, _ = _lm_step()
    caplog.set_level("WARNING", logger="accuracy.device_backend")
    with sim(faults=[fault]) as mode, substitute(ops=FAULT["op"], modules=FAULT["module"]):
        loss_sub, _ = _lm_step()
    assert loss_dev != loss0 and torch.equal(loss_sub, loss0)
    assert mode.applied == []  # the substituted call never reached the sim
    # ... by design: not reported as a fault that matched nothing (a misspelling)
    assert not [r for r in caplog.records if "matched no call" in r.getMessage()]


def test_prove_closes_the_gap_for_the_culprit_not_the_control(tmp_path):
    fault = sim.fault(**FAULT)
    proof = prove(_lm_step, culprits=f"{FAULT['op']}@{FAULT['module']}", golden=_lm_step,
                  context=lambda: sim(faults=[fault]), seed=3, report=tmp_path)
    assert proof.culprit.loss_closed >= 0.9 and proof.culprit.grad_closed >= 0.9
    assert abs(proof.control.loss_closed) <= 0.1 and abs(proof.control.grad_closed) <= 0.1
    assert proof.convincing and len(proof.control.calls) == len(proof.culprit.calls) == 1
    assert proof.control.calls[0]["op"] != FAULT["op"] or not proof.control.calls[0][
        "module"].endswith(FAULT["module"])
    assert "closes" in proof.sentence and "the control" in proof.sentence
    data = json.loads((tmp_path / "proof.json").read_text())
    assert data["culprit"]["loss_closed"] == proof.culprit.loss_closed
    assert "Substituting aten.gelu.default in encoder.layers.1" in (
        tmp_path / "proof.html").read_text()
    # the same seed picks the same control
    again = prove(_lm_step, culprits=[{"op": FAULT["op"], "module": FAULT["module"]}],
                  golden=_lm_step, context=lambda: sim(faults=[fault]), seed=3)
    assert again.control.calls == proof.control.calls
    with pytest.raises(ValueError, match="no op call"):
        prove(_lm_step, culprits="aten.nonexistent_op", golden=_lm_step)


def test_prove_on_a_tiny_transformers_gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=16)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))

    def step():
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg).eval()  # no dropout draws
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss, model

    fault = sim.fault("aten.native_layer_norm.default", module="transformer.h.1.ln_2",
                      kind="bias", value=0.01)
    with sim(faults=[fault]), live_check(stop_on="error") as chk:
        with pytest.raises(LiveCheckError) as err:
            step()
    assert err.value.result.module.endswith("transformer.h.1.ln_2")
    assert not any(r.status == "failed" for r in chk.results)
    proof = prove(step, culprits="aten.native_layer_norm@transformer.h.1.ln_2", golden=step,
                  context=lambda: sim(faults=[fault]))
    assert proof.culprit.loss_closed >= 0.9 and abs(proof.control.loss_closed) <= 0.1


def test_cli_prove_writes_the_report(tmp_path):
    steps = tmp_path / "steps.py"
    steps.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from accuracy.device_backend import sim

        def step():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
            x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss, model

        def device():
            return sim(faults=[sim.fault("aten.gelu.default", kind="bias", value=0.05)])
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(accuracy.__file__)), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "accuracy.cli", "prove", "--step", f"{steps}:step",
           "--golden-step", f"{steps}:step", "--context", f"{steps}:device",
           "--culprit", "aten.gelu.default", "--report", str(tmp_path / "rep"),
           "--fail-unconvincing"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120,
                       start_new_session=True)
    assert p.returncode == 0, p.stderr
    assert "closes 100% of the loss gap" in p.stdout
    assert json.loads((tmp_path / "rep" / "proof.json").read_text())["convincing"] is True
    with pytest.raises(ValueError, match="cannot import nosuchmodule"):
        load_callable("nosuchmodule:step")
    with pytest.raises(ValueError, match="module:function"):
        load_callable("steps.py")


def test_top_level_names_resolve_lazily():
    assert accuracy.live_check is live_check and accuracy.substitute is substitute
    with pytest.raises(AttributeError):
        accuracy.no_such_name  # noqa: B018


def test_the_error_that_stops_a_live_check_is_caught_by_its_top_level_name():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    with pytest.raises(accuracy.LiveCheckError) as err:  # the name live.md's snippet uses
        with sim(profile="exact", faults=[sim.fault("aten.addmm", kind="bias", value=0.1)]):
            with accuracy.live_check(on="cpu", stop_on="error"):
                lin(torch.randn(2, 4))
    assert err.value.result.op == "aten.addmm.default"


def test_proof_page_escapes_names():
    from accuracy.live.html import render_proof

    arm = {"name": "culprit", "loss": 1.0, "loss_gap": 0.0, "grad_gap": None,
           "loss_closed": 1.0, "grad_closed": None,
           "calls": [{"seq": 1, "op": "aten.x", "module": "<script>alert(1)</script>",
                      "phase": "forward", "substituted": True}]}
    page = render_proof({"culprits": ["<img src=x onerror=alert(1)>"], "golden_loss": 1.0,
                         "device": dict(arm, name="device"), "culprit": arm,
                         "control": dict(arm, name="control"), "seed": 0, "on": "cpu",
                         "dtype": None, "sentence": "<b>s</b>", "convincing": True,
                         "notes": []})
    assert "<script>" not in page and "<img" not in page and "<b>s</b>" not in page
    assert "&lt;script&gt;" in page


def test_a_sampled_live_check_checks_its_fraction_and_says_what_it_left():
    with live_check() as full:
        _lm_step()
    with live_check(sample=0.25) as chk:
        _lm_step()
    assert chk.calls == full.calls
    assert chk.checked + chk.sampled_out == full.checked
    assert abs(chk.checked / full.checked - 0.25) < 0.02
    rep = chk.report()
    assert rep["sample"] == 0.25 and rep["sampled_out"] == chk.sampled_out
    assert f"sample 0.25: {chk.sampled_out} selected calls not checked" in chk.text()
    assert "sample" not in full.text()
    with pytest.raises(ValueError, match="fraction of calls"):
        live_check(sample=0)


def test_a_sampled_live_check_takes_other_calls_each_step_and_finds_a_faulty_kernel():
    """Blocks numbered by step check other calls each step: over a few 1 / fraction steps
    every call of the step is checked, and a kernel wrong in every call is caught."""
    seen = []
    for step in range(12):
        with live_check(sample=0.25, step=step) as chk:
            _lm_step()
        seen.append({r.seq for r in chk.results})
    assert seen[0] != seen[1]
    covered = set().union(*seen)
    assert len(covered) > 0.95 * chk.calls
    caught = None
    with sim(profile="fp16-cube", faults=[sim.fault(**FAULT)]):
        for step in range(8):
            try:
                with live_check(sample=0.25, step=step, stop_on="error"):
                    _lm_step()
            except LiveCheckError as e:
                caught = e.result
                break
    assert caught is not None and caught.op == FAULT["op"]
