"""The dumper records what a user relies on: every op, exact bytes, module paths, safe files."""

import json
import subprocess
import sys

import h5py
import pytest
import torch

from accuracy import DumpError, dumper, load_dump
from accuracy.examples import lm_batch, lm_step, tiny_lm

FLOAT8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
          if d is not None]


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g
                         ).to(dtype)


@pytest.mark.parametrize(
    "dtype",
    [torch.float64, torch.float32, torch.float16, torch.bfloat16, *FLOAT8, torch.int64,
     torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
     torch.complex128],
    ids=str,
)
def test_every_dtype_round_trips_bit_exactly(tmp_path, dtype):
    x = _sample(dtype)
    path = tmp_path / "d.h5"
    with dumper(dump_path=path):
        y = x.clone()
    with load_dump(path) as d:
        (rec,) = d.select(op="aten.clone")
        got_in, got_out = rec.inputs[0].load(), rec.outputs[0].load()
        assert rec.inputs[0].dtype == str(dtype).removeprefix("torch.")
    assert got_in.dtype == dtype and got_out.dtype == dtype
    assert torch.equal(got_in.view(torch.uint8), x.view(torch.uint8))
    assert torch.equal(got_out.view(torch.uint8), y.view(torch.uint8))


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 3)], ids=["0-d", "empty", "zero-size-3d"])
def test_zero_dim_and_zero_size_tensors(tmp_path, shape):
    x = torch.randn(shape) if shape != () else torch.tensor(2.5)
    with dumper(dump_path=tmp_path / "d.h5"):
        x.neg()
    with load_dump(tmp_path / "d.h5") as d:
        (rec,) = d.select(op="aten.neg")
        out = rec.outputs[0].load()
    assert out.shape == x.shape and torch.equal(out, -x)


def test_non_contiguous_tensor_keeps_values_and_records_stride(tmp_path):
    x = torch.arange(24.0).reshape(4, 6).t()  # transposed view: not contiguous
    with dumper(dump_path=tmp_path / "d.h5"):
        x.abs()
    with load_dump(tmp_path / "d.h5") as d:
        (rec,) = d.select(op="aten.abs")
        assert rec.inputs[0].stride == (1, 6)
        assert torch.equal(rec.inputs[0].load(), x)


def test_inplace_op_keeps_pre_op_input(tmp_path):
    x = torch.ones(4)
    with dumper(dump_path=tmp_path / "d.h5"):
        x.add_(5)
        x.mul_(2)
    with load_dump(tmp_path / "d.h5") as d:
        add, mul = d.records
        assert add.op == "aten.add_.Tensor" and add.extra.get("inplace")
        assert torch.equal(add.inputs[0].load(), torch.ones(4))
        assert torch.equal(add.outputs[0].load(), torch.full((4,), 6.0))
        assert torch.equal(mul.inputs[0].load(), torch.full((4,), 6.0))
        assert torch.equal(mul.outputs[0].load(), torch.full((4,), 12.0))


def test_training_step_records_forward_and_backward_with_modules(tmp_path):
    model, batch = tiny_lm(), lm_batch()
    path = tmp_path / "d.h5"
    with dumper(dump_path=path):
        lm_step(model, batch)
    with load_dump(path) as d:
        phases = {r.phase for r in d.records}
        assert phases == {"forward", "backward"}
        ln_bw = [r for r in d.records if r.op == "aten.native_layer_norm_backward.default"]
        assert ln_bw and all(r.module.endswith(("norm1", "norm2", ".norm")) for r in ln_bw)
        emb_bw = [r for r in d.select(op="aten.embedding_dense_backward")]
        assert {r.module for r in emb_bw} == {"TinyTransformerLM.embed", "TinyTransformerLM.pos"}
        # a backward op points to the forward op it differentiates
        fwd = d.record(ln_bw[0].extra["fwd_seq"])
        assert fwd.op == "aten.native_layer_norm.default" and fwd.module == ln_bw[0].module
        assert d.attrs["complete"] and d.attrs["backend"] in ("cpu", "sim")
        # module filters match with or without the root class name
        assert list(d.select(module="encoder.layers.0.*"))
        assert all("layers.0" in r.module for r in d.select(module="encoder.layers.0.*"))


