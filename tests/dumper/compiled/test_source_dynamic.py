"""A tiny `transformers` Llama step (hidden 64, 2 layers, 4 heads, vocab 128, random init)
compiled with `torch.compile(model, dynamic=True)` (Inductor, CPU) against eager, fp32, on two
batches of different shapes inside one dumper: one compiled program, its sizes symbols.

What a stranger's trial found on it, each fixed:
- replay skipped 21 of 25 kernels: their reference read a symbolic size (a SymInt graph
  input, `primals_2`, or `mul_57 = s0*s1` saved for backward) as a "placeholder that is not one
  of the kernel's input buffers". Sizes are now expressions in the reference, bound per
  launch from the shapes its buffers were recorded with.
- replay failed the backward `add_clone_transpose` kernels (size mismatch): the value its
  in-place output's memory held before the launch was read through the output's view, the
  reused buffer's layout being symbolic; it is now evaluated from the output's live shape.
- `accuracy compare -r` printed a bare PASS with 23 of 25 kernels unjudged by replay; it now
  counts them (`coverage.kernel_launches`, `kernels_replayed`) and says so, as a BLIND line
  when they are half or more.

Compiled once per module, Inductor's cache in the test's temporary folder.
"""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from tests._support.miscompile import inductor_cache

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.filterwarnings("ignore:Using `torch.compile", "ignore::UserWarning"),
              pytest.mark.timeout(900)]

SHAPES = ((2, 16), (3, 8))


def _steps(model, dump) -> None:
    with dumper(dump, mode="tensor"):
        for shape in SHAPES:
            ids = torch.randint(0, 128, shape, generator=torch.Generator().manual_seed(1))
            model(ids, labels=ids).loss.backward()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    with inductor_cache(tmp_path_factory.mktemp("dynamic")) as folder:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, vocab_size=128,
                                       max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg)
        eager, comp = folder / "eager.h5", folder / "compiled.h5"
        _steps(model, eager)
        model.zero_grad()
        torch._dynamo.reset()
        _steps(torch.compile(model, dynamic=True), comp)
        from accuracy.replay import replay

        rp = folder / "replay.h5"
        result = replay(comp, rp)
        yield eager, comp, rp, result


def _kernel_replays(rp) -> dict[int, tuple[str, dict]]:
    with load_dump(rp) as d:
        return {r.seq: (r.op, r.extra.get("replay", {})) for r in d.records
                if r.op.startswith("inductor.")}


def test_replay_binds_symbolic_sizes_and_judges_the_kernels(dumps):
    eager, comp, rp, result = dumps
    assert result.failed == 0  # the backward add_clone_transpose kernels failed before
    with load_dump(comp) as d:
        [region] = d.attrs["compiled_regions"]
        assert region["calls"] == 2 and not region["recompiles"]  # one program, two shapes
        kernels = [r for r in d.records if r.op.startswith("inductor.")]
    runs = _kernel_replays(rp)
    assert len(runs) == len(kernels) >= 40
    # nothing skipped for a size: 21 of 25 kernels per call read one before
    skipped = {op: r.get("reason") for op, r in runs.values() if r.get("status") != "ok"}
    assert not any("placeholder" in str(w) or "symbolic" in str(w) for w in skipped.values()), \
        skipped
    ok = {seq: max(o["error_ratio"] for o in r["outputs"])
          for seq, (_, r) in runs.items() if r.get("status") == "ok"}
    assert len(ok) >= 0.9 * len(runs), skipped
    assert max(ok.values()) < 4, sorted(ok.items(), key=lambda kv: -kv[1])[:3]
    # both calls' launches of a kernel are replayed, each with its own sizes (not the
    # compile's hints)
    by_site: dict[int, list] = {}
    for r in kernels:
        by_site.setdefault(r.extra["kid"], []).append(r)
    both = [k for k, rs in by_site.items() if len({tuple(r.outputs[0].shape) for r in rs}) == 2
            and all(r.seq in ok for r in rs)]
    assert len(both) >= 15, by_site


def test_compare_with_replay_counts_kernels_replay_left_unjudged(dumps):
    eager, comp, rp, _ = dumps
    rep = compare(comp, eager, replay=rp)
    counts = rep.summary["counts"]
    assert counts["error"] == 0 and counts["warning"] == 0, rep.format()
    cov = rep.summary["coverage"]
    runs = _kernel_replays(rp)
    judged = sum(1 for _, r in runs.values() if r.get("status") == "ok")
    assert cov["kernel_launches"] == len(runs) and cov["kernels_replayed"] == judged
    assert judged < len(runs)  # the sdpa backward's kernel has no output to re-run
    assert any(n.startswith(f"not judged by replay: {len(runs) - judged} of {len(runs)} "
                            "compiled kernels") for n in rep.summary["notes"]), rep.format()
    assert not rep.summary["blind"] and rep.exit_code("error") == 0


def test_compare_says_blind_when_replay_judged_most_kernels_not(dumps, tmp_path):
    """A replay of the eager ops only (`ops="aten.*"`) judges no kernel: the compare says
    BLIND, the verdict is qualified and a pipeline fails (a bare PASS before)."""
    eager, comp, _, _ = dumps
    from accuracy.replay import replay

    rp = tmp_path / "aten_only.h5"
    replay(comp, rp, ops="aten.*")
    rep = compare(comp, eager, replay=rp)
    n = rep.summary["coverage"]["kernel_launches"]
    assert rep.summary["coverage"]["kernels_replayed"] == 0
    line = f"not judged by replay: {n} of {n} compiled kernels (not in the replay x{n})"
    assert rep.summary["blind"] == [line], rep.summary["blind"]
    text = rep.format()
    assert f"BLIND: {line}" in text
    assert f"PASS over what was recorded only: {n} of {n} compiled kernels not judged by " \
           "replay" in text, text
    assert rep.exit_code("error") == 1
