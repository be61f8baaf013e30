"""Replay: local error per op, separated from the error it inherited."""

from __future__ import annotations

import math

import pytest
import torch

from accuracy.device_backend import sim
from accuracy.dumper.core import dumper
from accuracy.dumpfile import load_dump
from accuracy.dumpfile.writer import DumpWriter, OpEntry, TensorEntry
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.records import CallSite
from accuracy.replay import ReplayError, register_reference, replay, unregister_reference
from accuracy.replay import engine as engine_mod
from tests._support.lm_dumps import lm_dump

KEYS = {"idx", "err_device", "err_reference", "error_ratio", "max_abs", "cosine", "bit_exact"}


def _results(path):
    with load_dump(path) as d:
        return {r.seq: (r.op, r.extra["replay"]) for r in d.records}


@pytest.fixture(scope="module")
def cpu_dump(tmp_path_factory):
    return lm_dump(tmp_path_factory.mktemp("cpu") / "cpu.h5")


def _fault(module):
    return sim.fault("aten.addmm.default", module=module, kind="bias", value=0.05, occurrence=0)


def test_cpu_dump_replays_bit_exactly(cpu_dump, tmp_path):
    out = tmp_path / "replay.h5"
    r = replay(cpu_dump, out, metrics_only=False)  # the reference outputs, stored on request
    assert r.failed == 0 and r.ok > 100 and r.total == r.ok + r.skipped
    with load_dump(out) as d, load_dump(cpu_dump) as src:
        assert d.attrs["replayed_from"] == str(cpu_dump.resolve())
        assert d.attrs["upcast"] == "fp64" and d.attrs["reference"] == "cpu"
        for rec in d.records:
            info = rec.extra["replay"]
            assert set(info) == {"status", "reason", "outputs"}
            assert rec.op == src.record(rec.seq).op
            if info["status"] != "ok":
                assert info["reason"], rec.op
                continue
            for o in info["outputs"]:
                assert set(o) == KEYS
                assert o["bit_exact"], (rec.seq, rec.op, o)
                assert o["error_ratio"] == 1.0, (rec.seq, rec.op, o)
            # the reference outputs stored in replay.h5 are the device's bytes, dtype kept
            for t, s in zip(rec.outputs, src.record(rec.seq).outputs, strict=False):
                if t.has_data and s.has_data:
                    assert t.dtype == s.dtype
                    assert torch.equal(t.load().view(-1).view(torch.uint8),
                                       s.load().view(-1).view(torch.uint8)), rec.seq


def _culprit_check(path, tmp_path, factor):
    out = tmp_path / "replay.h5"
    replay(path, out)
    with load_dump(path) as d:
        faulty = [r.seq for r in d.records if r.extra.get("faults")]
    assert len(faulty) == 1
    ratios = {seq: max((o["error_ratio"] for o in info["outputs"]), default=1.0)
              for seq, (_, info) in _results(out).items()}
    bad = faulty[0]
    assert ratios[bad] > 1e4
    others = [v for s, v in ratios.items() if s != bad]
    assert max(others) * factor < ratios[bad]
    return ratios, bad


def test_sim_fault_flags_the_op_not_its_downstream(tmp_path):
    path = lm_dump(tmp_path / "sim.h5", profile="exact",
                      faults=[_fault("encoder.layers.1.*")])
    ratios, bad = _culprit_check(path, tmp_path, factor=1e4)
    downstream = [v for s, v in ratios.items() if s > bad]
    assert downstream and max(downstream) <= 1.0 + 1e-12


def test_sim_fault_stands_out_on_fp16_profile(tmp_path):
    # fp16-cube rounds matmul inputs: every matmul has a real (ratio ~1e3) local error, the
    # injected bias is still far above all of them.
    path = lm_dump(tmp_path / "sim16.h5", profile="fp16-cube",
                      faults=[_fault("encoder.layers.0.*")])
    _culprit_check(path, tmp_path, factor=20)


