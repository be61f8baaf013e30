"""The monitor over steps: series, triggers, snapshots and capture of the flagged step."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import accuracy.monitor as am
from accuracy import load_dump
from accuracy.device_backend import sim
from accuracy.errors import UsageError
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.monitor.capture import same_bits
from accuracy.monitor.triggers import GradNormJump, LossSpike, NonFinite, StepFigures

ROOT = Path(__file__).resolve().parents[2]


def _setup(seed: int = 0):
    model = tiny_lm(seed=seed, layers=2, d_model=32, ff=64, vocab=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(x, y):
        opt.zero_grad()
        loss = lm_step(model, (x, y))
        opt.step()
        return loss

    return model, opt, train_step


def _batch(i: int):
    return lm_batch(seed=i, batch=2, seq=16, vocab=64)


def test_fault_at_step_23_is_seen_captured_reproduced_and_named(tmp_path):
    model, opt, train_step = _setup()
    fault = sim.fault("aten.addmm.default", module="head", kind="bias", value=30.0,
                      start=23, stop=24)
    path = tmp_path / "run.monitor.h5"
    with sim(faults=[fault]):
        train_step = am.watch(train_step, model, opt, path=path)  # the one added call
        losses = [train_step(*_batch(i)).item() for i in range(40)]
    mon = train_step.monitor
    mon.close()
    assert max(range(40), key=losses.__getitem__) == 23
    # the series shows it in the right layer and step
    s = am.read_series(path)
    assert list(s.step) == list(range(40))
    names, act = s.figure("module", "act_norm")
    ran = np.isfinite(act[:23]).all(axis=0)  # modules that ran (MHA's out_proj does not)
    jump = act[23, ran] / np.median(act[:23, ran], axis=0)
    jumped = {n for n, j in zip(np.array(names)[ran], jump, strict=True) if j > 5}
    assert jumped == {"head", "(root)"}  # the root's output is the head's
    assert int(np.nanargmax(act[:, names.index("head")])) == 23
    # the trigger captured step 23 by re-running it from a snapshot, bit for bit
    assert [c.step for c in mon.captures] == [23]
    cap = mon.captures[0]
    assert cap.snapshot_step == 20
    assert cap.exact is True and same_bits(cap.rerun_loss, losses[23])
    assert "bit for bit" in cap.format()
    # and the report names the faulted op
    assert cap.culprit["op"] == "aten.addmm.default"
    assert cap.culprit["module"].endswith("head")
    assert (Path(cap.folder) / "report").is_dir()
    assert "CULPRIT: aten.addmm.default" in (Path(cap.folder) / "capture.txt").read_text()
    for name in ("device.h5", "reference.h5"):  # the re-run's ops carry the step they re-ran
        with load_dump(Path(cap.folder) / name) as d:
            assert {r.step for r in d.records} == {23}
    kinds = [e["kind"] for e in s.events]
    assert kinds == ["trigger", "capture"] and s.events[0]["step"] == 23
    # training carried on from its own state, not the re-run's: later steps are healthy
    assert max(losses[24:]) < 2 * np.median(losses[:23])


def test_nan_from_the_start_captures_once_and_says_so(tmp_path, caplog):
    caplog.set_level("INFO", logger="accuracy.monitor")
    model, opt, train_step = _setup()
    fault = sim.fault("aten.addmm.default", module="head", kind="nan", start=0)
    path = tmp_path / "nan.monitor.h5"
    with sim(faults=[fault]):
        step = am.watch(train_step, model, opt, path=path, snapshot_every=2)
        for i in range(5):
            step(*_batch(i))
    mon = step.monitor
    mon.close()
    assert [c.step for c in mon.captures] == [0]
    assert [f[0] for f in mon.fired] == [0, 1, 2, 3, 4]
    s = am.read_series(path)
    once = [e for e in s.events if e["kind"] == "capture-once"]
    assert len(once) == 1 and "captured once, step 0" in once[0]["message"]
    flagged = [r for r in caplog.records if " flagged: " in r.getMessage()]
    assert [r.levelname for r in flagged] == ["WARNING", "WARNING", "INFO", "INFO", "INFO"], [
        (r.levelname, r.getMessage()[:80]) for r in flagged]
    cap = mon.captures[0]
    assert "non-finite" in cap.reason and math.isnan(cap.flagged_loss)
    assert cap.exact is True  # NaN again on the re-run
    assert cap.culprit["op"] == "aten.addmm.default" and cap.culprit["module"].endswith("head")


def test_nan_from_the_start_without_snapshots_never_claims_a_capture(tmp_path):
    model, opt, train_step = _setup()
    fault = sim.fault("aten.addmm.default", module="head", kind="nan", start=0)
    path = tmp_path / "off.monitor.h5"
    with sim(faults=[fault]):
        step = am.watch(train_step, model, opt, path=path, snapshot_every=None)
        for i in range(3):
            step(*_batch(i))
    step.monitor.close()
    assert step.monitor.captures == []
    events = am.read_series(path).events
    assert [e["kind"] for e in events if "capture" in e["kind"]] == ["not-captured",
                                                                     "capture-once"]
    once = next(e for e in events if e["kind"] == "capture-once")["message"]
    assert "step 0 was not captured" in once and "captured once" not in once


def test_a_step_whose_values_overflow_on_plain_torch_names_where_inf_is_born(tmp_path):
    """No emulated device, every kernel honest: the batch of step 5 is huge (finite), squaring
    the prediction overflows and the loss goes inf. The capture names that op, not 'no
    culprit'."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    step = am.watch(train_step, model, opt, path=tmp_path / "ovf.monitor.h5", snapshot_every=4)
    for i in range(7):
        step(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) * (1e36 if i == 5
                                                                                else 1.0))
    step.monitor.close()
    cap = step.monitor.captures[0]
    assert cap.step == 5 and cap.exact is True
    assert cap.culprit["op"] == "aten.pow.Tensor_Scalar" and cap.culprit["phase"] == "forward"
    assert cap.culprit["verdict"] == "overflow birth"
    text = cap.format()
    assert "inf/nan born at aten.pow.Tensor_Scalar" in text and "no culprit found" not in text


