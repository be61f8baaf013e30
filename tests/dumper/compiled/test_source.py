"""Inductor on CPU under the dumper: kernels recorded as they run, compared against eager.

The issue's fault: a post-grad pass scales the `blocks.1.fc1` matmul by 1.05, as a wrong fused
kernel would; the compare must name that kernel, not pass the step. Each model is compiled
once per module, with Inductor's cache in the test's temporary folder.
"""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from tests._support.miscompile import ScaleMatmul, inductor_cache
from tests.dumper.compiled.test_watch import Block, Net

LINE = f"test_watch.py:{Block.forward.__code__.co_firstlineno + 1}"  # its return

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")


def _dumps(folder, fault: bool) -> tuple:
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    eager, comp = folder / "eager.h5", folder / "compiled.h5"
    with dumper(eager, mode="tensor"):
        net(x).sum().backward()
    net.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(net)
    miscompile = ScaleMatmul(torch.ops.aten.addmm.default, "blocks.1.fc1") if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        with dumper(comp, mode="tensor"):
            compiled(x).sum().backward()
    return eager, comp


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with inductor_cache(tmp_path_factory.mktemp("inductor")) as folder:
        (folder / "clean").mkdir()
        (folder / "fault").mkdir()
        yield {"clean": _dumps(folder / "clean", False), "fault": _dumps(folder / "fault", True)}


def test_forward_and_backward_kernels_are_recorded_with_module_and_source(runs):
    _, comp = runs["clean"]
    d = load_dump(comp)
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "recorded-compiled" and region["backend"] == "inductor"
    kernels = [r for r in d.records if r.op.startswith("inductor.")]
    assert {r.phase for r in kernels} == {"forward", "backward"}
    assert d.attrs["compiled_kernels_recorded"] == len(kernels)
    ln = next(r for r in kernels if r.phase == "forward")
    assert ln.module == "Net.blocks.0.ln" and ln.source.endswith(LINE)
    assert ln.extra["graph"] == "forward" and ln.extra["kernel"] in ln.op
    assert "aten.var_mean.correction" in ln.extra["fused_ops"]
    assert all(t.has_data for r in kernels for t in r.outputs)  # tensor mode: the buffers
    assert any(r.extra["graph"] == "backward" for r in kernels)


def test_info_says_which_regions_were_recorded_compiled(runs):
    """`info` said only what was not seen (BLIND): a user could not tell a compiled step that
    was recorded as compiled from one that never ran compiled."""
    from accuracy.dumpfile.describe import describe

    _, comp = runs["clean"]
    text = describe(comp).format()
    line = next(x for x in text.splitlines() if "recorded as compiled" in x)
    assert "[backend inductor" in line and "kernel launch(es) recorded" in line
    assert "BLIND" not in text


def test_clean_compiled_step_against_eager_has_no_error(runs):
    eager, comp = runs["clean"]
    rep = compare(comp, eager)
    assert rep.summary["counts"]["error"] == 0 and rep.summary["counts"]["warning"] == 0
    assert rep.culprit is None and not rep.summary["blind"]
    judged = [r for r in rep.rows if (r.op or "").startswith("inductor.")
              and r.io == "output" and r.verdict == "pass"]
    assert len(judged) >= 8  # kernels' buffers really were paired with eager values


def test_the_miscompiled_kernel_is_the_culprit_with_its_module(runs):
    eager, comp = runs["fault"]
    rep = compare(comp, eager)
    cul = rep.culprit
    assert cul is not None and cul["op"].startswith("inductor.cpp_fused")
    assert cul["module"] == "Net.blocks.1.fc1" and cul["phase"] == "forward"
    assert cul["source"].endswith(LINE)
    assert "aten.addmm" in cul["message"]  # the eager value it was matched with
    assert "culprit: seq" in rep.format() and "Net.blocks.1.fc1" in rep.format()


def test_a_region_compiled_before_the_dumper_is_reported_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(2, 8)
    net.blocks[1] = torch.compile(net.blocks[1])
    net(x)  # compiled here, outside the dumper: its kernels carry no hooks
    with dumper(tmp_path / "warm.h5", mode="statistics"):
        net(x)
    d = load_dump(tmp_path / "warm.h5")
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "not-recorded" and "before the dumper" in region["reason"]
    assert "blocks.1" in region["name"]
    assert not any(r.op.startswith("inductor.") for r in d.records)
    torch._dynamo.reset()


