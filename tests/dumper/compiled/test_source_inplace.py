"""Kernels that write in place into their inputs (a compiled optimizer step, BatchNorm's
running statistics) are recorded: each written buffer is an output of the kernel's row, its
value before the launch an input, so compare and replay can judge them.

A kernel with no fresh output buffer is recorded all the same: otherwise a compiled AdamW step
leaves 0 kernel rows and a fault in it passes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accuracy import dumper, load_dump
from accuracy.compare import compare
from tests._support.miscompile import inductor_cache

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")


class Scale(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Multiply the first `op` node's output by `factor` (a wrong fused kernel)."""

    def __init__(self, op: torch._ops.OpOverload, factor: float = 1.05) -> None:
        self.op, self.factor = op, factor

    def __call__(self, g: torch.fx.Graph) -> None:
        n = next((n for n in g.nodes if n.target == self.op), None)
        if n is None:
            return
        with g.inserting_after(n):
            m = g.call_function(torch.ops.aten.mul.Tensor, (n, self.factor))
        n.replace_all_uses_with(m)
        m.args = (n, self.factor)

    def uuid(self) -> str:
        return f"accuracy-test-inplace-{self.op}-{self.factor}"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _adamw_dumps(folder, fault: bool) -> tuple:
    x, y = _data()
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    eager, comp = folder / "eager.h5", folder / "compiled.h5"
    with dumper(eager, mode="tensor"):
        F.mse_loss(m(x), y).backward()
        opt.step()
    torch._dynamo.reset()
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    step = torch.compile(opt.step)
    miscompile = Scale(torch.ops.aten.sqrt.default) if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        with dumper(comp, mode="tensor"):
            F.mse_loss(m(x), y).backward()
            step()
    return eager, comp, m


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    with inductor_cache(tmp_path_factory.mktemp("inplace")) as folder:
        yield folder


class _Runs(dict):
    """The AdamW dumps, each made when a test first asks for it."""

    def __init__(self, folder) -> None:
        super().__init__(folder=folder)

    def __missing__(self, key: str) -> tuple:
        (self["folder"] / key).mkdir()
        self[key] = _adamw_dumps(self["folder"] / key, key == "fault")
        return self[key]


@pytest.fixture(scope="module")
def adamw(folder):
    return _Runs(folder)


def _kernels(path) -> list:
    return [r for r in load_dump(path).records if r.op.startswith("inductor.")]


def test_a_compiled_adamw_step_records_its_update_kernels(adamw):
    _, comp, m = adamw["clean"]
    d = load_dump(comp)
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "recorded-compiled", region
    kernels = _kernels(comp)
    assert kernels and d.attrs["compiled_kernels_recorded"] == len(kernels)
    # every parameter, exp_avg and exp_avg_sq written by a kernel: an output, and its value
    # before the launch an input named `<buffer>_before`
    outs = [(r, i, o) for r in kernels for i, o in enumerate(r.extra["outputs"])]
    assert len(outs) >= 3 * len(list(m.parameters()))
    for r, _, o in outs:
        assert f"{o['buffer']}_before" in r.extra["inputs"]
        assert "copy_" not in o["op"]  # the value written, not the copy into the buffer
    # the recorded outputs are the parameters' values after the step
    params = {tuple(p.shape): p.detach() for p in m.parameters()}
    after = [r.outputs[i].load() for r, i, _ in outs]
    for shape, p in params.items():
        assert any(tuple(t.shape) == shape and torch.equal(t, p) for t in after), shape


def test_the_input_before_an_in_place_write_is_its_value_before_the_launch(adamw):
    """The parameter input of the update kernel is the weight before the step, not after."""
    _, comp, m = adamw["clean"]
    w0 = _model()[0].weight.detach()
    ins = [t.load() for r in _kernels(comp) for t in r.inputs
           if tuple(t.shape) == tuple(w0.shape)]
    assert any(torch.equal(t, w0) for t in ins)
    assert not any(torch.equal(t, m[0].weight.detach()) for t in ins)


def test_a_fault_in_the_compiled_optimizer_step_is_the_culprit_with_replay(adamw, tmp_path):
    from accuracy.replay import replay

    eager, comp, _ = adamw["fault"]
    replay(comp, tmp_path / "replay.h5")
    rep = compare(comp, eager, tmp_path / "replay.h5")
    cul = rep.culprit
    assert cul is not None and cul["op"].startswith("inductor.cpp_fused"), rep.format()
    assert "local error" in cul["message"]
    assert "sqrt" in cul["op"]


def test_a_clean_compiled_optimizer_step_has_no_error_with_replay(adamw, tmp_path):
    from accuracy.replay import replay

    eager, comp, _ = adamw["clean"]
    res = replay(comp, tmp_path / "replay.h5")
    assert res.failed == 0
    rep = compare(comp, eager, tmp_path / "replay.h5")
    assert rep.culprit is None and rep.summary["counts"]["error"] == 0, rep.format()
    judged = [r for r in rep.rows if (r.op or "").startswith("inductor.")
              and r.io == "output" and r.local_excess is not None]
    assert len(judged) >= 12  # the update kernels' outputs were judged, not left unmatched


