"""`sim`: numerics profiles are what they claim, and faults hit exactly their target."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from accuracy.device_backend import Profile, Rule, profiles, register_profile, sim
from accuracy.device_backend.rounding import to_fp8_e4m3, to_tf32

# -- a small model with the module layout of the example -------------------------


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm1 = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm1(self.lin(x)))


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(), Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x).pow(2).mean()


class Recorder(TorchDispatchMode):
    """Stands in for the dumper: sits above `sim`, snapshots inputs before and outputs after."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C._DisableTorchDispatch():
            snap = tree_map(_clone, (args, kwargs))
        out = func(*args, **kwargs)
        with torch._C._DisableTorchDispatch():
            self.records.append((func, snap, tree_map(_clone, out)))
        return out


def _clone(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _same(a, b) -> bool:
    fa, _ = tree_flatten(a)
    fb, _ = tree_flatten(b)
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb, strict=True):
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not torch.equal(torch.nan_to_num(x), torch.nan_to_num(y)) or not torch.equal(
                x.isnan(), y.isnan()
            ):
                return False
        elif x != y:
            return False
    return True


def run_step(**sim_kwargs):
    """One forward+backward; returns (loss, grads, records, sim mode or None)."""
    torch.manual_seed(0)
    model = MyModel()
    x = torch.randn(8, 16)
    rec = Recorder()
    mode = None
    if sim_kwargs:
        with sim(**sim_kwargs) as mode, rec:
            loss = model(x)
            loss.backward()
    else:
        with rec:
            loss = model(x)
            loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return loss.detach(), grads, rec.records, mode


def locally_changed(records) -> list[int]:
    """Indices of ops whose recorded output differs from re-running them on their own inputs."""
    changed = []
    for i, (func, (args, kwargs), out) in enumerate(records):
        if "empty" in str(func):
            continue
        args, kwargs = tree_map(_clone, (args, kwargs))
        if not _same(func(*args, **kwargs), out):
            changed.append(i)
    return changed


def _names(records) -> list[str]:
    return [str(r[0]) for r in records]


# -- profiles -------------------------------------------------------------------------------


def test_exact_profile_is_bit_identical_to_cpu():
    loss0, grads0, recs0, _ = run_step()
    loss1, grads1, recs1, mode = run_step(profile="exact")
    assert mode.applied == [] and mode.calls == len(recs1)
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1, strict=True))
    assert _names(recs0) == _names(recs1)
    assert all(_same(a[2], b[2]) for a, b in zip(recs0, recs1, strict=True))


def test_outside_sim_results_are_unchanged():
    before, grads_before, _, _ = run_step()
    rng = torch.get_rng_state()
    run_step(profile="fp16-cube", faults=[sim.fault("aten.mm.default", kind="noise", value=0.1)])
    assert torch.equal(torch.get_rng_state(), rng), "sim consumed the global RNG"
    after, grads_after, _, _ = run_step()
    assert torch.equal(before, after)
    assert all(torch.equal(a, b) for a, b in zip(grads_before, grads_after, strict=True))
    assert sim.active() is None


def test_fp16_cube_matmul_error_is_nonzero_and_within_fp16_input_bound():
    torch.manual_seed(1)
    k = 256
    a, b = torch.randn(64, k), torch.randn(k, 32)
    exact = a.double() @ b.double()
    with sim(profile="fp16-cube"):
        c = a @ b
    assert c.dtype == torch.float32
    # Exactly fp16-rounded inputs, accumulated in fp32.
    assert torch.equal(c, a.half().float() @ b.half().float())
    err = (c.double() - exact).abs()
    u16, u32 = 2.0**-11, 2.0**-24
    magnitude = a.double().abs() @ b.double().abs()
    # |a_r b_r - a b| <= (2u + u^2)|a||b| from rounding both inputs; plus fp32 accumulation
    # (k u32) and fp16 subnormal inputs (absolute 2^-25 each).
    bound = (2 * u16 + u16**2 + 1.01 * k * u32) * magnitude + k * 2.0**-24
    assert torch.all(err <= bound)
    plain_err = ((a @ b).double() - exact).abs().max()
    assert err.max() > 0
    assert err.max() > 10 * plain_err, "fp16 rounding must dominate fp32 accumulation error"


