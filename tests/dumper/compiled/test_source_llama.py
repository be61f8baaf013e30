"""A tiny `transformers` Llama step (hidden 64, 2 layers, 4 heads, vocab 128, sequence 16,
random init) compiled with Inductor on CPU against the same step eager, fp32.

What a stranger's trial found on it, each fixed:
- RoPE's q/k kernels write in place over the reused memory of the q/k matmuls
  (`buf10 = reinterpret_tensor(buf4, [2, 4, 16, 16], transposed strides)`). The value before
  the launch was snapshotted through the output's transposed view, while the kernel's
  reference reads it as the matmul's `[32, 64]`: replay gave the clean RoPE kernels an error
  ratio ~2e7, the backward `add_clone_transpose` kernel failed with a size mismatch, and
  `accuracy repro` of a clean kernel printed DIVERGES.
- A kernel's input written by an extern `aten.mm.out` was stored afresh (the `out=` state
  was never remembered; reinterpreted views missed the identity key), so the faulty
  `up_proj` kernel's input was paired by nearest statistics with the *up_proj* matmul
  (cosine -0.02), and extern rows were named `OptimizedModule` / "" (paired with
  `aten.t` rows by value, cosine ~0).

Compiled once per module (clean and with the up_proj 1.05 fault), Inductor's cache in the
test's temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.compare.compiled_align import compiled_pairs
from tests._support.miscompile import ScaleMatmul

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.filterwarnings("ignore:Using `torch.compile", "ignore::UserWarning"),
              pytest.mark.timeout(900)]

ROPE = "inductor.cpp_fused__to_copy__unsafe_view_add_arange_cat_cos_mul_neg_sin_slice"


def make_dumps(folder, fault: bool) -> tuple:
    folder.mkdir()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4,
                                   vocab_size=128, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 128, (2, 16))
    eager, comp = folder / "eager.h5", folder / "compiled.h5"
    with dumper(eager, mode="tensor"):
        model(ids, labels=ids).loss.backward()
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model)
    miscompile = ScaleMatmul(torch.ops.aten.mm.default, "layers.1.mlp.up_proj") if fault \
        else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        with dumper(comp, mode="tensor"):
            compiled(ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    return eager, comp


def _replay(comp, out):
    from accuracy.replay import replay

    r = replay(comp, out)
    assert r.failed == 0  # the backward add_clone_transpose kernel failed before
    return out


@pytest.fixture(scope="module")
def replay_clean(cache, clean):
    return _replay(clean[1], cache / "replay_clean.h5")


@pytest.fixture(scope="module")
def replay_fault(cache, fault):
    return _replay(fault[1], cache / "replay_fault.h5")


def test_clean_llama_against_eager_has_no_error_and_pairs_its_kernels(clean):
    eager, comp = clean
    rep = compare(comp, eager)
    counts = rep.summary["counts"]
    assert counts["error"] == 0 and counts["warning"] == 0, rep.format()
    assert rep.culprit is None
    # eager values fused away inside kernels are expected: no warning, nothing blind
    assert "warning" not in rep.summary and not rep.summary["blind"], rep.format()
    with load_dump(comp) as my, load_dump(eager) as golden:
        pairs = compiled_pairs(my.records, golden.records)
    outs = [p for p in pairs if p.my_op is not None and p.io == "output"
            and p.my_op.op.startswith("inductor.")]
    paired = [p for p in outs if p.golden_op is not None]
    assert len(outs) >= 60 and len(paired) / len(outs) >= 0.8, (len(paired), len(outs))
    # RoPE's in-place q/k inputs (the reused memory's value before the launch) are links
    # to the q/k matmuls' writes, found by memory (the matmul's buffer object is deleted)
    with load_dump(comp) as my:
        rope = next(r for r in my.records if r.op.startswith(ROPE))
        writers = {t.row: r for r in my.records for t in r.outputs}
        befores = [t for n, t in zip(rope.extra["inputs"], rope.inputs, strict=True)
                   if n.endswith("_before")]
        assert len(befores) == 2
        assert all(writers[t.first].op == "aten.mm.out" for t in befores)
    # extern kernels are named after their FX node's module, forward and backward
    mms = [r for r in rep.rows if r.op == "aten.mm.out" and r.io == "output"]
    assert mms and all(".layers." in (r.module or "") or (r.module or "").endswith("lm_head")
                       for r in mms), sorted({r.module for r in mms})


def test_replay_of_the_clean_llama_keeps_every_kernel_within_its_bound(clean, replay_clean):
    eager, comp = clean
    with load_dump(replay_clean) as d:
        runs = {r.seq: (r.op, r.extra.get("replay", {})) for r in d.records
                if r.op.startswith("inductor.")}
    assert all(rp.get("status") in ("ok", "skipped") for _, rp in runs.values()), runs
    ratios = {(seq, op): max(o["error_ratio"] for o in rp["outputs"])
              for seq, (op, rp) in runs.items() if rp.get("status") == "ok"}
    assert len(ratios) >= 20
    assert max(ratios.values()) < 4, sorted(ratios.items(), key=lambda kv: -kv[1])[:3]
    assert any(op.startswith(ROPE) for _, op in ratios)  # ~2e7 before
    rep = compare(comp, eager, replay=replay_clean)
    counts = rep.summary["counts"]
    assert counts["error"] == 0 and counts["warning"] == 0, rep.format()


def test_faulty_kernels_input_follows_its_producer(fault):
    """Input 0 of the faulty kernel is the gate_proj matmul's output (extern `mm.out`): it is
    a link to that write and takes that matmul's golden value, not up_proj's look-alike."""
    eager, comp = fault
    with load_dump(comp) as my, load_dump(eager) as golden:
        pairs = compiled_pairs(my.records, golden.records)
        [kernel] = [r for r in my.records if r.op.startswith("inductor.")
                    and "silu" in r.op and ".layers.1.mlp" in r.module
                    and r.extra.get("graph") == "forward"]
        t = kernel.inputs[0]
        writer = next(r for r in my.records if any(o.row == t.first for o in r.outputs))
        assert writer.op == "aten.mm.out" and writer.module.endswith("layers.1.mlp.gate_proj")
        [tp] = [p for p in pairs if p.my_op is kernel and p.io == "input" and p.idx == 0]
        assert tp.golden is not None
        gop = golden.record(tp.golden.seq)
        assert gop.op == "aten.mm.default" and gop.module.endswith("layers.1.mlp.gate_proj")


def test_replayed_compare_names_the_faulty_kernel_in_layers_1_mlp(fault, replay_fault):
    eager, comp = fault
    rep = compare(comp, eager, replay=replay_fault)
    cul = rep.culprit
    assert cul is not None, rep.format()
    assert cul["op"].startswith("inductor.") and "silu" in cul["op"]
    assert cul["module"].endswith("layers.1.mlp"), cul


def _repro(comp, eager, kernel: str, out) -> subprocess.CompletedProcess:
    from accuracy.repro.script import write_repro

    write_repro(comp, kernel, out, golden=eager)
    return subprocess.run([sys.executable, str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_repro_of_the_faulty_kernel_diverges(fault, tmp_path):
    eager, comp = fault
    cul = compare(comp, eager).culprit
    run = _repro(comp, eager, cul["op"], tmp_path / "repro.py")
    assert run.returncode == 1 and "DIVERGES" in run.stdout, run.stdout + run.stderr


def test_repro_of_a_clean_rope_kernel_does_not_diverge(clean, tmp_path):
    """Its in-place inputs are the q/k matmuls' values read as `[32, 64]`: DIVERGES (1.38)
    before."""
    eager, comp = clean
    with load_dump(comp) as d:
        op = next(r.op for r in d.records if r.op.startswith(ROPE))
    run = _repro(comp, eager, op, tmp_path / "repro.py")
    assert run.returncode == 0 and "no divergence" in run.stdout, run.stdout + run.stderr
    # the kernel's recorded outputs are what its graph computes from its inputs (1.39 before)
    import re

    gaps = [float(x) for x in re.findall(r"recorded vs graph run eagerly ([0-9.e+-]+)",
                                         run.stdout)]
    assert len(gaps) >= 4 and max(gaps) < 1e-3, run.stdout
    run = _repro(comp, None, op, tmp_path / "alone.py")  # without eager values too
    assert run.returncode == 0 and "no divergence" in run.stdout, run.stdout + run.stderr


# -- crafted records (no compile) --------------------------------------------

def _t(seq: int, idx: int, row: int, stats: dict, first: int | None = None, io: int = 1):
    from accuracy.dumpfile.reader import TensorRecord

    return TensorRecord(None, row, "op", seq, io, idx, "float32", (32, 128), (), "cpu",
                        -1, 0, row if first is None else first, dict(stats))


def _op(seq: int, op: str, ins: list, outs: list, extra: dict | None = None,
        module: str = "M.mlp"):
    from accuracy.dumpfile.reader import OpRecord

    return OpRecord(seq, op, "forward", module, "", "", "", 0, extra or {}, ins, outs)


def test_an_input_another_launch_wrote_is_never_paired_by_statistics():
    """The extern matmul's output finds no eager value: the kernel input it links to gets
    none either, never the eager value nearest in statistics (another matmul's)."""
    far = {"l2": 90.0, "mean": 5.0, "max": 9.0, "min": 1.0}
    near = {"l2": 8.0, "mean": 0.1, "max": 2.0, "min": -2.0}
    golden = [_op(0, "aten.mm.default", [], [_t(0, 0, 0, near)], module="M.mlp.up_proj")]
    mm = _op(0, "aten.mm.out", [], [_t(0, 0, 10, far)], module="M.mlp.gate_proj")
    kernel = _op(1, "inductor.cpp_fused_mul_silu_0", [_t(1, 0, 11, near, first=10, io=0)],
                 [], extra={"compiled": "inductor", "outputs": []})
    [tp] = [p for p in compiled_pairs([mm, kernel], golden)
            if p.my_op is kernel and p.io == "input"]
    assert tp.golden is None and tp.reason.startswith("its producer (aten.mm.out seq 0)")