def test_a_compiled_sgd_step_records_momentum_and_parameters(adamw):
    with inductor_cache(adamw["folder"] / "sgd"):
        torch._dynamo.reset()
        x, y = _data()
        m = _model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        step = torch.compile(opt.step)
        path = adamw["folder"] / "sgd.h5"
        with dumper(path, mode="tensor"):
            for _ in range(2):  # the second step updates the momentum buffers in place
                F.mse_loss(m(x), y).backward()
                step()
                opt.zero_grad()
    written = [o["buffer"] for r in _kernels(path) for o in r.extra["outputs"]]
    # both steps' kernels write the parameters in place (graph inputs)
    assert sum(b.startswith(("arg", "primals")) for b in written) >= 2 * len(list(
        m.parameters())), written


def test_kernels_left_without_a_hook_are_named_and_the_region_says_it_compiled_here(
        adamw, monkeypatch):
    """Where the writes of a kernel cannot be found, its launch is said as BLIND by name, and
    a region compiled inside the dumper does not read "made before the dumper started"."""
    from accuracy.dumper.compiled import codegen
    from accuracy.dumpfile.compiled import blind_count, blind_lines

    monkeypatch.setattr(codegen, "_kernel_writes", lambda *a: None)
    with inductor_cache(adamw["folder"] / "unhooked"):
        torch._dynamo.reset()
        m = _model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        step = torch.compile(opt.step)
        path = adamw["folder"] / "unhooked.h5"
        with dumper(path, mode="statistics"):
            F.mse_loss(m(_data()[0]), _data()[1]).backward()
            step()
    attrs = load_dump(path).attrs
    [region] = attrs["compiled_regions"]
    assert region["status"] == "not-recorded"
    assert "compiled inside the dumper" in region["reason"]
    assert "before the dumper" not in region["reason"]
    lines = blind_lines(attrs)
    assert any("without a recording hook (cpp_fused" in x for x in lines), lines
    assert blind_count(attrs) == 2


def test_a_cpp_kernels_writes_are_its_non_const_pointers_without_kernel_args():
    """Where no code generator frame holds the kernel's arguments, a C++ call's argument
    types say which buffers it writes."""
    from accuracy.dumper.compiled.codegen import _kernel_writes

    got = _kernel_writes(["arg0_1", "arg1_1", "buf0", "arg0_1", "ks0"],
                         ["const float*", "const float*", "float*", "float*", "const int64_t"])
    assert got == {"buf0", "arg0_1"}
    assert _kernel_writes(["buf0"], None) is None


class _CopyScale(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Scale what every floating `copy_` writes into a buffer (BatchNorm's running stats) by
    1.05: a pass of its own between the value and the copy, as a wrong kernel would write."""

    def __call__(self, g: torch.fx.Graph) -> None:
        for n in list(g.nodes):
            if n.target == torch.ops.aten.copy_.default \
                    and n.args[1].meta["val"].dtype.is_floating_point:
                with g.inserting_before(n):
                    m = g.call_function(torch.ops.aten.mul.Tensor, (n.args[1], 1.05))
                n.args = (n.args[0], m)

    def uuid(self) -> str:
        return "accuracy-test-copy-scale"


class _CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 2 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        x = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def _bn_dumps(folder, fault: bool) -> tuple:
    torch.manual_seed(0)
    sd = _CNN().state_dict()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)
    eager, comp = folder / "eager.h5", folder / "compiled.h5"
    m = _CNN()
    m.load_state_dict(sd)
    with dumper(eager, mode="tensor"):
        F.cross_entropy(m(x), y).backward()
    torch._dynamo.reset()
    m = _CNN()
    m.load_state_dict(sd)
    cm = torch.compile(m)
    with torch._inductor.config.patch(post_grad_custom_post_pass=_CopyScale() if fault
                                      else None):
        with dumper(comp, mode="tensor"):
            F.cross_entropy(cm(x), y).backward()
    return eager, comp


@pytest.mark.parametrize("fault", [False, True])
def test_batchnorm_running_stats_written_by_a_compiled_kernel_are_judged(folder, fault,
                                                                          tmp_path):
    """A 5% fault on the running statistics gave the same verdict as a clean run; the clean
    run's max-pool backward zero-fills a buffer a later scatter writes: that partial value
    has no reference (re-running the scatter called the honest kernel wrong)."""
    from accuracy.replay import replay

    sub = folder / f"bn-{fault}"
    sub.mkdir()
    with inductor_cache(sub):
        eager, comp = _bn_dumps(sub, fault)
    replay(comp, tmp_path / "replay.h5")
    rep = compare(comp, eager, tmp_path / "replay.h5")
    if not fault:
        assert rep.culprit is None and rep.summary["counts"]["error"] == 0, rep.format()
        return
    cul = rep.culprit
    assert cul is not None and "batch_norm" in cul["op"], rep.format()
    assert cul["module"].endswith(("bn", "bn2")) and "local error" in cul["message"]