def test_fp16_cube_rounds_matrix_operands_not_bias():
    torch.manual_seed(2)
    x, w, bias = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5) * 1e-3 + 1
    with sim(profile="fp16-cube"):
        y = F.linear(x, w, bias)
    # F.linear reaches the dispatcher as addmm(bias, x, w.t()).
    expected = torch.addmm(bias, x.half().float(), w.half().float().t())
    assert torch.equal(y, expected)
    assert not torch.equal(y, torch.addmm(bias.half().float(), x.half().float(),
                                          w.half().float().t()))


def test_fp16_cube_applies_to_conv_and_backward():
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    rec = Recorder()
    with sim(profile="fp16-cube"), rec:
        conv(x).sum().backward()
    names = _names(rec.records)
    assert "aten.convolution.default" in names and "aten.convolution_backward.default" in names
    changed = {names[i] for i in locally_changed(rec.records)}
    assert {"aten.convolution.default", "aten.convolution_backward.default"} <= changed
    assert changed <= {"aten.convolution.default", "aten.convolution_backward.default"}


def test_bf16_profile_matches_bf16_rounded_inputs():
    torch.manual_seed(4)
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 2)
    with sim(profile="bf16"):
        c = torch.bmm(a, b)
    assert torch.equal(c, torch.bmm(a.bfloat16().float(), b.bfloat16().float()))
    assert not torch.equal(c, torch.bmm(a, b))


def _tf32_reference(v: float) -> float:
    if v == 0 or not math.isfinite(v):
        return v
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= |m| < 1
    return math.ldexp(round(m * 2**11), e - 11)  # round() is round-half-even


def test_tf32_rounding_keeps_10_mantissa_bits_nearest_even():
    torch.manual_seed(5)
    x = torch.cat([
        torch.randn(2000) * 10.0 ** torch.randint(-30, 30, (2000,)).float(),
        torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 3 * 2**-11), 3.4028235e38, 0.0, -0.0,
                      float("inf"), float("-inf")]),
    ])
    r = to_tf32(x)
    assert r.dtype == torch.float32 and r.shape == x.shape
    expected = torch.tensor([_tf32_reference(float(v)) for v in x], dtype=torch.float32)
    assert torch.equal(r, expected)
    assert r[-8] == 1.0 and r[-7] == 1 + 2**-9 and r[-6] == -(1 + 2**-9)
    assert math.isinf(float(r[-5]))  # largest float rounds up to inf
    assert to_tf32(torch.tensor([float("nan")])).isnan().all()
    finite = torch.isfinite(r)
    assert torch.all((r[finite].view(torch.int32) & 0x1FFF) == 0)
    assert torch.equal(to_tf32(x.double()), x.double()), "tf32 only applies to fp32"


def test_tf32_profile_matmul():
    torch.manual_seed(6)
    a, b = torch.randn(16, 64), torch.randn(64, 8)
    with sim(profile="tf32"):
        c = torch.mm(a, b)
    assert torch.equal(c, torch.mm(to_tf32(a), to_tf32(b)))
    assert not torch.equal(c, torch.mm(a, b))


def test_fp8_e4m3_per_tensor_scaling():
    torch.manual_seed(7)
    x = torch.randn(4096) * 1e-3
    q = to_fp8_e4m3(x)
    scale = x.abs().max() / 448
    # e4m3: 3 mantissa bits (half an ulp is at most 2^-4 relative), subnormals spaced 2^-9
    # (half-step 2^-10) in scaled units; the last factor covers fp32 scale arithmetic.
    tol = torch.maximum(x.abs() * 2**-4, torch.full_like(x, float(scale) * 2**-10)) * 1.0001
    assert torch.all((q - x).abs() <= tol)
    assert torch.isclose(q.abs().max(), x.abs().max(), rtol=1e-6)
    codes = (q / scale).to(torch.float8_e4m3fn).float()
    assert torch.allclose(codes * scale, q, rtol=1e-6, atol=0)
    assert len(torch.unique(codes)) <= 256
    assert torch.equal(to_fp8_e4m3(torch.zeros(3)), torch.zeros(3))
    with sim(profile="fp8-e4m3"):
        c = torch.mm(x.view(64, 64), x.view(64, 64))
    assert torch.equal(c, torch.mm(q.view(64, 64), q.view(64, 64)))