def test_a_graph_break_records_eager_parts_and_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()

    def f(x):
        y = torch.relu(x) * 2
        print("graph break")  # noqa: T201 - dynamo cannot trace print: two graphs
        return torch.sigmoid(y) + 1

    cf = torch.compile(f)
    with dumper(tmp_path / "gb.h5", mode="statistics"):
        cf(torch.randn(16))
    d = load_dump(tmp_path / "gb.h5")
    kernels = [r for r in d.records if r.op.startswith("inductor.")]
    assert len(kernels) == 2  # one fused kernel per graph on each side of the break
    assert d.attrs["compiled_regions"][0]["status"] == "recorded-compiled"
    torch._dynamo.reset()


def test_repro_script_shows_the_culprit_kernels_divergence(runs, tmp_path):
    import os
    import subprocess
    import sys

    from accuracy.repro.script import write_repro

    eager, comp = runs["fault"]
    cul = compare(comp, eager).culprit
    out = tmp_path / "repro.py"
    r = write_repro(comp, cul["op"], out, golden=eager, seq=cul["seq_my"])
    # the pass's node, printed from the dump's validated form
    # (tests/scenarios/test_hostile_dumps_never_run.py)
    assert r.golden >= 1 and "torch.ops.aten.mul.Tensor(" in out.read_text()
    run = subprocess.run([sys.executable, str(out)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "DIVERGES" in run.stdout and "recorded vs eager run's value 0.05" in run.stdout


def _faulted_kernel(comp) -> int:
    """Seq of the forward kernel that reads blocks.1.fc1's matmul (where the pass's 1.05 went)."""
    d = load_dump(comp)
    return next(r.seq for r in d.records if r.op.startswith("inductor.") and r.phase == "forward"
                and any(o["module"] == "Net.blocks.1.fc1" for o in r.extra["outputs"]))


def test_replay_names_the_miscompiled_kernel_by_its_local_error(runs, tmp_path):
    from accuracy.replay import replay

    eager, comp = runs["fault"]
    replay(comp, tmp_path / "replay.h5")
    faulted = _faulted_kernel(comp)
    row = load_dump(tmp_path / "replay.h5").record(faulted)
    rp = row.extra["replay"]
    assert rp["status"] == "ok" and max(o["error_ratio"] for o in rp["outputs"]) > 1e3
    # the pass's own node is re-run as it stands, and the row says that it was
    assert "graph after Inductor's passes" in rp["reason"]
    rep = compare(comp, eager, tmp_path / "replay.h5")
    cul = rep.culprit
    assert rep.summary["ranking"] == "local error (replay)"
    assert cul is not None and cul["seq_my"] == faulted and cul["op"].startswith("inductor.")
    assert "local error" in cul["message"]


def test_replay_of_a_clean_compiled_step_keeps_every_kernel_within_its_bound(runs, tmp_path):
    from accuracy.compare.precision import ComputePrecision
    from accuracy.compare.verdict import judge_local, load_config
    from accuracy.replay import replay

    eager, comp = runs["clean"]
    res = replay(comp, tmp_path / "replay.h5")
    assert res.failed == 0
    cfg = load_config(None)
    precision = ComputePrecision.from_sources(cfg, load_dump(comp).attrs)
    measured = 0
    for r in load_dump(tmp_path / "replay.h5").records:
        if not r.op.startswith("inductor."):
            continue
        rp = r.extra["replay"]
        assert rp["status"] == "ok", (r.op, rp["reason"])
        for o in rp["outputs"]:
            verdict, figures = judge_local(r, o["idx"], r.outputs[o["idx"]].dtype,
                                           o["error_ratio"], cfg, precision,
                                           o["err_reference"])
            assert verdict == "pass", (r.seq, r.op, o, figures)
            measured += 1
    assert measured >= 15  # forward and backward kernels' outputs, not a handful
    rep = compare(comp, eager, tmp_path / "replay.h5")
    assert rep.culprit is None and rep.summary["counts"]["error"] == 0
    assert rep.summary["counts"]["warning"] == 0


def test_a_kernel_that_cannot_be_rebuilt_says_why(runs, tmp_path):
    import dataclasses
    import json

    from accuracy.replay import replay
    from accuracy.replay.ops import SKIPPED, replay_op

    _, comp = runs["clean"]
    replay(comp, tmp_path / "replay.h5")
    reasons = [r.extra["replay"]["reason"] for r in load_dump(tmp_path / "replay.h5").records
               if r.op.startswith("inductor.")]
    # Inductor's Welford sum of squares is no ATen op's value: said, not measured
    assert any("not replayed: Inductor names no origin node" in x for x in reasons)
    d = load_dump(comp)
    rec = next(r for r in d.records if r.extra.get("reference"))
    bare = dataclasses.replace(rec, extra={k: v for k, v in rec.extra.items()
                                           if k != "reference"})
    out = replay_op(bare, torch.device("cpu"), "fp64")
    assert out.status == SKIPPED and "without a reference" in out.reason
    ref = json.loads(json.dumps(rec.extra["reference"]))
    ref["nodes"][0]["op"] = "aten.no_such_op.default"
    odd = dataclasses.replace(rec, extra={**rec.extra, "reference": ref})
    out = replay_op(odd, torch.device("cpu"), "fp64")
    assert out.status == SKIPPED and "aten.no_such_op.default" in out.reason


@pytest.mark.parametrize(("spelled", "named"), [
    ("L['self'].blocks[1].fc1", "blocks.1.fc1"),
    # transformers' decorated forward(*args): dynamo reaches the model as L['args'][0]
    ("L['args'][0].model.layers.0.mlp", "model.layers.0.mlp"),
    ("L['kwargs']['model'].lm_head", "lm_head"),
    ("L['self']._modules['h']._modules['1'].attn", "h.1.attn"),
    ("L['args'][0]", ""),
])
def test_kernel_rows_name_modules_as_eager_rows_do(spelled, named):
    """A kernel row's module must read as the eager row's, or compiled and eager values are
    never paired (a tiny Llama compiled: 64 of 67 kernel outputs 'only in my run', PASS)."""
    from accuracy.dumper.compiled.kernels import _module_path

    assert _module_path({"nn_module_stack": {"k": (spelled, torch.nn.Linear)}}) == \
        (named, "Linear")


def test_blocks_compiled_in_place_name_their_kernels_by_layer(tmp_path, monkeypatch):
    """`block.compile()` per layer: the region is entered before the block's own forward
    hooks, where the module path is still the parent's. Kernels were named `Net.ln` (no
    layer index), paired with nothing, and the blocks were one region of 3 calls. (Blocks
    sharing one compiled program: tests/dumper/compiled/test_names.py.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with dumper(tmp_path / "eager.h5", mode="tensor"):
        net(x).sum().backward()
    net.zero_grad()
    torch._dynamo.reset()
    try:
        for b in net.blocks:
            b.compile()
        with dumper(tmp_path / "compiled.h5", mode="tensor"):
            net(x).sum().backward()
        d = load_dump(tmp_path / "compiled.h5")
        names = {r["name"] for r in d.attrs["compiled_regions"]}
        assert names == {f"Net.blocks.{i} (Block)" for i in range(3)}, names
        fwd = {r.module for r in d.records
               if r.op.startswith("inductor.") and r.phase == "forward"}
        assert {m.rsplit(".", 1)[0] for m in fwd} >= {f"Net.blocks.{i}" for i in range(3)}, fwd
        rep = compare(tmp_path / "compiled.h5", tmp_path / "eager.h5")
        assert rep.summary["counts"]["error"] == 0
        judged = {r.module for r in rep.rows if (r.op or "").startswith("inductor.")
                  and r.io == "output" and r.phase == "forward" and r.verdict == "pass"}
        assert {m.rsplit(".", 1)[0] for m in judged} >= {f"Net.blocks.{i}" for i in range(3)}
        # the first block's backward graph is its own compile: its kernels take its name
        back = {r.module for r in d.records
                if r.op.startswith("inductor.") and r.phase == "backward"}
        assert any(m.startswith("Net.blocks.0") for m in back), back
    finally:
        for b in net.blocks:
            b._compiled_call_impl = None
        torch._dynamo.reset()
