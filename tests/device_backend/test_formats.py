"""fp8 and MX: formats, quantisation figures, sim profiles, verdicts, the high-precision proof."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from accuracy.device_backend import sim
from accuracy.device_backend.formats import E2M1, E4M3, E5M2, quantize, round_to
from accuracy.dumper import dumper
from accuracy.dumpfile import load_dump
from accuracy.dumpfile.quant import quant_figures


def test_format_limits_and_subnormals():
    assert (E4M3.max, E5M2.max, E2M1.max) == (448.0, 57344.0, 6.0)
    assert (E4M3.min_normal, E4M3.min_subnormal) == (2.0 ** -6, 2.0 ** -9)
    assert (E5M2.min_normal, E5M2.min_subnormal) == (2.0 ** -14, 2.0 ** -16)
    x = torch.tensor([500.0, 448.0, 2.0 ** -9, 0.49 * 2.0 ** -9, 0.51 * 2.0 ** -9, 3.3, -1e6])
    assert round_to(x, E4M3).tolist() == [448.0, 448.0, 2.0 ** -9, 0.0, 2.0 ** -9, 3.25, -448.0]
    assert round_to(torch.tensor([7e4, 2.0 ** -17 * 1.1]), E5M2).tolist() == [57344.0, 2.0 ** -16]
    assert round_to(torch.tensor([0.3, 0.75, 1.25, 2.6, 5.1, 9.0]), E2M1).tolist() == \
        [0.5, 1.0, 1.0, 3.0, 6.0, 6.0]
    # non-finite values pass through a cast untouched and stay out of the figures
    q = quantize(torch.tensor([1.0, math.inf, math.nan, -2.0]), E4M3)
    assert q.value[0] == 1.0 and q.value[1] == math.inf and math.isnan(q.value[2])
    assert q.figures["numel"] == 2 and q.figures["amax"] == 2.0


def test_per_tensor_figures_equal_a_hand_computation():
    # amax 448 -> scale 1: values keep their e4m3 rounding; 2^-11 is below half the smallest
    # subnormal (2^-10) and flushes to 0, 0.6 * 2^-9 rounds up to the subnormal 2^-9.
    x = torch.tensor([448.0, -3.3, 2.0 ** -11, 0.6 * 2.0 ** -9, 0.0, 1.0])
    q = quantize(x, E4M3)
    f = q.figures
    assert q.value.tolist() == [448.0, -3.25, 0.0, 2.0 ** -9, 0.0, 1.0]
    assert f["scale_min"] == f["scale_max"] == 1.0 and f["scale_inv_min"] == 1.0
    assert f["underflow_pct"] == pytest.approx(100 * 1 / 5)  # of the 5 nonzero values
    assert f["overflow_pct"] == 0.0
    assert f["dynamic_range"] == pytest.approx(math.log2(448.0 / 2.0 ** -11))
    err = (q.value - x).double()
    assert f["mse"] == pytest.approx(float((err ** 2).mean()))
    assert f["rel_error"] == pytest.approx(float(err.norm() / x.double().norm()))
    # current scaling: amax 2 -> scale 28672; a scale 4x too large clips what exceeds 0.5
    y = torch.tensor([2.0, 1.0, 0.25, -0.5])
    g = quantize(y, E5M2, scale_factor=4.0).figures
    assert g["scale_max"] == pytest.approx(57344.0 / 2 * 4)
    assert g["scale_inv_max"] == pytest.approx(2 / 57344.0)  # the dequantisation stayed right
    assert g["overflow_pct"] == pytest.approx(50.0)  # 2.0 and 1.0 clip; -0.5 lands on the max


def test_mx_block_scales_are_powers_of_two_per_32():
    torch.manual_seed(0)
    x = torch.randn(2, 64)
    x[0, :32] *= 1000.0  # one block 1000x larger: its own scale, the others untouched
    q = quantize(x, E4M3, block=32)
    f = q.figures
    blocks = x.reshape(-1, 32).abs().amax(1)
    expected = torch.exp2(-torch.ceil(torch.log2(blocks / 448.0)))
    assert f["scale_max"] == float(expected.max()) and f["scale_min"] == float(expected.min())
    assert all(math.log2(s) == int(math.log2(s)) for s in expected.tolist())
    assert f["overflow_pct"] == 0.0  # TE rounds the e8m0 scale up: nothing clips
    ref = torch.cat([round_to(b * s, E4M3) / s for b, s in zip(x.reshape(-1, 32), expected,
                                                                strict=True)])
    assert torch.equal(q.value.reshape(-1), ref)
    # per tensor, the small blocks lose their subnormals; per block they do not
    assert quantize(x, E4M3).figures["rel_error"] > 0
    assert f["block_dynamic_range"] < f["dynamic_range"] + 1e-9
    # the operand keeps its layout (a changed stride changed the op stream: new_empty_strided)
    t = torch.randn(64, 8).t()
    assert quantize(t, E4M3, block=32, axis=0).value.stride() == t.stride()
    # mxfp4: e2m1 elements, the same machinery
    assert quantize(x, E2M1, block=32).figures["scale_max"] == float(torch.exp2(
        -torch.ceil(torch.log2(blocks / 6.0))).max())


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


def test_fp8_profile_uses_e5m2_for_gradients_and_records_figures(tmp_path):
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(8, 16)
    with sim(profile="fp8"), dumper(str(tmp_path / "d.h5"), mode="statistics"):
        _step(model, x)
    with load_dump(tmp_path / "d.h5") as d:
        ops = quant_figures(d)
    fwd = [o for o in ops if o.phase == "forward"]
    bwd = [o for o in ops if o.phase == "backward"]
    assert [o.op for o in fwd] == ["aten.addmm.default"] * 2
    assert {f["format"] for o in fwd for f in o.operands} == {"e4m3"}
    kinds = {(f["gemm"], f["role"], f["format"]) for o in bwd for f in o.operands}
    assert ("dgrad", "gradient", "e5m2") in kinds and ("dgrad", "weight", "e4m3") in kinds
    assert ("wgrad", "gradient", "e5m2") in kinds and ("wgrad", "activation", "e4m3") in kinds
    assert all(f["overflow_pct"] == 0 for o in ops for f in o.operands)


def test_fp8_gemm_computes_on_quantised_operands():
    torch.manual_seed(1)
    a, b = torch.randn(8, 64), torch.randn(64, 8)
    with sim(profile="fp8"):
        c = torch.mm(a, b)
    assert torch.equal(c, torch.mm(quantize(a, E4M3).value, quantize(b, E4M3).value))
    a[:, :16] *= 2.0 ** 12  # 16 large then 16 small values share one block of 32
    with sim(profile="mxfp8"):
        m = torch.mm(a, b)
    assert torch.equal(m, torch.mm(quantize(a, E4M3, block=32, axis=-1).value,
                                   quantize(b, E4M3, block=32, axis=0).value))
    assert not torch.equal(m, torch.mm(quantize(a, E4M3, block=16, axis=-1).value,
                                       quantize(b, E4M3, block=16, axis=0).value))
    exact = torch.mm(a, b)
    with sim(profile="fp8-e4m3"):  # the old profile still works
        old = torch.mm(a, b)
    assert not torch.equal(old, exact) and float((old - exact).norm() / exact.norm()) < 0.1


def test_delayed_scaling_uses_the_amax_history():
    a, b = torch.ones(4, 4), torch.eye(4)
    hist: dict = {}
    with sim(profile="fp8-delayed", amax_history=hist):
        torch.mm(a, b)  # history: amax 1
    with sim(profile="fp8-delayed", amax_history=hist):
        c = torch.mm(a * 4, b)  # scale from amax 1: 4 is cast 4x beyond the max and clips
    assert torch.equal(c, torch.ones(4, 4))
    with sim(profile="fp8"):
        assert torch.equal(torch.mm(a * 4, b), a * 4)


def test_quant_faults_scale_and_saturate():
    x, w = torch.tensor([[1.0, 0.5, 0.25, 0.125]]), torch.eye(4)
    with sim(profile="fp8", faults=[sim.fault("aten.mm.default", kind="scale", value=4.0)]):
        y = torch.mm(x, w)
    assert y.tolist() == [[1.0, 1.0, 1.0, 0.5]]  # 4x, clipped at max (= the old amax)
    with sim(profile="fp8", faults=[sim.fault("aten.mm.default", kind="saturate",
                                              value=4.0)]):
        z = torch.mm(x, w)
    assert z.tolist() == [[0.25, 0.25, 0.25, 0.125]]  # clipped at max / 4, not scaled
    stale = sim(profile="fp8", faults=[sim.fault("aten.mm.default", kind="stale-amax",
                                                 value=0.25)])
    with stale:
        s = torch.mm(x, w)
    assert s.tolist() == z.tolist()  # an amax 4x too small: the same clipping
    assert [a["kind"] for a in stale.applied] == ["stale-amax"]
    from accuracy.device_backend.profiles import Quant
    from accuracy.errors import UsageError

    with pytest.raises(UsageError, match="positive factor"):
        sim.fault("aten.mm.default", kind="scale", value=0)
    with pytest.raises(UsageError, match="unknown number format"):
        Quant("e3m4")


def _gpt2_step():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128,
                                  n_positions=32, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return lambda: model(input_ids=tokens, labels=tokens).loss.backward()


def _judge(tmp_path, profile, faults, name):
    from accuracy.compare import compare
    from accuracy.replay import replay

    golden = tmp_path / "golden.h5"
    if not golden.exists():
        with dumper(str(golden)):
            _gpt2_step()()
    dev, rep = tmp_path / f"{name}.h5", tmp_path / f"{name}-replay.h5"
    with sim(profile=profile, faults=faults), dumper(str(dev)):
        _gpt2_step()()
    replay(dev, rep)
    with load_dump(dev) as d:
        seq = next((r.seq for r in d.records if r.extra.get("faults")), None)
    return compare(dev, golden, replay=rep), seq


def test_fp8_verdicts_on_a_tiny_transformers_gpt2(tmp_path):
    """The issue's case: under fp8 a 10% bias in one addmm's output gave 0 errors."""
    site = ("aten.addmm.default", "*h.1.mlp.c_proj")
    report, _ = _judge(tmp_path, "fp8", [], "clean")
    assert report.summary["counts"]["error"] == 0
    rows = [r for r in report.rows if r["quant"]]
    assert rows and "e4m3" in rows[0]["quant"] and "scale_inv" in rows[0]["quant"]
    for kind, value, says in (("bias", 0.1, "local error"),
                              ("scale", 4.0, "scale x scale_inv = 4"),
                              ("saturate", 8.0, "saturated at e4m3's max")):
        fault = sim.fault(site[0], site[1], kind=kind, value=value, occurrence=0)
        report, seq = _judge(tmp_path, "fp8", [fault], kind)
        culprit = report.summary["culprit"]
        assert seq is not None and culprit["seq_my"] == seq, kind
        row = next(r for r in report.rows if r["seq_my"] == seq and r["io"] == "output")
        assert row["verdict"] == "error" and says in row["message"], row["message"]


class Outlier(nn.Module):
    """fc2's input has one outlier feature 1e6x the others (its weight column 1e6x smaller):
    one scale per tensor flushes every other feature to 0 in e4m3."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.fc4 = nn.Linear(4, 4)
        gain = torch.ones(32)
        gain[0] = 1e6
        self.register_buffer("gain", gain)
        with torch.no_grad():
            self.fc2.weight[:, 0] /= 1e6
            self.fc2.weight[:, 1:] *= 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x)) * self.gain
        return self.fc4(self.fc3(torch.relu(self.fc2(h))))