def test_user_defined_profile_rounds_inputs_and_outputs():
    register_profile(Profile(
        "test-softmax-fp16", "softmax computed on fp16 inputs, stored as fp16",
        (Rule("aten._softmax.*", "fp16", output="fp16"),),
    ))
    assert "test-softmax-fp16" in {p.name for p in profiles()}
    torch.manual_seed(8)
    x = torch.randn(4, 10)
    with sim(profile="test-softmax-fp16") as mode:
        y = torch.softmax(x, dim=-1)
        z = x @ x.t()  # not covered by the profile
    assert mode.profile_name == "test-softmax-fp16"
    assert torch.equal(y, torch.softmax(x.half().float(), dim=-1).half().float())
    assert torch.equal(z, x @ x.t())
    with pytest.raises(ValueError, match="unknown rounding"):
        Rule("aten.mm.*", "fp12")
    with pytest.raises(ValueError, match="unknown profile"):
        sim(profile="no-such-profile")


# -- faults ---------------------------------------------------------------------------------


def _only_target_changed(fault, *, expect_op, expect_module=None, expect_occurrence=0):
    """Run with one fault; assert it fired once, on the expected call, and nowhere else."""
    _, _, base_records, _ = run_step()
    _, _, records, mode = run_step(profile="exact", faults=[fault])
    assert len(mode.applied) == 1, mode.applied
    applied = mode.applied[0]
    call = applied["call"]
    assert applied["op"] == expect_op == str(records[call][0])
    assert applied["occurrence"] == expect_occurrence
    assert applied["kind"] == fault.kind and applied["fault"] == 0
    if expect_module is not None:
        assert applied["module"] == expect_module
    assert locally_changed(records) == [call]
    # Everything before the target is bit-identical to the run without faults.
    assert _names(records) == _names(base_records)
    assert all(_same(a[2], b[2]) for a, b in zip(base_records[:call], records[:call], strict=True))
    assert not _same(base_records[call][2], records[call][2])
    json.dumps(mode.applied)
    json.dumps(mode.describe())
    return records[call], mode


def test_fault_eps_changes_only_layer_norm_of_the_selected_module():
    fault = sim.fault("aten.native_layer_norm.default", module="encoder.layers.1.*", kind="eps",
                      value=1e-2)
    (func, (args, kwargs), out), mode = _only_target_changed(
        fault, expect_op="aten.native_layer_norm.default",
        expect_module="MyModel.encoder.layers.1.norm1",
    )
    x, shape, w, b = args[:4]
    assert args[4] == pytest.approx(1e-5)  # the layer above sim sees the real argument
    assert torch.equal(out[0], F.layer_norm(x, shape, w, b, eps=1e-2))
    assert mode.applied[0]["arg"] == "eps" and mode.applied[0]["value"] == 1e-2
    assert mode.describe()["faults"][0]["module"] == "encoder.layers.1.*"


def test_fault_replace_with_tanh_gelu_on_second_occurrence():
    fault = sim.fault("aten.gelu.default", kind="replace", value="gelu-tanh", occurrence=1)
    (func, (args, kwargs), out), mode = _only_target_changed(
        fault, expect_op="aten.gelu.default", expect_module="MyModel.encoder.layers.1",
        expect_occurrence=1,
    )
    assert torch.equal(out, F.gelu(args[0], approximate="tanh"))


def test_fault_replace_with_callable():
    def doubled(func, args, kwargs):
        return func(*args, **kwargs) * 2

    fault = sim.fault("aten.addmm.default", kind="replace", value=doubled, occurrence=0)
    (func, (args, kwargs), out), mode = _only_target_changed(
        fault, expect_op="aten.addmm.default", expect_module="MyModel.encoder.layers.0.lin",
    )
    assert torch.equal(out, torch.addmm(*args, **kwargs) * 2)
    assert mode.describe()["faults"][0]["value"].startswith("callable:")


def test_fault_replace_softmax_unstable_overflows_on_large_logits():
    small, large = torch.randn(2, 6), torch.randn(2, 6) + 200.0
    fault = sim.fault("aten._softmax.default", kind="replace", value="softmax-unstable")
    with sim(faults=[fault]) as mode:
        a, b = torch.softmax(small, -1), torch.softmax(large, -1)
    assert torch.allclose(a, torch.softmax(small, -1), rtol=1e-5, atol=1e-7)
    assert b.isnan().all() and torch.isfinite(torch.softmax(large, -1)).all()
    assert [x["occurrence"] for x in mode.applied] == [0, 1]


