"""The tool's flows on the npu test device, as a user on an accelerator runs them: a model
moved with `.to("npu")`, its step dumped and compared against the same step on CPU.

What a user relies on: the device's foreach AdamW pairs parameter by parameter with CPU's
per-tensor AdamW and is judged; dropout's draws (a device's own generator, in one
`native_dropout` where CPU runs `bernoulli_` and `mul`) are said first without a replay and
judged with one; a clean step is 0 errors and no BLIND line; a fault under `sim` on the
device's tensors is named; a replay on CPU rebuilds the device's factory calls.
"""

from __future__ import annotations

import copy

import pytest
import torch

import accuracy.testdevice as testdevice
from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.compare.draws import DRAWS_DIFFER
from accuracy.device_backend import sim
from accuracy.errors import ExtensionUnavailableError
from accuracy.replay import replay

LAYER = "GPT2LMHeadModel.transformer.h.1.mlp.c_fc"


@pytest.fixture(scope="module")
def npu():
    try:
        return testdevice.load()
    except ExtensionUnavailableError as e:
        pytest.skip(f"the npu test device cannot be had here: {e}")


def _gpt2(dropout: float):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  bos_token_id=0, eos_token_id=0, resid_pdrop=dropout,
                                  embd_pdrop=dropout, attn_pdrop=dropout)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).train()


def _step(model, device: str, path, faults=None) -> None:
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3)).to(device)
    with sim(profile="bf16", faults=faults) if faults is not None else _nothing(), \
            dumper(str(path)):
        out = model(ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture(scope="module")
def runs(npu, tmp_path_factory):
    """A dropout-on GPT-2 step with AdamW on CPU (golden) and on npu, and the npu dump's
    replay on CPU."""
    d = tmp_path_factory.mktemp("npu_runs")
    model = _gpt2(0.1)
    _step(model, "cpu", d / "gold.h5")
    _step(model, "npu", d / "npu.h5")
    replay(d / "npu.h5", d / "replay.h5")
    return d


def _optimizer_rows(rep):
    return [r for r in rep.rows if r.kind == "op" and r.phase == "optimizer"]


def test_the_devices_foreach_adamw_pairs_with_cpus_per_tensor_adamw(runs):
    with load_dump(runs / "npu.h5") as dev, load_dump(runs / "gold.h5") as gold:
        dev_ops = {r.op for r in dev.records if r.phase == "optimizer"}
        gold_ops = {r.op for r in gold.records if r.phase == "optimizer"}
        params = {r.module for r in gold.records if r.op == "aten.lerp_.Scalar"}
    assert "aten._foreach_lerp_.Scalar" in dev_ops and "aten.lerp_.Scalar" in gold_ops
    rep = compare(runs / "npu.h5", runs / "gold.h5", replay=runs / "replay.h5")
    paired = [r for r in _optimizer_rows(rep) if r.io == "output" and r.golden_address
              and "paired by optimizer state" in (r.message or "")]
    # every parameter's three states, each at its last write, judged on both sides
    last = {(r.module, r.message.split(": ")[1].split(" of ")[0]) for r in paired
            if "its last write" in r.message}
    assert {(p, s) for p in params for s in ("param", "exp_avg", "exp_avg_sq")} <= last
    assert all(r.verdict.value == "pass" for r in paired), [
        (r.module, r.verdict, r.message) for r in paired if r.verdict.value != "pass"][:3]
    assert "phases_uncompared" not in rep.summary["coverage"]


def test_a_clean_device_step_with_a_replay_has_no_error_and_no_blind_line(runs):
    rep = compare(runs / "npu.h5", runs / "gold.h5", replay=runs / "replay.h5")
    assert rep.summary["counts"]["error"] == 0, rep.summary.get("culprit")
    assert not rep.summary.get("blind"), rep.summary.get("blind")
    assert rep.summary["culprit"] is None


def test_without_a_replay_the_devices_own_dropout_draws_are_said_first(runs):
    rep = compare(runs / "npu.h5", runs / "gold.h5")
    blind = rep.summary.get("blind") or []
    assert any(b.startswith(DRAWS_DIFFER) and "native_dropout" in b for b in blind), blind


def test_a_fault_on_one_layers_matmul_under_sim_bf16_on_the_device_is_named(npu, tmp_path):
    model = _gpt2(0.0)
    _step(model, "cpu", tmp_path / "gold.h5")
    fault = sim.fault("aten.addmm.default", module=f"*{LAYER}", kind="bias", value=0.05)
    _step(model, "npu", tmp_path / "npu.h5", faults=[fault])
    replay(tmp_path / "npu.h5", tmp_path / "replay.h5")
    rep = compare(tmp_path / "npu.h5", tmp_path / "gold.h5", replay=tmp_path / "replay.h5")
    c = rep.summary["culprit"]
    assert c is not None and c["op"] == "aten.addmm.default", rep.summary["counts"]
    assert c["module"] == LAYER and c["phase"] == "forward"


def test_the_monitors_capture_re_runs_a_flagged_device_step_bit_for_bit(npu, tmp_path):
    """The step draws its dropout mask from the device's generator: the snapshot saves and
    restores that generator, so the re-run is the same step (its loss has the same bits) and
    the overflow birth is named."""
    import accuracy.monitor as am

    boom = 5
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4)).to("npu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def train_step(x, y, flag):
        opt.zero_grad()
        h = model[1](model[0](x))
        if flag:
            h.register_hook(lambda g: g * 1e39)
        loss = torch.nn.functional.cross_entropy(model[3](model[2](h)), y)
        loss.backward()
        opt.step()
        return loss

    step = am.watch(train_step, model, opt, path=tmp_path / "npu.monitor.h5", snapshot_every=4)
    for i in range(boom + 1):
        g = torch.Generator().manual_seed(i)
        step(torch.randn(4, 8, generator=g).npu(), torch.randint(0, 4, (4,), generator=g).npu(),
             i == boom)
    step.monitor.close()
    (cap,) = step.monitor.captures
    assert cap.step == boom
    assert cap.exact is True, (cap.rerun_loss, cap.reason)
    assert cap.culprit and cap.culprit["phase"] == "backward", cap.culprit


def test_sims_output_faults_run_on_the_devices_tensors(npu):
    """A noise fault draws its noise on the host (the same noise on every backend) and sends
    it to the device, where the output is: no host tensor mixed into a device op."""
    x = torch.randn(4, 8).npu()
    w = torch.randn(8, 3).npu()
    fault = sim.fault("aten.mm.default", kind="noise", value=0.05, seed=1)
    with sim(profile="exact", faults=[fault]):
        noisy = torch.mm(x, w)
    clean = torch.mm(x.cpu(), w.cpu())
    assert noisy.device.type == "npu"
    assert not torch.equal(noisy.cpu(), clean)
    torch.testing.assert_close(noisy.cpu(), clean, rtol=0.5, atol=0.5)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 4))