def _outlier_step():
    model = Outlier()
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(4))
    y = torch.randn(16, 4, generator=torch.Generator().manual_seed(5))

    def step():
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss, model
    return step


def test_switching_one_layers_fp8_gemms_to_high_precision_closes_the_gap():
    from accuracy.live.high_precision import prove_high_precision

    proof = prove_high_precision(_outlier_step(), golden=_outlier_step(), profile="fp8",
                                 modules=["*fc2"], seed=0)
    assert proof.device.loss_gap > 1e-3
    assert proof.convincing, proof.sentence
    assert proof.culprit.loss_closed > 0.9 and proof.control.loss_closed < 0.1
    assert [c["module"] for c in proof.culprit.calls] == ["Outlier.fc2"]
    assert proof.culprit.calls[0]["underflow_pct"] > 50  # the figure that explains it
    # automatic: the GEMMs whose operands underflow past 50% are fc2's, and only them
    auto = prove_high_precision(_outlier_step(), golden=_outlier_step(), profile="fp8",
                                over={"underflow_pct": 50.0})
    assert [c["module"] for c in auto.culprit.calls] == ["Outlier.fc2"] and auto.convincing


def test_scaled_mm_is_recorded_and_replayed_against_an_fp64_reference(tmp_path):
    from accuracy.replay import replay

    torch.manual_seed(0)
    a, b = torch.randn(16, 32), torch.randn(32, 16)
    sa, sb = 448 / a.abs().max(), 448 / b.abs().max()
    ratios = {}
    for name, faults in (("clean", []), ("bias", [sim.fault("aten._scaled_mm.default",
                                                            kind="bias", value=0.01)])):
        dev, rep = tmp_path / f"{name}.h5", tmp_path / f"{name}-r.h5"
        with sim(faults=faults), dumper(str(dev)):
            a8 = (a * sa).to(torch.float8_e4m3fn)
            b8 = (b * sb).to(torch.float8_e4m3fn).t().contiguous().t()
            torch._scaled_mm(a8, b8, scale_a=1 / sa, scale_b=1 / sb, out_dtype=torch.float32)
        replay(dev, rep)
        with load_dump(dev) as d:
            rec = next(r for r in d.records if r.op == "aten._scaled_mm.default")
            assert [t.dtype for t in rec.inputs][:2] == ["float8_e4m3fn", "float8_e4m3fn"]
        with load_dump(rep) as d:
            out = next(r for r in d.records if r.op == "aten._scaled_mm.default")
            ratios[name] = out.extra["replay"]["outputs"][0]["error_ratio"]
    assert ratios["clean"] < 4 and ratios["bias"] > 1e4