def test_fault_bias_on_first_addmm():
    fault = sim.fault("aten.addmm.default", kind="bias", value=1e-3, occurrence=0)
    (func, (args, kwargs), out), _ = _only_target_changed(fault, expect_op="aten.addmm.default")
    assert torch.equal(out, torch.addmm(*args, **kwargs) * (1 + 1e-3))


def test_fault_noise_in_backward_is_seeded():
    fault = sim.fault("aten.native_layer_norm_backward.default", module="encoder.layers.0",
                      kind="noise", value=1e-2, seed=3)
    (func, (args, kwargs), out), mode = _only_target_changed(
        fault, expect_op="aten.native_layer_norm_backward.default",
        expect_module="MyModel.encoder.layers.0.norm1",
    )
    clean = func(*args, **kwargs)[0]
    rel = ((out[0] - clean) / clean).abs()
    assert 1e-4 < float(rel.max()) < 0.1
    assert torch.equal(out[1], func(*args, **kwargs)[1])  # other outputs untouched
    _, _, again, _ = run_step(profile="exact", faults=[fault])
    assert torch.equal(again[mode.applied[0]["call"]][2][0], out[0]), "noise must be reproducible"


@pytest.mark.parametrize("kind, value, fill", [("nan", None, math.nan), ("inf", -1, -math.inf)])
def test_fault_nan_inf_at_index(kind, value, fill):
    fault = sim.fault("aten.mm.default", kind=kind, value=value, index=5, occurrence=0)
    (func, (args, kwargs), out), _ = _only_target_changed(fault, expect_op="aten.mm.default")
    clean = torch.mm(*args, **kwargs)
    flat, clean_flat = out.reshape(-1), clean.reshape(-1)
    bad = ~torch.isfinite(flat)
    assert bad.nonzero().flatten().tolist() == [5]
    assert math.isnan(flat[5]) if math.isnan(fill) else float(flat[5]) == fill
    keep = torch.ones_like(bad)
    keep[5] = False
    assert torch.equal(flat[keep], clean_flat[keep])


def test_fault_every_occurrence_when_occurrence_is_none():
    _, _, records, mode = run_step(faults=[sim.fault("aten.gelu.default", kind="bias", value=0.5)])
    assert [a["occurrence"] for a in mode.applied] == [0, 1]
    assert [a["module"] for a in mode.applied] == ["MyModel.encoder.layers.0",
                                                   "MyModel.encoder.layers.1"]
    assert locally_changed(records) == [a["call"] for a in mode.applied]


@pytest.mark.parametrize("spelling", ["aten.gelu", "aten::gelu", "gelu", "aten.gelu.default",
                                      "aten.gel?.*"])
def test_fault_op_takes_every_spelling_of_an_op(spelling):
    """One pattern rule for every option naming ops: `sim.fault("aten.gelu")` (what
    `accuracy demo --fault-op aten.gelu` passes) fires on aten.gelu.default, not on its
    backward."""
    _, _, _, mode = run_step(faults=[sim.fault(spelling, kind="bias", value=0.5)])
    assert [(a["op"], a["module"]) for a in mode.applied] == [
        ("aten.gelu.default", "MyModel.encoder.layers.0"),
        ("aten.gelu.default", "MyModel.encoder.layers.1")]


def test_a_profile_rule_takes_the_same_op_spellings():
    """A user's profile rule `aten.mm` rounds aten.mm.default, as the fault's pattern would."""
    prof = Profile("h50-mm", "mm operands to bf16", (Rule("aten::mm", "bf16"),))
    assert prof.rule_for("aten.mm.default") is not None
    assert prof.rule_for("aten.addmm.default") is None


def test_a_fault_matching_no_call_names_the_closest_ops_it_saw(caplog):
    with caplog.at_level("WARNING", logger="accuracy.device_backend.simulator"):
        _, _, _, mode = run_step(faults=[sim.fault("aten.gleu", kind="bias", value=0.5)])
    assert mode.applied == []
    line = next(r.getMessage() for r in caplog.records if "matched no call" in r.getMessage())
    assert "closest first: aten.gelu.default" in line, line