def test_the_online_overflow_check_names_the_birth_on_the_device_as_on_cpu(npu, tmp_path):
    """Off CPU the check reads its probes late, in one transfer: an input whose values sit
    near float32's max (where overflows are born) has a probe sum that overflowed too, and
    must be checked before the birth is passed off as inherited."""
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    born = {}
    for dev in ("cpu", "npu"):
        model = _mlp().to(dev)
        with dumper(str(tmp_path / f"{dev}.h5"), check_overflow=True):
            loss = torch.nn.functional.cross_entropy(model(x.to(dev) * 1e38), y.to(dev))
            loss.backward()
        with load_dump(tmp_path / f"{dev}.h5") as d:
            born[dev] = [(r.op, r.module) for r in d.records]
    assert born["npu"] == born["cpu"] == [("aten.native_layer_norm.default", "Sequential.2")]


def _on_npu(names: dict) -> dict:
    """The guide's names as an Ascend user has them: `torch.npu.set_device(0)`, `.npu()`."""
    torch.npu.set_device(0)
    return {k: v.npu() for k, v in names.items()}


def test_the_ascend_guides_snippets_run_on_the_device_against_a_cpu_golden(npu, in_tmp):
    """docs/ascend-guide.md's blocks as written: the golden dump on CPU, then on the device
    the load-mode dump (the device's ops fed the CPU run's recorded inputs) and the overflow
    check; the load-mode dump compares clean against its golden."""
    from tests._support.guide import DOC, guide_names, python_blocks

    dump_block, load_block, overflow_block = python_blocks(DOC.read_text())[:3]
    exec(compile(dump_block, str(DOC), "exec"), guide_names())  # noqa: S102 - the docs' code
    exec(compile(load_block, str(DOC), "exec"), _on_npu(guide_names()))  # noqa: S102
    with load_dump("model_npu.h5") as d:
        assert d.attrs["backend"] == "npu" and d.attrs["ops_loaded"] > 5
    rep = compare("model_npu.h5", "model_gpu.h5")
    assert rep.summary["counts"]["error"] == 0 and not rep.summary.get("blind")
    from accuracy.overflow import OverflowWarning

    with pytest.warns(OverflowWarning, match="aten.addmm.default"):
        exec(compile(overflow_block, str(DOC), "exec"),  # noqa: S102
             _on_npu(guide_names(scale=3e38)))
    with load_dump("overflow_dump/dump_0.h5") as d:
        assert d.attrs["overflow"]["events"][0]["op"] == "aten.addmm.default"