def test_source_line_points_at_user_code(tmp_path):
    x = torch.ones(3)
    with dumper(dump_path=tmp_path / "d.h5"):
        x.exp()  # the recorded line
    with load_dump(tmp_path / "d.h5") as d:
        (rec,) = d.records
    assert rec.source.endswith(f"{__file__}:{rec.source.rsplit(':', 1)[1]}")
    assert "x.exp()" in open(__file__).read().splitlines()[int(rec.source.rsplit(":", 1)[1]) - 1]


def test_repeated_tensor_is_stored_once_and_linked(tmp_path):
    w = torch.randn(256, 256)
    xs = [torch.randn(4, 256) for _ in range(5)]
    with dumper(dump_path=tmp_path / "d.h5"):
        for x in xs:
            x @ w
    with load_dump(tmp_path / "d.h5") as d:
        w_uses = [r.inputs[1] for r in d.records]
        assert sum(not t.is_link for t in w_uses) == 1
        assert all(torch.equal(t.load(), w) for t in w_uses)
        s = d.summary()
    assert s["bytes_saved_by_links"] >= 4 * w.numel() * 4
    assert s["bytes_written"] < 2 * w.numel() * 4


def test_changed_tensor_is_stored_again(tmp_path):
    x = torch.zeros(3)
    with dumper(dump_path=tmp_path / "d.h5"):
        x.sin()
        x.add_(1)
        x.sin()
    with load_dump(tmp_path / "d.h5") as d:
        first, _, second = d.records
        assert torch.equal(first.inputs[0].load(), torch.zeros(3))
        assert torch.equal(second.inputs[0].load(), torch.ones(3))


def test_statistics_mode_stores_statistics_only(tmp_path):
    x = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    with dumper(dump_path=tmp_path / "d.h5", mode="statistics"):
        x * 2
    with load_dump(tmp_path / "d.h5") as d:
        (rec,) = d.records
        st = rec.outputs[0].stats
        assert st["nan_count"] == 1 and st["inf_count"] == 1
        assert not rec.outputs[0].has_data
        with pytest.raises(DumpError, match="statistics only"):
            rec.outputs[0].load()
        y = torch.tensor([1.0, -2.0, 3.0])
    with dumper(dump_path=tmp_path / "s.h5", mode="statistics"):
        y + 0
    with load_dump(tmp_path / "s.h5") as d:
        st = d.records[0].outputs[0].stats
    assert (st["min"], st["max"], st["mean"]) == (-2.0, 3.0, pytest.approx(2 / 3))
    assert st["l2"] == pytest.approx(14 ** 0.5)


def test_checksum_tells_bit_different_tensors_apart(tmp_path):
    a = torch.randn(100)
    b = a.clone()
    b[17] = torch.nextafter(b[17], torch.tensor(10.0))
    with dumper(dump_path=tmp_path / "d.h5", mode="statistics"):
        a.clone()
        b.clone()
        a.clone()
    with load_dump(tmp_path / "d.h5") as d:
        c = [r.outputs[0].stats["checksum"] for r in d.records]
    assert c[0] == c[2] != c[1]


def test_filters_ops_modules_data_mode_and_steps(tmp_path):
    model, batch = tiny_lm(), lm_batch()
    with dumper(dump_path=tmp_path / "ops.h5", ops=["aten.mm", "aten.addmm"]):
        lm_step(model, batch)
    with load_dump(tmp_path / "ops.h5") as d:
        assert d.records and {r.op for r in d.records} <= {"aten.mm.default",
                                                           "aten.addmm.default"}
    with dumper(dump_path=tmp_path / "mod.h5", modules="encoder.layers.1.*",
                data_mode=["forward", "output"]):
        lm_step(model, batch)
    with load_dump(tmp_path / "mod.h5") as d:
        assert d.records
        assert all("encoder.layers.1" in r.module and r.phase == "forward" for r in d.records)
        assert all(not r.inputs and r.outputs for r in d.records if r.outputs)
    with dumper(dump_path=tmp_path / "steps.h5", steps=[1], exclude_ops="aten.detach*") as dd:
        for _ in range(3):
            lm_step(model, batch)
            dd.step()
    with load_dump(tmp_path / "steps.h5") as d:
        assert {r.step for r in d.records} == {1}
        assert not list(d.select(op="aten.detach*"))
    with pytest.raises(ValueError, match="data_mode"):
        dumper(dump_path=tmp_path / "x.h5", data_mode="inputs")