def test_fault_that_matches_nothing_changes_nothing():
    loss0, grads0, _, _ = run_step()
    loss1, grads1, _, mode = run_step(faults=[
        sim.fault("aten.native_layer_norm.default", module="decoder.*", kind="eps", value=1.0),
        sim.fault("aten.gelu.default", kind="bias", value=1.0, occurrence=7),
    ])
    assert mode.applied == []
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1, strict=True))


def test_fault_validation():
    with pytest.raises(ValueError, match="unknown fault kind"):
        sim.fault("aten.mm.default", kind="explode")
    with pytest.raises(ValueError, match="finite relative magnitude"):
        sim.fault("aten.mm.default", kind="bias")
    with pytest.raises(ValueError, match="replace needs"):
        sim.fault("aten.mm.default", kind="replace", value="no-such-kernel")
    with pytest.raises(ValueError, match="0-based"):
        sim.fault("aten.mm.default", kind="nan", occurrence=-1)
    with pytest.raises(ValueError, match="arg="):
        sim.fault("aten.mm.default", kind="arg", value=1)
    with pytest.raises(TypeError):
        sim(faults=["aten.mm.default"])
    # A named argument the op does not have is a configuration error, reported at the call.
    with sim(faults=[sim.fault("aten.mm.default", kind="eps", value=0.1)]):
        with pytest.raises(ValueError, match="no argument 'eps'"):
            torch.mm(torch.ones(2, 2), torch.ones(2, 2))


def test_fault_arg_changes_any_named_argument():
    x = torch.randn(3, 5)
    with sim(faults=[sim.fault("aten._softmax.default", kind="arg", arg="dim", value=0)]) as m:
        y = torch.softmax(x, dim=1)
    assert torch.equal(y, torch.softmax(x, dim=0))
    assert m.applied[0]["arg"] == "dim" and m.applied[0]["value"] == 0


def test_active_nesting_and_describe():
    assert sim.active() is None
    outer = sim(profile="bf16")
    inner = sim(profile="fp16-cube", faults=[sim.fault("aten.mm.*", kind="bias", value=0.1)])
    with outer:
        assert sim.active() is outer
        with inner:
            assert sim.active() is inner
        assert sim.active() is outer
        with pytest.raises(RuntimeError, match="already active"):
            outer.__enter__()
    assert sim.active() is None
    d = json.loads(json.dumps(inner.describe()))
    assert d["profile"] == "fp16-cube" and d["occurrence_base"] == 0
    assert d["faults"] == [{"op": "aten.mm.*", "kind": "bias", "value": 0.1, "module": None,
                            "occurrence": None, "arg": None, "index": 0, "output": 0,
                            "seed": 0}]
    assert any(r["op"] == "aten.mm.*" and r["rounding"] == "fp16" for r in d["rules"])


def test_sim_internal_ops_are_invisible_to_modes_below():
    """Entered the other way round (dumper outside sim), the recorder sees only real ops."""
    x = torch.randn(4, 4)
    rec = Recorder()
    with rec, sim(profile="fp16-cube", faults=[sim.fault("aten.mm.default", kind="nan")]):
        y = torch.mm(x, x)
    assert _names(rec.records) == ["aten.mm.default"]
    func, (args, _), out = rec.records[0]
    # Below sim a mode sees what reached the kernel: rounded operands, output before faults.
    assert torch.equal(args[0], x.half().float())
    assert out.isnan().sum() == 0 and y.isnan().sum() == 1


def test_a_fault_that_matches_no_call_says_so(caplog):
    """A misspelt op or module would otherwise leave a clean run that reads as 'found
    nothing'; a fault that met its calls says nothing."""
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    caplog.set_level("WARNING", logger="accuracy.device_backend")
    with sim(faults=[sim.fault("aten.bmm.default", module="decoder", kind="bias", value=0.1),
                     sim.fault("aten.mm.default", kind="bias", value=0.1)]):
        torch.mm(a, b)
    lines = [r.getMessage() for r in caplog.records if "matched no call" in r.getMessage()]
    assert len(lines) == 1 and "'aten.bmm.default'" in lines[0] and "'decoder'" in lines[0]