def _mlp_step(model, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    return loss


def test_a_statistics_dump_on_the_device_holds_cpus_figures(npu, tmp_path):
    """Every figure is computed on the device and copied over (nothing reads a device
    address): the same statistics as the CPU run's, where the kernels are CPU's."""
    for dev in ("cpu", "npu"):
        with dumper(str(tmp_path / f"{dev}.h5"), mode="statistics"):
            _mlp_step(_mlp().to(dev), dev)
    with load_dump(tmp_path / "npu.h5") as d, load_dump(tmp_path / "cpu.h5") as g:
        assert d.attrs["backend"] == "npu"
        mine = [r for r in d.records if r.op in ("aten.addmm.default", "aten.mm.default")]
        theirs = [r for r in g.records if r.op in ("aten.addmm.default", "aten.mm.default")]
        assert len(mine) == len(theirs) >= 4
        for a, b in zip(mine, theirs, strict=True):
            sa, sb = a.outputs[0].stats, b.outputs[0].stats
            assert sa["max"] == pytest.approx(sb["max"], rel=1e-5)
            assert sa["l2"] == pytest.approx(sb["l2"], rel=1e-5)


def test_the_statistics_dumps_cpp_path_and_its_fallback_agree_on_cpu_and_on_the_device(
        npu, tmp_path, monkeypatch):
    """The C++ per-tensor path (accuracy/native/stats.cpp): one pass on CPU, the Python
    path's reductions launched from C++ on the device (then the window as before): every row
    of the same step holds the same figures with it and without it (ACCURACY_NATIVE=0's
    Python path), on CPU and on the device."""
    from accuracy.native import fastpath

    if fastpath.load() is None:
        pytest.skip("no C++ toolchain here: the statistics module is not built")
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(fastpath, "_resolved", [None])
        for dev in ("cpu", "npu"):
            torch.manual_seed(0)
            with dumper(str(tmp_path / f"{dev}-{path}.h5"), mode="statistics"):
                _mlp_step(_mlp().to(dev), dev)
    for dev in ("cpu", "npu"):
        with load_dump(tmp_path / f"{dev}-cpp.h5") as a, \
                load_dump(tmp_path / f"{dev}-python.h5") as b:
            rows_a, rows_b = a.tensors, b.tensors
            assert len(rows_a) == len(rows_b) > 20
            for x, y in zip(rows_a, rows_b, strict=True):
                assert (x.address, x.dtype, x.shape) == (y.address, y.dtype, y.shape)
                for key, v in x.stats.items():
                    w = y.stats[key]
                    assert (v != v and w != w) or v == pytest.approx(w, rel=1e-5, abs=1e-6), \
                        (dev, x.address, key)


def _device_tensors():
    base = torch.randn(6, 10)
    base[0, 0], base[1, 1] = float("nan"), float("inf")
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                  torch.float8_e4m3fn, torch.int64, torch.int32, torch.int16, torch.int8,
                  torch.uint8, torch.bool):
        t = base.nan_to_num(0.0, 7.0, -7.0) if not dtype.is_floating_point else base
        t = (t * 3).to(dtype) if dtype is not torch.bool else t > 0
        yield dtype, t, "contiguous"
        yield dtype, t.t(), "transposed"
        yield dtype, t[:, ::2], "strided"
        yield dtype, t[:0], "empty"


def test_the_cpp_device_figures_are_the_python_paths(npu):
    """On the device the C++ path launches the Python path's reductions from one call (on a
    GPU the Python calls, not the kernels, were the dump's time: 577 us an op on an H200):
    the same figures, still on the device, for every dtype the dumper records, transposed,
    strided, empty, NaN and inf."""
    from accuracy.dumpfile.stats import python_tensor_stats
    from accuracy.native import fastpath

    ext = fastpath.load()
    if ext is None:
        pytest.skip("no C++ toolchain here: the statistics module is not built")

    def host(stats):
        floats, checksum = stats
        if isinstance(floats, torch.Tensor):
            assert floats.device.type == "npu"  # fetched by the window, not per tensor
            floats = floats.cpu().tolist()
        return [float(v) for v in floats], int(checksum)

    for dtype, t, layout in _device_tensors():
        d = t.to("npu")
        for sums in (True, False):
            (got, cg), (want, cw) = host(ext.stats(d, sums)), host(python_tensor_stats(d, sums))
            assert cg == cw, (dtype, layout, sums)
            for g, w in zip(got, want, strict=True):
                assert (g != g and w != w) or g == w, (dtype, layout, got, want)


