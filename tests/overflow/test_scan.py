"""Overflow detection: births vs inherited, online and offline, GradScaler, confirmation."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from accuracy.cli import main
from accuracy.dumper.core import dumper
from accuracy.dumper.overflow_watch import OverflowChecker
from accuracy.dumpfile import load_dump
from accuracy.overflow import HANDLED, OverflowDetected, OverflowWarning, scan
from accuracy.overflow.confirm import KERNEL, OUT_OF_RANGE

pytestmark = pytest.mark.filterwarnings("ignore::accuracy.overflow.OverflowWarning")


def _chain() -> torch.Tensor:
    """fp16 matmul that overflows, then three ops that only carry the inf onward."""
    x = torch.full((4, 8), 300.0, dtype=torch.float16)
    w = torch.full((8, 4), 300.0, dtype=torch.float16)
    y = x @ w  # 8 * 90000 > 65504: inf born here
    z = torch.relu(y + 1)
    return z.sum()


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def test_online_records_only_the_birth(tmp_path):
    path = tmp_path / "ovf.h5"
    with pytest.warns(OverflowWarning, match="aten.mm.default"):
        with dumper(path, check_overflow=True, overflow_nums=-1):
            out = _chain()
    assert torch.isinf(out)
    with load_dump(path) as d:
        recs = d.records
        assert [r.op for r in recs] == ["aten.mm.default"]
        r = recs[0]
        assert r.source.endswith(f"test_scan.py:{_line_of(_chain, 'x @ w')}")
        assert r.extra["overflow"]["born"] is True
        assert r.outputs[0].stats["inf_count"] == 16
        assert all(t.stats["inf_count"] == 0 for t in r.inputs)
        assert torch.isinf(r.outputs[0].load()).all()  # tensors are in the dump
        summary = d.attrs["overflow"]
        assert summary["ops_checked"] >= 4 and len(summary["events"]) == 1


@pytest.mark.parametrize("mode", ["tensor", "statistics"])
def test_offline_scan_births_vs_inherited(tmp_path, mode):
    path = tmp_path / f"{mode}.h5"
    with dumper(path, mode=mode):
        _chain()
    rep = scan(path)
    assert [b.op for b in rep.births] == ["aten.mm.default"]
    inherited = [f.op for f in rep.inherited]
    assert "aten.add.Tensor" in inherited and "aten.relu.default" in inherited
    assert "aten.sum.default" in inherited
    assert not rep.online and rep.births[0].outputs[0]["inf"] == 16
    assert "born here (1" in rep.format()


class _Proj(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64, bias=False).half()
        nn.init.constant_(self.fc.weight, 40.0)

    def forward(self, x):
        return self.fc(x) * 0.5  # the multiply only inherits


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = _Proj()

    def forward(self, x):
        return self.proj(x)


def test_real_fp16_linear_overflow_module_and_phase(tmp_path):
    net = _Net()
    x = torch.full((2, 64), 30.0, dtype=torch.float16)  # 64 * 30 * 40 = 76800 > 65504
    path = tmp_path / "lin.h5"
    with dumper(path, check_overflow=True):
        y = net(x)
    assert torch.isinf(y).all()
    rep = scan(path)
    assert len(rep.births) == 1
    b = rep.births[0]
    assert b.op == "aten.mm.default" and b.module == "_Net.proj.fc" and b.phase == "forward"
    assert b.source.endswith(f"test_scan.py:{_line_of(_Proj.forward, 'self.fc(x)')}")


def _three_births() -> None:
    a = torch.log(torch.tensor([-1.0]))  # nan
    b = torch.tensor([1e30]) * torch.tensor([1e30])  # inf
    c = torch.tensor([0.0]) / torch.tensor([0.0])  # nan
    return a, b, c


@pytest.mark.parametrize("nums,expected", [(1, 1), (2, 2), (-1, 3)])
def test_overflow_nums(tmp_path, nums, expected):
    path = tmp_path / "n.h5"
    with dumper(path, check_overflow=True, overflow_nums=nums):
        _three_births()
    with load_dump(path) as d:
        assert len(d.records) == expected
        assert d.attrs["overflow"]["stopped_early"] is (nums != -1)


def test_raise_at_first_with_user_line(tmp_path):
    path = tmp_path / "r.h5"
    with pytest.raises(OverflowDetected) as ei:
        with dumper(path, check_overflow=True, overflow_raise=True):
            _chain()
    line = _line_of(_chain, "x @ w")
    assert ei.value.event.source.endswith(f"test_scan.py:{line}")
    assert f"test_scan.py:{line}" in str(ei.value)
    assert any(e.lineno + 1 == line and e.path.name == "test_scan.py"
               for e in ei.traceback)  # the user's own frame is in the stack
    with load_dump(path) as d:  # readable, marked incomplete, birth recorded
        assert not d.attrs["complete"] and [r.op for r in d.records] == ["aten.mm.default"]


def test_deferred_device_path_matches(tmp_path):
    """The batched (no per-op sync) path used off-CPU finds the same births."""
    path = tmp_path / "defer.h5"
    d = dumper(path, check_overflow=True, overflow_nums=-1)
    d._overflow = OverflowChecker(nums=-1, defer=True, interval=3)
    with d:
        _chain()
        _three_births()
    assert [e.op for e in d._overflow.events] == [
        "aten.mm.default", "aten.log.default", "aten.mul.Tensor", "aten.div.Tensor"]


def test_saturation(tmp_path):
    path = tmp_path / "sat.h5"
    with dumper(path, check_overflow=True, saturation="float16"):
        big = torch.tensor([1.0, 2.0]) * 5e4  # 1e5 in float32 overflows a cast to float16
        big.sum()  # inherited saturation: not reported again
    with dumper(tmp_path / "frac.h5", check_overflow=True, saturation=0.5):
        torch.tensor([1.0], dtype=torch.float16) * 40000  # within half of float16's max
    with load_dump(path) as d:
        assert [r.op for r in d.records] == ["aten.mul.Tensor"]
        assert d.records[0].extra["overflow"]["kind"] == "saturation"
    with load_dump(tmp_path / "frac.h5") as d:
        assert [r.extra["overflow"]["kind"] for r in d.records] == ["saturation"]


def test_gradscaler_checks_labelled_and_skip_handled(tmp_path):
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126)
    except (RuntimeError, AssertionError, TypeError) as e:  # pragma: no cover
        pytest.skip(f"no CPU GradScaler here: {e}")
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    x = torch.randn(4, 8) * 100
    path = tmp_path / "amp.h5"
    with dumper(path, check_overflow=True, overflow_nums=-1):
        loss = model(x).pow(2).sum()  # ~1e5; times 2**126 overflows float32
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert torch.equal(model.weight, before)  # GradScaler skipped the step
    rep = scan(path)
    assert rep.births and all(b.label == HANDLED for b in rep.births)
    assert not rep.culprits
    assert {a.op for a in rep.amp} == {
        "aten._amp_foreach_non_finite_check_and_unscale_.default",
        "aten._amp_update_scale_.default"}
    assert all("_amp_" not in b.op for b in rep.births + rep.inherited)
    assert rep.skipped_steps == [0]
    # a full dump of the same step gives the same labels offline
    full = tmp_path / "amp_full.h5"
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126)
    with dumper(full, mode="statistics"):
        loss = model(x).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    rep2 = scan(full)
    assert rep2.births and not rep2.culprits and rep2.skipped_steps == [0]
    assert all("_amp_" not in b.op for b in rep2.births)


def test_a_forward_overflow_in_a_skipped_step_stays_a_birth(tmp_path):
    """GradScaler skipping the step absorbs its scaled gradients, not the model: an
    activation overflowing in forward is the model's, online and offline."""
    try:
        torch.amp.GradScaler("cpu")
    except (RuntimeError, AssertionError, TypeError) as e:  # pragma: no cover
        pytest.skip(f"no CPU GradScaler here: {e}")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)

    def run(path: Path, **kw) -> Path:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with dumper(path, **kw):
                h = (model[1](model[0](x)) + 2) * 3e38  # the activations overflow, not the scale
                scaler.scale(model[2](h).pow(2).sum()).backward()
                scaler.step(opt)
                scaler.update()
        return path

    for rep in (scan(run(tmp_path / "online.h5", check_overflow=True, overflow_nums=-1)),
                scan(run(tmp_path / "full.h5", mode="statistics"))):
        assert rep.skipped_steps == [0]
        first = rep.births[0]
        assert first.op == "aten.mul.Tensor" and first.phase == "forward"
        assert first.label != HANDLED and rep.culprits[0] is first