def test_a_step_that_is_not_reproducible_is_reported_as_such(tmp_path):
    model, opt, train_step = _setup()
    private = torch.Generator().manual_seed(5)  # a generator snapshots cannot see

    def noisy_step(x, y):
        opt.zero_grad()
        loss = lm_step(model, (x, y)) + torch.rand((), generator=private)
        opt.step()
        return loss

    step = am.watch(noisy_step, model, opt, path=tmp_path / "nd.monitor.h5",
                    triggers=[lambda s: s.step == 6])
    for i in range(8):
        step(*_batch(i))
    step.monitor.close()
    cap = step.monitor.captures[0]
    assert cap.exact is False
    assert "NOT THE SAME STEP" in cap.format() and "not reproducible" in cap.format()


def test_a_step_without_its_batch_cannot_be_rerun(tmp_path):
    model, opt, train_step = _setup()
    data = iter([_batch(i) for i in range(6)])

    def loader_step():
        return train_step(*next(data))

    step = am.watch(loader_step, model, opt, path=tmp_path / "nb.monitor.h5",
                    triggers=[lambda s: s.step == 4])
    for _ in range(6):
        step()
    step.monitor.close()
    cap = step.monitor.captures[0]
    assert cap.exact is None and cap.folder is None
    assert "cannot be re-run exactly" in cap.format()


def test_a_budget_too_small_for_one_snapshot_is_refused_with_the_size(tmp_path):
    model, opt, _ = _setup()
    need = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    with pytest.raises(am.SnapshotBudgetError, match=f"at least {need} bytes"):
        am.Monitor(model, opt, path=tmp_path / "b.monitor.h5", snapshot_budget=1000)
    assert not (tmp_path / "b.monitor.h5").exists()
    am.Monitor(model, opt, path=tmp_path / "ok.monitor.h5", snapshot_budget=need * 8).close()