def test_dumper_does_not_change_the_numbers(tmp_path):
    def run(dump):
        model, batch = tiny_lm(seed=3), lm_batch(seed=4)
        if dump:
            with dumper(dump_path=tmp_path / "d.h5"):
                loss = lm_step(model, batch)
        else:
            loss = lm_step(model, batch)
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss_a, grads_a = run(False)
    loss_b, grads_b = run(True)
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_inside_block_leaves_readable_incomplete_dump(tmp_path, exc):
    path = tmp_path / "d.h5"
    x = torch.ones(3)
    with pytest.raises(type(exc)) as info:
        with dumper(dump_path=path):
            x.exp()
            raise exc
    assert info.value is exc
    with load_dump(path) as d:
        assert not d.attrs["complete"]
        assert [r.op for r in d.records] == ["aten.exp.default"]
        assert torch.equal(d.records[0].outputs[0].load(), torch.ones(3).exp())


def test_killed_process_leaves_readable_dump(tmp_path):
    path = tmp_path / "killed.h5"
    code = f"""
import os, torch
from accuracy import dumper
with dumper(dump_path={str(path)!r}, flush_ops=4, flush_seconds=0.05):
    x = torch.ones(8)
    for i in range(40):
        x = x + 1
    import time; time.sleep(0.3)
    os.kill(os.getpid(), 9)
"""
    subprocess.run([sys.executable, "-c", code], check=False, timeout=120)
    with load_dump(path) as d:
        assert not d.closed_cleanly and not d.summary()["complete"]
        assert len(list(d.select(op="aten.add.Tensor"))) == 40
        assert torch.equal(d.records[-1].outputs[0].load(), torch.full((8,), 41.0))


def test_dump_path_rules(tmp_path):
    nested = tmp_path / "a" / "b" / "run.h5"
    one = torch.ones(1)
    with dumper(dump_path=nested):
        one.neg()
    assert nested.exists()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        with dumper(dump_path=nested):
            pass
    with dumper(dump_path=nested, overwrite=True):
        one.exp()
    with load_dump(nested) as d:
        assert [r.op for r in d.records] == ["aten.exp.default"]
    with dumper(dump_path=tmp_path / "a") as d:  # a folder: the dump goes inside (#17)
        one.exp()
    assert d.path == str(tmp_path / "a" / "dump_0.h5")


def test_unwritable_folder_is_refused_before_the_block(tmp_path):
    import os

    if os.geteuid() == 0:
        target = "/proc/accuracy-cannot-write/run.h5"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = str(ro / "run.h5")
    ran = []
    with pytest.raises(PermissionError):
        with dumper(dump_path=target):
            ran.append(1)
    assert not ran


