"""A tiny `transformers` GPT-2 step compiled with Inductor (CPU) against the same step eager,
fp32: 0 errors, and each kernel buffer paired with the eager value computed where it was.

What pairing by module and nearest statistics got wrong, and these tests hold: with head
size == sequence length, k and its transpose have the same shape and statistics; the
decomposed LayerNorm backward's `add`s met the residual gradient's `add`s; the variance
Inductor keeps, seen through a view of `var_mean`, met `native_layer_norm`'s mean; and buffers
Inductor's C++ kernels wrote in place (no version bump) were recorded as links to their stale
earlier values.
The model is compiled once for this module, with Inductor's cache in the test's temp folder.
"""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.compare.compiled_align import compiled_pairs
from tests._support.miscompile import inductor_cache

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.filterwarnings("ignore:Using `torch.compile", "ignore::UserWarning"),
              pytest.mark.timeout(900)]  # one Inductor compile of GPT-2: minutes on a busy CPU


def _gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_head=2, n_layer=2, n_positions=32, vocab_size=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()  # head size 16 == sequence length 16
    return model, torch.randint(0, 64, (2, 16))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    with inductor_cache(tmp_path_factory.mktemp("gpt2")) as folder:
        model, ids = _gpt2()
        eager, comp = folder / "eager.h5", folder / "compiled.h5"
        with dumper(eager, mode="tensor"):
            model(ids, labels=ids).loss.backward()
        model.zero_grad()
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with dumper(comp, mode="tensor"):
            compiled(ids, labels=ids).loss.backward()
        yield eager, comp


def test_compiled_gpt2_step_against_eager_has_no_error(gpt2):
    eager, comp = gpt2
    rep = compare(comp, eager)
    counts = rep.summary["counts"]
    assert counts["error"] == 0 and counts["warning"] == 0, rep.format()
    assert rep.culprit is None and not rep.summary["blind"]
    judged = [r for r in rep.rows if (r.op or "").startswith("inductor.")
              and r.io == "output" and r.verdict.value == "pass"]
    assert len(judged) >= 30  # the kernels' buffers really were judged


def _kernel_outputs(eager, comp):
    with load_dump(comp) as my, load_dump(eager) as golden:
        pairs = compiled_pairs(my.records, golden.records)
    return [p for p in pairs if p.my_op is not None and p.io == "output"
            and p.my_op.op.startswith("inductor.")]


def test_each_buffer_is_paired_where_it_was_computed(gpt2):
    eager, comp = gpt2
    outs = _kernel_outputs(eager, comp)
    paired = [p for p in outs if p.golden_op is not None]
    assert len(paired) >= 30
    for p in paired:  # the eager value came from the buffer's own module and source line
        assert p.golden_op.module == p.module and p.golden_op.source == p.source, p.note
    # (a) k and v, copied for attention: the eager `cat`s of their own lines, not the
    # transposes of the same shape and statistics
    kv = [p for p in paired if p.module.endswith(".attn") and p.my.shape == (2, 2, 16, 16)]
    assert len(kv) == 4 and {p.golden_op.op for p in kv} == {"aten.cat.default"}
    assert len({p.golden.row for p in kv}) == 4
    # (b) the residual gradient through each LayerNorm's backward: the eager `add` of that
    # LayerNorm's line (the gradient accumulation), one each
    adds = [p for p in paired if p.my_op.phase == "backward" and p.golden_op.op == "aten.add.Tensor"
            and p.module.rsplit(".", 1)[-1] in ("ln_1", "ln_2")]
    assert len(adds) == 3 and len({p.golden.row for p in adds}) == 3
    # (c) what Inductor keeps of var_mean (also seen through a view) is only in my run
    kept = [p for p in outs if "var_mean" in p.reason]
    assert len(kept) >= 5 and all(p.golden is None and p.reason.startswith("only in my run")
                                  for p in kept)
    assert not any(p.golden_op.op == "aten.native_layer_norm.default" and p.golden.idx == 1
                   for p in paired)  # eager's mean is paired with no buffer


# -- the pairing rule on crafted records (no compile) ----------------------------------------

def _t(seq: int, idx: int, row: int, stats: dict, io: int = 1):
    from accuracy.dumpfile.reader import TensorRecord

    return TensorRecord(None, row, "op", seq, io, idx, "float32", (2, 2, 16, 16), (), "cpu",
                        -1, 0, row, dict(stats))


def _op(seq: int, op: str, source: str, outs: list, extra: dict | None = None,
        module: str = "M.attn"):
    from accuracy.dumpfile.reader import OpRecord

    return OpRecord(seq, op, "forward", module, source, "", "", 0, extra or {}, [], outs)


SAME = {"l2": 8.0, "mean": 0.1, "max": 2.0, "min": -2.0}


def test_pairing_follows_source_line_and_op_not_the_nearest_value():
    # eager: k's transpose (line 189), then the cats copying k (line 136) and v (line 137),
    # all of one shape and the same statistics (head size == sequence length)
    golden = [_op(0, "aten.transpose.int", "m.py:189", [_t(0, 0, 0, SAME)]),
              _op(1, "aten.cat.default", "c.py:136", [_t(1, 0, 1, SAME)]),
              _op(2, "aten.cat.default", "c.py:137", [_t(2, 0, 2, SAME)]),
              _op(3, "aten.native_layer_norm.default", "m.py:276",
                  [_t(3, i, 3 + i, SAME) for i in range(3)], module="M.ln")]
    outs = [{"module": "M.attn", "source": "c.py:137", "op": "aten.clone.default",
             "orig": "aten.cat.default", "node": "clone_2"},
            {"module": "M.attn", "source": "c.py:136", "op": "aten.clone.default",
             "orig": "aten.cat.default", "node": "clone_1"},
            {"module": "M.ln", "source": "m.py:276", "op": "aten.var_mean.correction",
             "orig": "aten.native_layer_norm.default", "multi": True, "index": 0}]
    kernel = _op(0, "inductor.cpp_fused_cat_split_0", "", [_t(0, i, 10 + i, SAME) for i in
                                                           range(3)],
                 extra={"compiled": "inductor", "outputs": outs})
    pairs = {p.my.idx: p for p in compiled_pairs([kernel], golden) if p.my is not None}
    assert pairs[0].golden_op.seq == 2 and pairs[1].golden_op.seq == 1  # v, then k
    assert pairs[2].golden is None and "output 0 of aten.var_mean" in pairs[2].reason
    assert pairs[2].reason.startswith("only in my run")


def test_replay_of_the_compiled_gpt2_judges_every_kernel_honest(gpt2, tmp_path):
    """The loss kernel finishes its reductions in place in memory it reuses (`buf7 = buf6  #
    reuse`, an in/out pointer): that memory held nothing before the launch. Taken as the
    kernel's input, its reference divided garbage and named the clean kernel the culprit."""
    from accuracy.replay import replay

    eager, comp = gpt2
    out = tmp_path / "replay.h5"
    r = replay(comp, out)
    assert r.failed == 0
    rep = compare(comp, eager, replay=out)
    counts = rep.summary["counts"]
    assert counts["error"] == 0 and counts["warning"] == 0, rep.format()
    assert rep.culprit is None
    with load_dump(out) as d:
        kernels = [rec.extra["replay"] for rec in d.records if rec.op.startswith("inductor.")
                   and rec.extra.get("replay", {}).get("status") == "ok"]
    assert len(kernels) >= 15  # the kernels really were re-run as their ATen ops