def test_a_monitor_file_from_a_killed_job_stays_readable(tmp_path):
    path = tmp_path / "killed.monitor.h5"
    code = textwrap.dedent(f"""
        import os, signal, torch
        import accuracy.monitor as am
        from accuracy.examples import lm_batch, lm_step, tiny_lm
        model = tiny_lm(layers=1, d_model=16, ff=32, vocab=32)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(x, y):
            opt.zero_grad(); loss = lm_step(model, (x, y)); opt.step(); return loss
        step = am.watch(step, model, opt, path={str(path)!r}, snapshot_every=None,
                        flush_every=1)  # every row at once (the default batches them)
        for i in range(5):
            step(*lm_batch(seed=i, batch=2, seq=8, vocab=32))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    s = am.read_series(path)
    assert list(s.step) == [0, 1, 2, 3, 4]
    assert s.attrs["complete"] is False or s.attrs["complete"] == 0
    assert np.isfinite(s.param["grad_norm"]).all() and np.isfinite(s.loss).all()


def test_monitor_events_go_to_the_file_without_the_hdf5_heap(tmp_path):
    """Events (triggers, captures) are written while the file is live (SWMR): not as HDF5
    strings, whose heap grows in place unordered, so a kill right after a trigger (when jobs
    die) cannot leave the heap, and the file's events, unreadable."""
    from accuracy.monitor.series import SeriesWriter, read_series
    from tests._support.crafted import heap_collections

    path = tmp_path / "ev.monitor.h5"
    w = SeriesWriter(path)
    row = {"step": 0, "loss": 1.0, "grad_norm": 2.0, "module_names": ["m"],
           "param_names": ["p"], "module": {}, "param": {}, "state": {}}
    w.append(row)
    before = heap_collections(path)
    for i in range(300):
        w.event("trigger", i, why="loss spike " + "x" * 200, rule={"name": "LossSpike"})
    w.flush()
    assert heap_collections(path) == before
    w.close()
    s = read_series(path)
    assert [e["step"] for e in s.events] == list(range(300))
    assert s.events[5]["rule"] == {"name": "LossSpike"}


def test_a_module_name_utf8_cannot_hold_still_gives_a_series(tmp_path):
    """A lone surrogate in a module name (a ModuleDict key decoded with surrogateescape) once
    failed the file's creation at every step: no series at all."""
    from accuracy.monitor.series import SeriesWriter, read_series

    path = tmp_path / "names.monitor.h5"
    w = SeriesWriter(path, attrs={"model": "Net\udc80"})
    w.append({"step": 0, "loss": 1.0, "grad_norm": 2.0, "module_names": ["sur\udc80x", "層_0"],
              "param_names": ["p"], "module": {}, "param": {}, "state": {}})
    w.close()
    s = read_series(path)
    assert s.module_names == ["sur\\udc80x", "層_0"] and list(s.step) == [0]


def test_figures_match_direct_computation(tmp_path):
    model, opt, train_step = _setup()
    step = am.watch(train_step, model, opt, path=tmp_path / "f.monitor.h5", freq=2,
                    detail_every=1, snapshot_every=None)
    for i in range(3):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        step(*_batch(i))
    step.monitor.close()
    s = am.read_series(tmp_path / "f.monitor.h5")
    assert list(s.step) == [0, 2]  # every freq steps
    names = s.param_names
    w = dict(model.named_parameters())
    i = names.index("head.weight")
    assert s.param["norm"][1, i] == pytest.approx(float(w["head.weight"].norm()), rel=1e-6)
    assert s.param["grad_norm"][1, i] == pytest.approx(float(w["head.weight"].grad.norm()),
                                                       rel=1e-6)
    upd = float((w["head.weight"] - before["head.weight"]).norm() / w["head.weight"].norm())
    assert s.param["update_ratio"][1, i] == pytest.approx(upd, rel=1e-5)
    st = opt.state[w["head.weight"]]
    assert s.state["exp_avg"][1, i] == pytest.approx(float(st["exp_avg"].norm()), rel=1e-6)
    total = math.sqrt(sum(float(p.grad.norm()) ** 2 for p in model.parameters()))
    assert s.grad_norm[1] == pytest.approx(total, rel=1e-6)
    assert np.nansum(s.module["act_nan"][1]) == 0
    assert np.isfinite(s.module["act_norm"][1]).sum() > 10


def test_every_step_has_loss_gradients_and_activations_parameters_every_tenth(tmp_path):
    """The default cadence (docs/monitor.md): the figures triggers and the heat map read are
    there every step; the parameters' norms, update ratios and optimizer state every 10 steps,
    true where measured and NaN (not measured, a gap in the plot) between."""
    from accuracy.monitor.plot import series_data

    model, opt, train_step = _setup()
    step = am.watch(train_step, model, opt, path=tmp_path / "c.monitor.h5",
                    snapshot_every=None)
    w = dict(model.named_parameters())
    for i in range(21):
        before = w["head.weight"].detach().clone()
        step(*_batch(i))
        if i == 20:
            after = w["head.weight"].detach()
            upd = float((after - before).norm() / after.norm())
    step.monitor.close()
    s = am.read_series(tmp_path / "c.monitor.h5")
    assert list(s.step) == list(range(21))
    assert np.isfinite(s.loss).all() and np.isfinite(s.grad_norm).all()
    assert np.isfinite(s.param["grad_norm"]).all()
    assert np.isfinite(s.module["act_norm"]).any(axis=1).all()
    detail = np.array([st % 10 == 0 for st in s.step])
    for table, fig in ((s.param, "norm"), (s.param, "update_ratio"), (s.param, "state_norm"),
                       (s.state, "exp_avg"), (s.state, "exp_avg_sq")):
        assert np.isfinite(table[fig][detail]).all(), fig
        assert np.isnan(table[fig][~detail]).all(), fig
    i = s.param_names.index("head.weight")
    assert s.param["update_ratio"][20, i] == pytest.approx(upd, rel=1e-5)
    assert s.param["norm"][20, i] == pytest.approx(float(w["head.weight"].norm()), rel=1e-6)
    assert s.state["exp_avg"][20, i] == pytest.approx(
        float(opt.state[w["head.weight"]]["exp_avg"].norm()), rel=1e-6)
    # the page draws the steps between as not measured, never as a value
    ratios = series_data(s)["figures"]["param/update_ratio"]["values"]
    assert all(v is None for row, d in zip(ratios, detail, strict=True) if not d for v in row)
    assert all(isinstance(v, float) for v in ratios[10])


def test_a_run_that_starts_between_detail_steps_keeps_the_optimizer_state_columns(tmp_path):
    """The file's columns are made from its first row: a resumed run's first row (step 15)
    measures no optimizer state, and its state columns must still be there for step 20's."""
    model, opt, train_step = _setup()
    train_step(*_batch(0))  # the optimizer has state, as a resumed one does
    step = am.watch(train_step, model, opt, path=tmp_path / "r.monitor.h5", start_step=15,
                    snapshot_every=None)
    for i in range(7):
        step(*_batch(i))
    step.monitor.close()
    s = am.read_series(tmp_path / "r.monitor.h5")
    assert list(s.step) == list(range(15, 22))
    assert set(s.state) == {"exp_avg", "exp_avg_sq"}
    assert np.isnan(s.state["exp_avg"][0]).all() and np.isfinite(s.state["exp_avg"][5]).all()


def test_the_start_line_says_what_is_measured_when_and_what_a_kill_loses(tmp_path, caplog):
    caplog.set_level("INFO", logger="accuracy.monitor")
    model, opt, _ = _setup()
    am.Monitor(model, opt, path=tmp_path / "a.monitor.h5").close()
    am.Monitor(model, opt, path=tmp_path / "b.monitor.h5", detail_every=1, flush_every=1,
               snapshot_every=None).close()
    said = [r.getMessage() for r in caplog.records if "monitor: writing" in r.getMessage()]
    assert len(said) == 2
    assert "every step the loss, the global gradient norm" in said[0]
    assert "every 10 steps also the parameter norms, update ratios and optimizer state" \
        in said[0] and "detail_every=1: every step" in said[0]
    assert "batches (50 rows or 1 s)" in said[0] and "kill -9 loses the rows waiting" in said[0]
    assert "every recorded step also the parameter norms" in said[1]
    assert "rows written each at once" in said[1] and "no snapshots" in said[1]


def test_the_every_step_setting_measures_everything_every_step(tmp_path):
    model, opt, train_step = _setup()
    step = am.watch(train_step, model, opt, path=tmp_path / "e.monitor.h5", detail_every=1,
                    snapshot_every=None)
    for i in range(3):
        step(*_batch(i))
    step.monitor.close()
    s = am.read_series(tmp_path / "e.monitor.h5")
    assert np.isfinite(s.param["update_ratio"]).all() and np.isfinite(s.state["exp_avg"]).all()


@pytest.mark.parametrize("bad", [{"detail_every": 0}, {"flush_every": 0},
                                 {"flush_seconds": -1}, {"detail_every": 2.5}])
def test_a_cadence_that_is_not_a_count_is_refused(tmp_path, bad):
    model, opt, _ = _setup()
    with pytest.raises(UsageError, match=next(iter(bad))):
        am.Monitor(model, opt, path=tmp_path / "x.monitor.h5", **bad)
    assert not (tmp_path / "x.monitor.h5").exists()


def test_gradients_zeroed_in_place_after_the_optimizer_step_are_still_measured(tmp_path):
    model, opt, _ = _setup()

    def train_step(x, y):
        loss = lm_step(model, (x, y))
        opt.step()
        opt.zero_grad(set_to_none=False)  # the grads are zeros by the step's end
        return loss

    step = am.watch(train_step, model, opt, path=tmp_path / "z.monitor.h5", snapshot_every=None)
    step(*_batch(0))
    step.monitor.close()
    s = am.read_series(tmp_path / "z.monitor.h5")
    assert s.grad_norm[0] > 0 and (s.param["grad_norm"][0] > 0).any()


def test_a_step_without_a_loss_is_not_a_non_finite_loss():
    assert NonFinite().check(StepFigures(3, math.nan, 1.0, {}, loss_known=False)) is None
    assert "loss is nan" in NonFinite().check(StepFigures(3, math.nan, 1.0, {}))
    assert "gradient norm" in NonFinite().check(StepFigures(3, math.nan, math.inf, {},
                                                            loss_known=False))


def test_spike_trigger_quiet_on_noise_fires_on_a_spike():
    t = LossSpike()
    rng = np.random.default_rng(0)
    quiet = [t.check(StepFigures(i, 5.0 + 0.05 * rng.standard_normal())) for i in range(50)]
    assert not any(quiet)
    assert t.check(StepFigures(50, 9.0)) is not None
    assert t.check(StepFigures(51, 5.2)) is None  # the spike did not enter the window


def test_repeated_spikes_do_not_hide_each_other():
    t = LossSpike(window=5, warmup=3)
    assert [t.check(StepFigures(i, 1.0)) for i in range(5)] == [None] * 5
    assert all(t.check(StepFigures(5 + i, 10.0)) for i in range(4))


def test_spike_trigger_is_quiet_during_warmup():
    t = LossSpike(warmup=5)
    assert [t.check(StepFigures(i, v)) for i, v in enumerate([1, 1, 1, 1, 50.0])] == [None] * 5


def test_non_finite_trigger():
    t = NonFinite()
    assert t.check(StepFigures(0, 1.0, 2.0, {})) is None
    assert "loss is nan" in t.check(StepFigures(1, math.nan))
    assert "loss is inf" in t.check(StepFigures(1, math.inf))
    assert "gradient norm" in t.check(StepFigures(2, 1.0, math.inf, {}))


def test_grad_norm_jump_trigger():
    t = GradNormJump(factor=10.0)
    assert not any(t.check(StepFigures(i, 1.0, 1.0 + 0.1 * (i % 3), {})) for i in range(10))
    assert t.check(StepFigures(10, 1.0, 50.0, {})) is not None


def test_same_bits_is_bitwise():
    assert same_bits(1.0, 1.0) and same_bits(math.nan, math.nan)
    assert not same_bits(1.0, math.nextafter(1.0, 2.0))
    assert not same_bits(0.0, -0.0)


def test_sim_fault_window_and_state():
    f = sim.fault("aten.mul.Tensor", kind="bias", value=1.0, start=2, stop=4)
    x = torch.ones(2)
    with sim(faults=[f]) as dev:
        outs = [float((x * 1)[0]) for _ in range(6)]
        saved = dev.state()
        dev.set_state({"calls": 0, "occurrences": [2]})
        again = float((x * 1)[0])
        dev.set_state(saved)
    assert outs == [1.0, 1.0, 2.0, 2.0, 1.0, 1.0] and again == 2.0
    with pytest.raises(ValueError, match="stop"):
        sim.fault("aten.mul.Tensor", kind="bias", value=1.0, start=4, stop=4)


@pytest.mark.parametrize("path", ["native", "torch"])
def test_the_monitor_is_invisible_to_a_dumper_and_to_sim(tmp_path, monkeypatch, path):
    """Both paths of the figures: the native pass (fp32/fp64 on CPU) and torch's reductions
    (every tensor where the kernels are not built, 16-bit ones always)."""
    from accuracy import native
    from accuracy.dumper import dumper
    from accuracy.dumpfile import load_dump

    if path == "torch":
        monkeypatch.setattr(native, "_resolved", [None])

    counts = []
    for monitored in (False, True):
        model, opt, train_step = _setup()
        step = am.watch(train_step, model, opt, path=tmp_path / f"m{monitored}.monitor.h5",
                        snapshot_every=None) if monitored else train_step
        norm_fault = sim.fault("aten.linalg_vector_norm.default", kind="bias", value=1.0)
        with sim(faults=[norm_fault]) as dev, dumper(tmp_path / f"d{monitored}.h5"):
            step(*_batch(0))
        with load_dump(tmp_path / f"d{monitored}.h5") as d:
            counts.append((len(d.records), dev.calls, len(dev.applied)))
    assert counts[0] == counts[1]  # same ops dumped, same device calls, no fault on our norms


def test_a_sharded_parameter_counts_its_own_shard_in_the_snapshot_budget():
    """FSDP2 and tensor parallel hold DTensors whose global size is the world's: a snapshot
    copies this rank's shard, and the budget counts that (the global size refused budgets
    that held the snapshot, by the world size)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    from accuracy.monitor.snapshots import _nbytes

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        local = torch.ones(4, 8)
        # declared as this rank's quarter of a (16, 8) tensor, as on the first of four ranks
        sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                     shape=torch.Size([16, 8]), stride=(8, 1))
        assert sharded.numel() == 128
        assert _nbytes({"w": sharded, "b": torch.ones(3)}) == (32 + 3) * 4
    finally:
        dist.destroy_process_group()


def test_a_monitor_takes_the_cpp_figures_without_waiting_for_them(tmp_path):
    """A monitor starts the C++ module's load on a thread of its own (its figures take it once
    loaded, the C kernels until then): in a fresh process nobody else asks for it, and after
    a few steps the figures come from it. A fresh process, so that no other test loaded it."""
    from accuracy.native import fastpath

    if fastpath.load() is None:  # built into the cache here, loaded from it there
        pytest.skip("no C++ toolchain: the statistics module is not built")
    code = textwrap.dedent(f"""
        import time, torch
        import accuracy.monitor as am
        from accuracy.native import fastpath
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(x):
            opt.zero_grad(); loss = model(x).square().mean(); loss.backward(); opt.step()
            return loss
        mon = am.watch(step, model, opt, path={str(tmp_path / "m.monitor.h5")!r},
                       triggers=None, snapshot_every=None)  # no capture: no dumper loads it
        for _ in range(300):
            mon(torch.randn(4, 8))
            if fastpath.loaded() is not None:
                break
            time.sleep(0.05)
        mon.monitor.close()
        print("LOADED", fastpath.loaded() is not None)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LOADED True" in out.stdout