def test_the_live_check_and_substitute_run_on_the_devices_tensors(npu):
    """The live check re-runs each device op on CPU and names a sim fault on the device;
    substitute runs the chosen op on CPU and sends its result back to the device."""
    from accuracy import live_check, substitute

    fault = sim.fault("aten.gelu.default", kind="bias", value=0.1)
    with sim(profile="exact", faults=[fault]), live_check(on="cpu") as chk:
        _mlp_step(_mlp().npu(), "npu")
    assert [e.op for e in chk.errors()] == ["aten.gelu.default"]
    with sim(profile="exact", faults=[fault]), substitute(ops="aten.gelu", on="cpu"):
        loss = _mlp_step(_mlp().npu(), "npu")
    clean = _mlp_step(_mlp(), "cpu")
    assert loss.device.type == "npu" and torch.equal(loss.cpu(), clean.detach())


def test_precision_debugger_with_an_msprobe_config_records_the_device_step(npu, in_tmp):
    import json

    from accuracy import PrecisionDebugger

    cfg = {"task": "statistics", "dump_path": "./dump_path", "rank": [], "step": [1],
           "level": "L1"}
    with open("config.json", "w") as f:
        json.dump(cfg, f)
    model = _mlp().npu()
    opt = torch.optim.AdamW(model.parameters())
    debugger = PrecisionDebugger(config_path="./config.json")
    for _ in range(2):
        debugger.start(model)
        _mlp_step(model, "npu")
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    with load_dump("dump_path/step1/rank0/dump.h5") as d:
        assert d.attrs["backend"] == "npu"
        assert {r.phase for r in d.records} == {"forward", "backward", "optimizer"}


def test_a_compiled_model_on_the_device_is_recorded_and_compared(npu, tmp_path):
    """`torch.compile` with a backend that runs ATen ops (aot_eager) is recorded op by op on
    the device as on CPU and compares clean. Inductor has no backend for this device (nor
    for any vendor's until it registers one): torch.compile's default raises on npu tensors
    itself, with or without a dumper, so no compiled region runs eager unsaid."""
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    for dev in ("cpu", "npu"):
        torch._dynamo.reset()
        model = torch.compile(_mlp().to(dev), backend="aot_eager")
        with dumper(str(tmp_path / f"{dev}.h5")):
            torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev)).backward()
        with load_dump(tmp_path / f"{dev}.h5") as d:
            (region,) = d.attrs["compiled_regions"]
            assert region["status"] == "recorded-compiled", region
    rep = compare(tmp_path / "npu.h5", tmp_path / "cpu.h5")
    assert rep.summary["counts"]["error"] == 0 and not rep.summary.get("blind")
    torch._dynamo.reset()


def test_the_live_check_judges_a_grus_fused_cells_on_the_device(npu):
    """Off CPU a GRU runs CUDA's fused cell (`_thnn_fused_gru_cell`, no CPU kernel): its
    forward and backward are judged against the CPU reference, whose workspace layout is
    CUDA's (the test device keeps it so too: the backward reads it), none skipped."""
    from accuracy import live_check
    from accuracy.replay.rnn import thnn_fused_gru_cell

    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 6, batch_first=True).npu()
    x = torch.randn(2, 5, 4).npu()
    with live_check(on="cpu") as chk:
        out, _ = gru(x)
        out.square().mean().backward()
    cells = [r for r in chk.results if "_thnn_fused_gru_cell" in r.op]
    assert {r.op for r in cells} == {"aten._thnn_fused_gru_cell.default",
                                     "aten._thnn_fused_gru_cell_backward.default"}
    assert len(cells) == 10 and all(r.verdict == "pass" for r in cells), [
        (r.op, r.status, r.reason) for r in cells if r.verdict != "pass"]
    ig, hg, hx = torch.randn(3, 18), torch.randn(3, 18), torch.randn(3, 6)
    hy, ws = torch.ops.aten._thnn_fused_gru_cell(ig.npu(), hg.npu(), hx.npu())
    want = thnn_fused_gru_cell(ig, hg, hx)
    torch.testing.assert_close(hy.cpu(), want[0])
    torch.testing.assert_close(ws.cpu(), want[1])  # the same layout
