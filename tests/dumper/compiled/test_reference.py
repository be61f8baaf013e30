"""Compare with `-r` on a compiled CNN with GroupNorm: replay's judgment never clears a fault
it could not see (a stranger's trial, issue #26).

The miscompile: a post-grad pass scales the first ReLU's output by 1.05 in the compiled run.
The scaled value is a node the pass created, so replay re-runs it as the graph *after* the
passes (ratio ~1.5) and, before, that ratio cleared its accumulated error: `-r` read PASS.
The fused max-pool values the same kernel writes (ratio ~8e5) paired with nothing ("one output
Inductor keeps"), though eager's `max_pool2d_with_indices` output 0 is that value; and an
unpaired output with a replay ratio was never judged. Compiled once per module (clean and
faulty), Inductor's cache in the test's temporary folder.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accuracy import dumper, load_dump
from accuracy.compare import compare
from tests._support.miscompile import ScaleMatmul, torch_threads

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.timeout(900)]


class CNN(nn.Module):
    def __init__(self, native_pool: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.n1 = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.n2 = nn.GroupNorm(4, 16)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)
        self.native_pool = native_pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._pool(F.relu(self.n1(self.conv1(x))))
        x = F.adaptive_avg_pool2d(F.relu(self.n2(self.conv2(x))), 4)
        return self.fc(x.flatten(1))

    def _pool(self, x: torch.Tensor) -> torch.Tensor:  # the same values, without max_pool
        return self.pool(x) if self.native_pool else x.unflatten(3, (-1, 2)).unflatten(2, (-1, 2)).amax((3, 5))  # noqa: E501


def _step(model: nn.Module) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    F.cross_entropy(model(x), y).backward()


def make_dumps(folder, fault: bool, threads: int = 2, eager: bool = True) -> dict:
    """The eager (with `eager`), amax-pooled eager and compiled dumps of one step, and the
    compiled one's replay, with torch at `threads` CPU threads (the program depends on it)."""
    folder.mkdir()
    with torch_threads(threads):
        return _run(folder, fault, eager)


def _run(folder, fault: bool, eager: bool) -> dict:
    torch.manual_seed(0)
    state = CNN().state_dict()
    out = {k: folder / f"{k}.h5" for k in ("eager", "eager_amax", "compiled")}
    for k, native in (("eager", True), ("eager_amax", False)) if eager else ():
        m = CNN(native)
        m.load_state_dict(state)
        with dumper(out[k], mode="tensor"):
            _step(m)
    torch._dynamo.reset()
    m = CNN()
    m.load_state_dict(state)
    compiled = torch.compile(m)
    miscompile = ScaleMatmul(torch.ops.aten.relu.default, "", first=True) if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        with dumper(out["compiled"], mode="tensor"):
            _step(compiled)
    torch._dynamo.reset()
    from accuracy.replay import replay

    out["replay"] = folder / "replay.h5"
    r = replay(out["compiled"], out["replay"])
    assert r.failed == 0, r.format()
    return out


@pytest.fixture(scope="module")
def one_thread(cache):
    return make_dumps(cache / "one_thread", False, threads=1, eager=False)


def _relu_kernel(comp) -> tuple[int, int, int]:
    """(seq, index of the scaled ReLU output, index of the max-pool values) of the forward
    kernel that fuses the first GroupNorm, its ReLU and the max pool."""
    with load_dump(comp) as d:
        for r in d.records:
            outs = r.extra.get("outputs") or []
            relu = [i for i, o in enumerate(outs) if "aten.relu.default" in (o.get("fused") or [])
                    and o.get("op") == "aten.mul.Tensor" and not o.get("source")]
            pool = [i for i, o in enumerate(outs) if o.get("multi") and o.get("index") == 0
                    and o.get("orig") == "aten.max_pool2d_with_indices.default"]
            if r.extra.get("compiled") and relu and pool:
                return r.seq, relu[0], pool[0]
    raise AssertionError("no kernel holds the pass's scaled relu and the max pool")


def _row(rep, seq: int, idx: int):
    return next(r for r in rep.rows if r.kind == "op" and r.io == "output"
                and r.seq_my == seq and r.tensor_index == idx)


def test_the_fault_is_the_culprit_without_replay(fault):
    seq, _, _ = _relu_kernel(fault["compiled"])
    rep = compare(fault["compiled"], fault["eager"])
    assert rep.culprit is not None and rep.culprit["seq_my"] == seq, rep.culprit