def test_a_first_build_of_the_c_kernels_never_stalls_a_step(tmp_path):
    """On a machine with no cached build the monitor's steps run while the C kernels build
    (torch's path meanwhile, the same figures), and take them once built. Before, the first
    step built them itself: a step stalled for the compile (0.27 s measured on a tiny Qwen2).
    The C compiler here waits until the steps have run (at most 20 s); a fresh process with an
    empty cache, no C++ module (CXX=false), so that the C kernels are what is built."""
    from accuracy import native

    if native.kernels() is None:
        pytest.skip("no C compiler: the C kernels are not built")
    go, cc = tmp_path / "go", tmp_path / "slow-cc"
    cc.write_text(f"#!/bin/sh\nfor i in $(seq 400); do [ -e {go} ] && break; sleep 0.05; done\n"
                  f"exec {native._compiler()[0]} \"$@\"\n")
    cc.chmod(0o755)
    code = textwrap.dedent(f"""
        import math, pathlib, time, torch
        import accuracy.monitor as am
        from accuracy import native
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        want = []
        model[0].register_forward_hook(lambda m, i, o: want.append(float(o.double().norm())))
        def step(x):
            opt.zero_grad(); loss = model(x).square().mean(); loss.backward(); opt.step()
            return loss
        path = {str(tmp_path / "m.monitor.h5")!r}
        mon = am.watch(step, model, opt, path=path, triggers=None, snapshot_every=None)
        for _ in range(3):
            mon(torch.randn(4, 8))
        cache = pathlib.Path({str(tmp_path / "cache")!r})
        print("BUILT DURING THE STEPS", any(cache.glob("kernels-*.so")))
        pathlib.Path({str(go)!r}).touch()
        for _ in range(600):
            if native._resolved:
                break
            time.sleep(0.05)
        print("LOADED AFTER", native._resolved[0] is not None)
        for _ in range(3):
            mon(torch.randn(4, 8))
        mon.monitor.close()
        got = am.read_series(path).figure("module", "act_norm")
        col = got[0].index("0")
        print("WORST", max(abs(g - w) / w for g, w in zip(got[1][:, col], want, strict=True)))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ACCURACY_CACHE_DIR": str(tmp_path / "cache"),
           "CC": str(cc), "CXX": "false"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False, env=env, start_new_session=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BUILT DURING THE STEPS False" in out.stdout, out.stdout
    assert "LOADED AFTER True" in out.stdout, out.stdout + out.stderr[-2000:]
    worst = float(out.stdout.split("WORST ")[1].split()[0])
    assert worst < 1e-6, out.stdout