def _inplace_step():
    a = torch.randn(4, 6)
    b = torch.randn(4, 6)
    a.add_(b, alpha=0.5)  # in-place
    a.mul_(2.0)
    c = torch.empty(4, 6)
    torch.add(a, b, out=c)  # out= variant
    torch.cat([a, b, c], dim=1)  # list of tensors
    torch.stack((a, b))
    torch.nn.functional.layer_norm(c, (6,), None, None)  # optional tensors
    c.to(torch.float16).sum(dtype=torch.float32)  # dtype arguments
    torch.arange(5, device="cpu", dtype=torch.float64)  # device argument
    torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last).relu_()
    torch.addcmul(a, b, c, value=0.25).clamp_(min=-0.5, max=0.5)
    torch.where(a > 0, a, b).t().matmul(b)


def test_inplace_out_lists_and_arguments_replay(tmp_path):
    path = tmp_path / "inplace.h5"
    torch.manual_seed(0)
    with dumper(path):
        _inplace_step()
    out = tmp_path / "replay.h5"
    r = replay(path, out)
    res = _results(out)
    ops = {op for op, _ in res.values()}
    assert {"aten.add_.Tensor", "aten.mul_.Tensor", "aten.add.out", "aten.cat.default",
            "aten.native_layer_norm.default", "aten.relu_.default"} <= ops
    assert r.failed == 0
    for seq, (op, info) in res.items():
        if op in ("aten.randn.default", "aten.empty.memory_format"):
            assert info["status"] == "skipped"
            continue
        assert info["status"] == "ok", (op, info)
        assert all(o["bit_exact"] for o in info["outputs"]), (seq, op, info)
    with load_dump(path) as d:
        inplace = [rec for rec in d.records if rec.op == "aten.add_.Tensor"][0]
        # the recorded output of an in-place op is the mutated input: the replay reproduces it
        assert not torch.equal(inplace.inputs[0].load(), inplace.outputs[0].load())
    assert res[inplace.seq][1]["outputs"][0]["bit_exact"]


def test_device_error_is_measured_in_low_precision(tmp_path):
    # A bf16 matmul replayed in bf16 and fp64: a correct device has ratio ~1; a device whose
    # output is off by 1% has a ratio far above.
    path = tmp_path / "bf16.h5"
    torch.manual_seed(0)
    x, w = torch.randn(32, 64).bfloat16(), torch.randn(64, 16).bfloat16()
    with dumper(path):
        x @ w
    res = _results(replay(path, tmp_path / "r.h5").path)
    (op, info), = [v for v in res.values() if v[0] == "aten.mm.default"]
    o = info["outputs"][0]
    # bit-identical to the bf16 reference: ratio 1 by definition, no fp64 run needed
    assert o["bit_exact"] and o["error_ratio"] == 1.0 and o["err_reference"] is None
    from accuracy.device_backend import sim

    off = tmp_path / "off.h5"
    with sim(faults=[sim.fault("aten.mm.default", kind="bias", value=0.01)]):
        with dumper(off):
            x @ w
    res = _results(replay(off, tmp_path / "r2.h5").path)
    (op, info), = [v for v in res.values() if v[0] == "aten.mm.default"]
    o = info["outputs"][0]
    assert not o["bit_exact"] and 0 < o["err_reference"] < 1e-2 < o["err_device"]
    assert o["error_ratio"] > 2


def _fake_fused_dump(path):
    """A dump holding a device-only fused op that CPU torch has no kernel for."""
    x = torch.randn(3, 8)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    w = DumpWriter(path, {"mode": "tensor", "backend": "npu"})
    entries = []
    for io, t in ((0, x), (1, y)):
        row = w.new_row()
        entries.append(TensorEntry(row=row, seq=0, io=io, idx=0, dtype="float32", shape=(3, 8),
                                   stride=(8, 1), device="npu:0", stats=None, data=t, first=row,
                                   nbytes=t.numel() * 4))
    w.add_op(OpEntry(CallSite(0, "npu.npu_rms_norm.default", "forward", "m", ""), stack="",
                     args='{"args":[{"__tensor__":0},1e-06],"kwargs":{}}', n_in=1, n_out=1),
             entries)
    w.close({}, complete=True)