def test_rank_placeholder_expands(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    with dumper(dump_path=tmp_path / "run_{rank}.h5"):
        torch.ones(1).neg()
    with load_dump(tmp_path / "run_3.h5") as d:
        assert d.attrs["rank"] == 3


def test_bad_files_are_refused_with_a_reason(tmp_path):
    with pytest.raises(DumpError, match="no such file"):
        load_dump(tmp_path / "missing.h5")
    txt = tmp_path / "notes.h5"
    txt.write_text("hello, not hdf5")
    with pytest.raises(DumpError, match="not an HDF5 file"):
        load_dump(txt)
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2, 3]
    with pytest.raises(DumpError, match="not an accuracy dump"):
        load_dump(foreign)
    good = tmp_path / "good.h5"
    with dumper(dump_path=good):
        torch.ones(4).exp()
    data = good.read_bytes()
    trunc = tmp_path / "trunc.h5"
    trunc.write_bytes(data[: len(data) // 3])
    with pytest.raises(DumpError, match="trunc.h5"):
        load_dump(trunc)
    newer = tmp_path / "newer.h5"
    newer.write_bytes(data)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(DumpError, match="newer"):
        load_dump(newer)


def test_dump_records_backend_profile_and_faults(tmp_path):
    from accuracy.device_backend import sim

    model, batch = tiny_lm(), lm_batch()
    fault = sim.fault("aten.native_layer_norm.default", module="encoder.layers.1.*", kind="eps",
                      value=1e-2, occurrence=1)
    with sim(profile="fp16-cube", faults=[fault]):
        with dumper(dump_path=tmp_path / "sim.h5"):
            lm_step(model, batch)
    with load_dump(tmp_path / "sim.h5") as d:
        assert d.attrs["backend"] == "sim" and d.attrs["profile"] == "fp16-cube"
        assert d.attrs["sim"]["faults"] and d.attrs["faults_applied"]
        hit = [r for r in d.records if r.extra.get("faults")]
        assert len(hit) == 1
        assert hit[0].op == "aten.native_layer_norm.default"
        assert hit[0].module.endswith("encoder.layers.1.norm2") and hit[0].phase == "forward"


def test_cli_info_ls_extract_backends(tmp_path, capsys):
    from accuracy.cli import main

    path = tmp_path / "d.h5"
    with dumper(dump_path=path):
        lm_step(tiny_lm(), lm_batch())
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "complete" in out and "backward" in out and "saved by links" in out
    assert main(["ls", str(path), "--op", "aten.mm", "--module", "encoder.layers.0.*"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert lines and all("aten.mm.default" in ln and "layers.0" in ln for ln in lines)
    with load_dump(path) as d:
        rec = next(d.select(op="aten.addmm"))
    one = tmp_path / "one.h5"
    assert main(["extract", str(path), "--op", rec.op, "--seq", str(rec.seq), "-o", str(one)]) == 0
    with h5py.File(one) as f:
        ds = f[f"/{rec.op}/{rec.seq}/output/0"]
        assert ds.shape == rec.outputs[0].shape
    assert main(["extract", str(path), "--op", rec.op, "-o", str(one)]) == 2  # exists
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "sim" in out
    assert main(["info", str(tmp_path / "nope.h5")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_tensor_written_without_version_bump_is_recorded_again(tmp_path):
    # GradScaler's unscale kernel writes found_inf without bumping its version counter.
    grads = [torch.tensor([1.0, float("inf")])]
    found_inf = torch.zeros(1)
    inv_scale = torch.ones(1)
    with dumper(dump_path=tmp_path / "d.h5"):
        found_inf.clone()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        found_inf.clone()
    with load_dump(tmp_path / "d.h5") as d:
        before, _, after = d.records
        assert before.inputs[0].load().item() == 0.0
        assert after.inputs[0].load().item() == 1.0


def test_view_output_with_its_own_memory_is_recorded_as_is(tmp_path):
    from accuracy.device_backend import sim

    x = torch.arange(6.0).reshape(2, 3)
    with sim(faults=[sim.fault("aten.view.default", kind="bias", value=0.5)]):
        with dumper(dump_path=tmp_path / "d.h5"):
            y = x.view(6)
    assert torch.equal(x, torch.arange(6.0).reshape(2, 3))  # the fault left the input alone
    with load_dump(tmp_path / "d.h5") as d:
        (rec,) = d.records
        assert torch.equal(rec.inputs[0].load(), x)
        assert torch.equal(rec.outputs[0].load(), y) and not torch.equal(y, x.view(6))
    with dumper(dump_path=tmp_path / "plain.h5"):
        x.view(6)
    with load_dump(tmp_path / "plain.h5") as d:
        assert d.records[0].outputs[0].is_link  # a true view shares the input's bytes


def test_full_stack_is_recorded_when_asked(tmp_path):
    def inner(x):
        return x.exp()  # innermost user frame

    x = torch.ones(2)
    with dumper(dump_path=tmp_path / "d.h5", stack=True):
        inner(x)
    with load_dump(tmp_path / "d.h5") as d:
        (rec,) = d.records
    frames = json.loads(rec.stack)
    assert frames[0].endswith("in inner") and "test_full_stack_is_recorded_when_asked" in frames[1]
    assert rec.source in frames[0]