def test_confirm_out_of_range(tmp_path):
    path = tmp_path / "c.h5"
    with dumper(path, check_overflow=True):
        _chain()
    rep = scan(path, confirm_on="cpu")
    c = rep.births[0].confirmation
    assert c["same_dtype_overflows"] is True and c["wide_overflows"] is False
    assert c["verdict"].startswith(OUT_OF_RANGE)


def test_sim_inf_fault_is_a_kernel_problem(tmp_path, capsys):
    sim_mod = pytest.importorskip("accuracy.device_backend")
    sim = sim_mod.sim
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 8)
    path = tmp_path / "sim.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sim(faults=[sim.fault("aten.addmm.default", kind="inf", occurrence=1, index=1)]):
            with dumper(path, check_overflow=True):
                model(x).sum()
    rep = scan(path, confirm_on="cpu")
    assert len(rep.births) == 1
    b = rep.births[0]
    assert b.op == "aten.addmm.default" and b.module.endswith(".2")
    assert b.confirmation["verdict"] == KERNEL
    assert main(["overflow", str(path), "--confirm-on", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "born here (1" in out and KERNEL in out
    assert main(["overflow", str(path), "--fail-on-birth"]) == 1


def test_a_birth_without_a_source_warns_at_the_users_line_not_ours():
    """A collective run by DDP's or FSDP's hooks inside `loss.backward()` has no source of its
    own: its OverflowWarning points at the user's innermost frame (here this test), never at
    the dumper's machinery (simulated by a caller compiled as internal code)."""
    from accuracy.dumper import overflow_watch

    internal: dict = {}
    exec(compile("def report(warn):\n    warn('inf born in all_reduce', '')\n",
                 "<accuracy machinery>", "exec"), internal)
    with pytest.warns(OverflowWarning) as record:
        internal["report"](overflow_watch._warn_at_user_line)
    assert record[0].filename == __file__


@torch.library.custom_op("accuracy_test::copy_out", mutates_args=("out",))
def _copy_out(src: torch.Tensor, out: list[torch.Tensor]) -> None:
    """FSDP2's copy-out of all-gathered parameters (`fsdp::split_with_sizes_copy`)."""
    for o in out:
        o.copy_(src.view_as(o))


def test_a_custom_op_writing_a_parameters_memory_leaves_no_stale_value(tmp_path):
    """FSDP2 copies each step's gathered parameters into memory a module parameter views,
    with a custom op under `_unsafe_preserve_version_counter`: no version counter moves, and
    the parameter object keeps its address when the allocator hands the same block back.
    After AdamW left NaN in the shards, the next addmm read them: an inherited NaN, which
    the cached "finite" of the parameter made a false birth (one CI run in five, under
    load). Here the same memory is written on purpose, so every run takes that path."""
    buf = torch.ones(16)
    param = nn.Parameter(buf.view(4, 4), requires_grad=False)  # another object, same memory
    x, nan = torch.ones(2, 4), torch.full((16,), float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dumper(dump_path=tmp_path / "o.h5", check_overflow=True, overflow_nums=-1):
            before = x @ param  # the parameter is probed finite here
            with torch.autograd._unsafe_preserve_version_counter(buf):
                _copy_out(nan, [buf])
            after = x @ param  # kept, as a model's activations are: not a contained birth
    assert param._version == 0 and before.isfinite().all() and after.isnan().all()
    assert scan(tmp_path / "o.h5").births == []  # inherited from the parameter, not born


@pytest.mark.parametrize("mode", ["statistics", "tensor"])
def test_a_dump_the_run_left_incomplete_is_said_so_before_no_birth(tmp_path, mode, capsys):
    """A step stopped by Ctrl-C (or a kill) keeps the ops before it; "no op produced inf/nan"
    over those alone read as a clean step, while the births it would have seen came later."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    model[1].register_forward_hook(interrupt)
    path = tmp_path / "cut.h5"
    with pytest.raises(KeyboardInterrupt), dumper(str(path), mode=mode):
        model(torch.randn(3, 4)).sum().backward()
    rep = scan(path)
    assert rep.complete is False and rep.to_dict()["complete"] is False
    text = rep.format().splitlines()
    assert text[1].startswith("INCOMPLETE:") and "not seen" in text[1]
    assert main(["overflow", str(path)]) == 0
    assert "INCOMPLETE:" in capsys.readouterr().out
    # a CI gate does not pass a step it did not see to its end
    assert main(["overflow", str(path), "--fail-on-birth"]) == 1
    assert "INCOMPLETE:" in capsys.readouterr().out
    whole = tmp_path / "whole.h5"
    with dumper(str(whole), mode=mode):
        nn.Linear(4, 2)(torch.randn(3, 4)).sum().backward()
    assert scan(whole).complete and "INCOMPLETE" not in scan(whole).format()
    assert main(["overflow", str(whole), "--fail-on-birth"]) == 0


def test_a_replay_is_refused_for_the_dump_it_replayed(tmp_path, capsys):
    """`accuracy overflow replay.h5` scanned the reference's figures of an fp16 step whose
    matmul overflowed and printed "no op produced inf/nan from finite inputs"."""
    from accuracy.errors import UsageError
    from accuracy.replay import replay

    dump, rep_path = tmp_path / "run.h5", tmp_path / "replay.h5"
    with dumper(str(dump)):
        _chain()
    assert scan(dump).births
    replay(dump, rep_path)
    with pytest.raises(UsageError, match=r"is a replay of .*run\.h5.*accuracy overflow"):
        scan(rep_path)
    assert main(["overflow", str(rep_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("accuracy overflow: error: ") and "\n" not in err