def test_figures_reach_the_report_files_escaped(tmp_path):
    from accuracy.compare import compare
    from accuracy.compare.quant import findings
    from accuracy.dumpfile.quant import figures_of, summary

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    with dumper(str(tmp_path / "g.h5")):
        _step(MLP(), x)
    torch.manual_seed(0)
    with sim(profile="mxfp8"), dumper(str(tmp_path / "d.h5")):
        _step(MLP(), x)
    report = compare(tmp_path / "d.h5", tmp_path / "g.h5")
    report.write(tmp_path / "out", formats=("html", "csv"))
    csv_text = (tmp_path / "out" / "rows.csv").read_text()
    assert "Quantization" in csv_text.splitlines()[0] and "e4m3/32" in csv_text
    assert "e4m3/32" in next((tmp_path / "out").glob("*.html")).read_text()
    # figures come from an untrusted file: malformed values are dropped, text is escaped
    figs = figures_of({"quant": [{"arg": "<script>x</script>", "underflow_pct": "lots",
                                  "overflow_pct": 50.0, "format": "e4m3"}, "junk"]})
    assert len(figs) == 1 and figs[0]["underflow_pct"] is None
    verdict, notes = findings(figs, {"overflow_warning_pct": 0.01, "overflow_error_pct": 1.0,
                                     "underflow_warning_pct": 1.0, "underflow_error_pct": 10.0,
                                     "scale_mismatch": 0.01})
    assert verdict == "error" and "saturated" in notes[0]
    from accuracy.compare.html import render

    row = next(r for r in report.rows if r.quant)
    row.quant = summary(figs)
    page = render(report.rows, report.summary)
    assert "&lt;script&gt;x" in page and "<script>x" not in page