def test_the_fault_is_the_culprit_with_replay(fault):
    seq, relu, pool = _relu_kernel(fault["compiled"])
    rep = compare(fault["compiled"], fault["eager"], replay=fault["replay"])
    assert rep.summary["counts"]["error"] > 0
    assert rep.culprit is not None and rep.culprit["seq_my"] == seq, rep.culprit
    scaled = _row(rep, seq, relu)  # a node the pass created: replay could not see the fault
    assert scaled.local_error_ratio is None and scaled.local_verdict is None
    assert "not judged by replay" in scaled.message and "graph after Inductor's passes" \
        in scaled.message, scaled.message
    assert scaled.verdict == "error", scaled.message
    values = _row(rep, seq, pool)  # eager's max_pool2d_with_indices output 0
    assert values.op_golden == "aten.max_pool2d_with_indices.default", values.message
    assert values.golden_address is not None and values.golden_address.endswith("/output/0")
    assert values.local_excess is not None and values.local_excess > 1e3
    assert values.verdict == "error", values.message


def test_an_output_no_eager_value_holds_is_judged_by_its_local_error(fault):
    seq, _, pool = _relu_kernel(fault["compiled"])
    rep = compare(fault["compiled"], fault["eager_amax"], replay=fault["replay"])
    values = _row(rep, seq, pool)  # eager pooled with amax: no max_pool value to pair with
    assert values.golden_address is None, values.message
    assert "judged by its local error alone" in values.message, values.message
    assert values.verdict == "error" and values.local_excess > 1e3, values.message
    assert rep.culprit is not None and rep.culprit["seq_my"] == seq, rep.culprit


def test_the_clean_cnn_has_no_error_with_replay(clean):
    rep = compare(clean["compiled"], clean["eager"], replay=clean["replay"])
    bad = [(r.op, r.tensor_index, r.message) for r in rep.rows if r.verdict == "error"]
    assert not bad, bad
    alone = [r for r in rep.rows if r.golden_address is None and r.local_excess is not None]
    assert alone and all(r.verdict == "pass" for r in alone), [r.message for r in alone]


def test_a_buffer_an_extern_scatter_finishes_is_not_replayed(clean):
    """max_pool's backward lowers to a kernel filling the gradient with zeros and an
    `aten.scatter_reduce_` writing into it: the kernel's row holds the zeros, not the
    scatter_add node its buffer is named after (replayed, ratio ~1.7e7, a false culprit)."""
    with load_dump(clean["replay"]) as d:
        reasons = [r.extra["replay"].get("reason", "") for r in d.records
                   if r.extra.get("compiled") and r.phase == "backward"]
    assert any("finished in place by extern kernel" in s and "scatter_add" in s
               for s in reasons), reasons


def test_a_buffer_its_own_kernel_scatters_into_is_replayed(one_thread):
    """With one CPU thread Inductor does not call ATen's `scatter_reduce_` for max_pool's
    backward: the kernel zero-filling the buffer runs the scatter too, and its launch leaves
    the scatter_add value, which replay checks. Before, any scatter into the buffer counted
    as a later writer ("a later kernel or ATen call writes it in place"): the value went
    unchecked, and a test leaving torch at one thread (the quick benchmark's `main`) made
    the extern-scatter test above fail in whichever process ran it after."""
    with load_dump(one_thread["compiled"]) as d:
        assert not any("scatter_reduce" in r.op for r in d.records), \
            "Inductor called ATen's scatter with one thread: no fused scatter to check here"
    with load_dump(one_thread["replay"]) as d:
        got = [(i, r.extra["replay"]) for r in d.records
               if r.extra.get("compiled") and r.phase == "backward"
               for i, o in enumerate(r.extra.get("outputs") or [])
               if o.get("op") == "aten.scatter_add.default"]
    assert got, "no backward kernel writes the scatter_add buffer"
    for i, rep in got:
        assert f"output {i} not replayed" not in rep.get("reason", ""), rep.get("reason")
        m = next((m for m in rep.get("outputs") or [] if m.get("idx") == i), None)
        assert m is not None and m.get("reference") == "given" and m["error_ratio"] < 10, m


def test_repro_of_the_max_pool_kernel_runs_and_diverges(fault, tmp_path):
    """The generated script runs a graph calling Inductor's own max-pool prim: it must
    import it (before: AttributeError on `prims._low_memory_max_pool_with_offsets`, exit 1,
    read as DIVERGES); a graph that cannot run exits 2, never 1."""
    import os
    import subprocess
    import sys

    from accuracy.repro.script import write_repro

    seq, _, _ = _relu_kernel(fault["compiled"])
    with load_dump(fault["compiled"]) as d:
        kernel = next(r.op for r in d.records if r.seq == seq)
    out = tmp_path / "repro.py"
    write_repro(fault["compiled"], kernel, out, golden=fault["eager"], seq=seq)
    assert "_low_memory_max_pool_with_offsets" in out.read_text()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(out)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 1 and "DIVERGES" in run.stdout, run.stdout + run.stderr
    broken = tmp_path / "broken.py"
    text = out.read_text().replace("def main():", "def main():\n    raise KeyError('x')")
    broken.write_text(text)
    run = subprocess.run([sys.executable, str(broken)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 2 and "could not run the kernel's graph" in run.stdout