def test_unreplayable_ops_carry_reasons_and_registry(tmp_path):
    path = tmp_path / "rng.h5"
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    with dumper(path):
        torch.rand(3)
        torch.empty(5)
        torch.nn.functional.dropout(x, p=0.3, training=True)  # CPU: bernoulli_, div_, mul
        torch.ops.aten.native_dropout.default(x, 0.3, True)  # what device kernels record
        x.relu()
    res = _results(replay(path, tmp_path / "r.h5").path)
    by_op = {op: info for op, info in res.values()}
    assert by_op["aten.rand.default"]["status"] == "skipped"
    assert "rng" in by_op["aten.rand.default"]["reason"]
    assert "uninitialised" in by_op["aten.empty.memory_format"]["reason"]
    assert "rng" in by_op["aten.bernoulli_.float"]["reason"]
    assert by_op["aten.mul.Tensor"]["status"] == "ok"  # input * mask, checked
    drop = by_op["aten.native_dropout.default"]
    assert drop["status"] == "ok" and "mask" in drop["reason"]
    assert all(o["bit_exact"] for o in drop["outputs"])
    assert all(info["reason"] for info in by_op.values() if info["status"] != "ok")

    fused = tmp_path / "fused.h5"
    _fake_fused_dump(fused)
    info = _results(replay(fused, tmp_path / "f1.h5").path)[0][1]
    assert info["status"] == "skipped" and "no kernel" in info["reason"]
    register_reference("npu.npu_rms_norm",
                       lambda x, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    try:
        info = _results(replay(fused, tmp_path / "f2.h5").path)[0][1]
    finally:
        unregister_reference("npu.npu_rms_norm")
    assert info["status"] == "ok" and info["outputs"][0]["bit_exact"]


def test_filtered_inputs_are_skipped_with_reason(tmp_path):
    path = tmp_path / "outonly.h5"
    with dumper(path, data_mode="output"):
        torch.randn(4, 4).exp()
    res = _results(replay(path, tmp_path / "r.h5").path)
    info = [i for op, i in res.values() if op == "aten.exp.default"][0]
    assert info["status"] == "skipped" and "not recorded" in info["reason"]


def test_resume_does_not_redo_finished_ops(cpu_dump, tmp_path, monkeypatch):
    out = tmp_path / "replay.h5"
    calls = []
    real = engine_mod.replay_op

    def interrupted(rec, device, upcast, **kw):
        if len(calls) == 40:
            raise KeyboardInterrupt
        calls.append(rec.seq)
        return real(rec, device, upcast, **kw)

    monkeypatch.setattr(engine_mod, "replay_op", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replay(cpu_dump, out)
    assert not out.exists() and (tmp_path / "replay.h5.partial").exists()
    with pytest.raises(FileExistsError, match="resume"):
        replay(cpu_dump, out)
    first = list(calls)
    calls.clear()

    def counting(rec, device, upcast, **kw):
        calls.append(rec.seq)
        return real(rec, device, upcast, **kw)

    monkeypatch.setattr(engine_mod, "replay_op", counting)
    r = replay(cpu_dump, out, resume=True)
    assert r.resumed > 0 and not set(calls) & set(first[: r.resumed])
    assert len(calls) + r.resumed == r.total
    assert not (tmp_path / "replay.h5.partial").exists()
    with load_dump(cpu_dump) as d:
        assert sorted(_results(out)) == sorted(rec.seq for rec in d.records)


def test_statistics_dump_is_refused(tmp_path):
    path = tmp_path / "stats.h5"
    with dumper(path, mode="statistics"):
        torch.randn(3).exp()
    with pytest.raises(ReplayError, match="tensor"):
        replay(path, tmp_path / "r.h5")
    from accuracy.cli import main

    assert main(["replay", str(path), "-o", str(tmp_path / "r.h5")]) == 2


def test_a_replay_given_as_the_dump_is_refused(tmp_path, capsys):
    """`accuracy replay replay.h5 -o rr.h5` once ran ('34 ok, 721 skipped') and wrote a file:
    a replay holds the reference's figures of another dump's ops, not a run to replay."""
    from accuracy.cli import main

    path = tmp_path / "d.h5"
    with dumper(path):
        torch.ones(3).exp()
    replay(path, tmp_path / "r.h5")
    with pytest.raises(ReplayError, match="is a replay of .*d.h5"):
        replay(tmp_path / "r.h5", tmp_path / "rr.h5")
    assert main(["replay", str(tmp_path / "r.h5"), "-o", str(tmp_path / "rr.h5")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "replay the dump itself" in err, err
    assert not list(tmp_path.glob("rr*"))  # nothing half-written


def test_newer_schema_is_refused(tmp_path):
    import h5py

    from accuracy.dumpfile import DumpError

    path = tmp_path / "new.h5"
    with dumper(path):
        torch.randn(3).exp()
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(DumpError, match="newer"):
        replay(path, tmp_path / "r.h5")


def test_load_mode_feeds_golden_inputs(tmp_path):
    batch = lm_batch(batch=2, seq=16)
    gold = tmp_path / "gold.h5"
    model = tiny_lm()
    with dumper(gold):
        lm_step(model, batch)
    model = tiny_lm()
    with sim(profile="exact", faults=[_fault("encoder.layers.0.*")]):
        with dumper(tmp_path / "dev.h5", load_file_path=gold):
            lm_step(model, batch)
    with load_dump(gold) as g, load_dump(tmp_path / "dev.h5") as d:
        assert d.attrs["ops_loaded"] > 100
        faulty = [r.seq for r in d.records if r.extra.get("faults")]
        assert len(faulty) == 1
        differ = []
        for r in d.records:
            gr = g.record(r.seq)
            assert gr.op == r.op
            if r.extra.get("loaded"):
                for a, b in zip(r.inputs, gr.inputs, strict=True):
                    assert torch.equal(a.load(), b.load()), (r.seq, r.op)
                if not all(torch.equal(a.load(), b.load())
                           for a, b in zip(r.outputs, gr.outputs, strict=True)):
                    differ.append(r.seq)
        # every fed op reproduces the golden output except the faulty kernel itself
        assert differ == faulty


def test_jobs_give_the_same_results(cpu_dump, tmp_path):
    one = _results(replay(cpu_dump, tmp_path / "a.h5", ops="aten.*mm*").path)
    two = _results(replay(cpu_dump, tmp_path / "b.h5", ops="aten.*mm*", jobs=2).path)
    assert one.keys() == two.keys() and len(one) > 5
    for seq in one:
        a, b = one[seq][1], two[seq][1]
        assert a["status"] == b["status"]
        for x, y in zip(a["outputs"], b["outputs"], strict=True):
            assert x["bit_exact"] == y["bit_exact"]
            assert math.isclose(x["error_ratio"], y["error_ratio"])


def test_exact_ops_still_flag_a_faulted_one(tmp_path):
    # ops that only move values skip the upcast run; a device that gets them wrong is still
    # flagged (not bit-exact, ratio far above 1), and only that op is
    op = "aten.clone.default"
    path = lm_dump(tmp_path / "exact.h5", profile="exact",
                      faults=[sim.fault(op, kind="bias", value=0.1, occurrence=0)])
    out = tmp_path / "replay.h5"
    replay(path, out)
    with load_dump(path) as d:
        faulty = [r.seq for r in d.records if r.extra.get("faults")]
    assert len(faulty) == 1
    res = _results(out)
    op_name, info = res[faulty[0]]
    assert op_name == op and info["status"] == "ok"
    o = info["outputs"][0]
    assert not o["bit_exact"] and o["error_ratio"] > 1e4 and o["err_reference"] == 0.0
    assert o["max_abs"] > 0 and o["err_device"] == pytest.approx(0.1, rel=1e-6)
    # the fault scales the output by 1.1: its direction is kept, which cosine cannot see
    # (1 up to rounding), and the relative error can
    assert o["cosine"] == pytest.approx(1.0, abs=1e-12)
    for seq, (_, other) in res.items():
        if seq != faulty[0]:
            assert all(x["error_ratio"] <= 1.0 + 1e-12 for x in other["outputs"]), (seq, other)


def test_mapped_reads_match_and_stay_private(cpu_dump):
    from accuracy.replay.cache import TensorCache

    with load_dump(cpu_dump) as d:
        rows = [t for t in d.tensors if t.has_data][:50]
        cache = TensorCache()
        for t in rows:
            a, b = cache.load(t), t.load()
            assert a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8),
                                                      b.view(-1).view(torch.uint8))
        a = d.read_tensor_mapped(rows[0])
        before = rows[0].load().clone()
        a.view(-1).view(torch.uint8).add_(1)  # copy-on-write: the file is unchanged
        assert torch.equal(rows[0].load(), before)
