"""The user's training never dies because of the dumper, and what it failed to record is said.

Found on a 2-rank DDP job compiled inside `dumper(...)`: dynamo's DDP graph splitter runs the
user's layers on fake parameters while the dumper's mode is still on the stack; the recorder
took statistics of a fake (meta) tensor, raised, and the exception crossed autograd's C++
(`AccumulateGrad`'s constructor), which aborted the process (SIGABRT on both ranks).
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.dumpfile.describe import describe

recorder_mod = importlib.import_module("accuracy.dumper.recorder")


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _step(net: torch.nn.Module) -> torch.Tensor:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    loss = net(x).square().mean()
    loss.backward()
    return loss.detach()


def test_an_error_of_ours_leaves_the_op_unrecorded_and_the_step_running(tmp_path, monkeypatch):
    bare = _step(_net())
    real = recorder_mod.Recorder.after

    def after(self, call, outputs):
        if call.plan.name == "aten.addmm.default":
            raise RuntimeError("recorder bug")
        return real(self, call, outputs)

    monkeypatch.setattr(recorder_mod.Recorder, "after", after)
    with dumper(dump_path=tmp_path / "my.h5"):
        loss = _step(_net())
    monkeypatch.undo()
    assert torch.equal(loss, bare)  # the step ran, with the same numbers
    with load_dump(tmp_path / "my.h5") as d:
        assert d.attrs["complete"]
        failed = d.attrs["ops_not_recorded"]
        assert failed["count"] == 2 and failed["first"].startswith("aten.addmm.default seq ")
        assert "recorder bug" in failed["first"]
        assert not any(r.op == "aten.addmm.default" for r in d.records)
        assert any(r.op == "aten.gelu.default" for r in d.records)  # the rest is recorded
    text = describe(tmp_path / "my.h5").format()
    assert "BLIND: 2 op(s) ran but were not recorded: the dumper failed on them" in text
    with dumper(dump_path=tmp_path / "golden.h5"):
        _step(_net())
    rep = compare(tmp_path / "my.h5", tmp_path / "golden.h5")
    assert any("were not recorded" in b for b in rep.summary["blind"])
    head = rep.format().splitlines()
    assert head[1].startswith("  BLIND: my dump: 2 op(s) ran but were not recorded")
    assert "ops the dumper failed on not recorded" in rep.format()
    assert "compiled region" not in rep.format()  # not mistaken for an unseen compiled region


def test_calls_on_fake_tensors_are_compile_machinery_not_the_step(tmp_path):
    """Tracing under a fake mode computes nothing real: not recorded, and nothing fails."""
    net = _net()
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    fx = fm.from_tensor(torch.randn(3, 8))
    with dumper(dump_path=tmp_path / "d.h5"):
        with fm:  # the fake mode on the stack
            net(fx).sum()
        net(fx).sum()  # fake tensors alone (their own dispatch enters the mode)
        torch.randn(2, 2).exp()  # a real op after it
    with load_dump(tmp_path / "d.h5") as d:
        assert "ops_not_recorded" not in d.attrs
        ops = [r.op for r in d.records]
        seqs = [r.seq for r in d.records]
    with dumper(dump_path=tmp_path / "control.h5"):
        torch.randn(2, 2).exp()
    with load_dump(tmp_path / "control.h5") as d:
        control = [r.op for r in d.records]
    # only real calls: the weights' transposes (real parameters) and the real ops after
    assert ops == ["aten.t.default", "aten.t.default", *control]
    assert seqs == list(range(len(ops)))  # fake calls took no sequence numbers


def test_an_empty_dump_is_no_pass(tmp_path):
    with dumper(dump_path=tmp_path / "empty.h5"):
        pass
    with dumper(dump_path=tmp_path / "golden.h5"):
        _step(_net())
    rep = compare(tmp_path / "empty.h5", tmp_path / "golden.h5")
    assert "NOTHING COMPARED (no verdict)" in rep.format()
    assert "-> PASS" not in rep.format().replace("  ", " ")
    assert rep.exit_code("error") == 1


_DDP = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from accuracy import dumper
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                            world_size=1)
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)
            self.ln2, self.fc2 = torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.ln2(self.fc(self.ln(x))))

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    for path, compiled in ((sys.argv[1], True), (sys.argv[1] + ".eager.h5", False)):
        torch.manual_seed(0)
        m = DDP(Net())
        m = torch.compile(m) if compiled else m
        with dumper(dump_path=path):
            m(x).square().mean().backward()
    dist.destroy_process_group()
    print("step done")
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_ddp_compiled_inside_the_dumper_runs_and_is_recorded(tmp_path):
    """DDP's graph splitter (dynamo's `optimize_ddp`) traces on fake parameters: the step
    used to abort. In its own process: a process group and dynamo's state stay there."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": os.getcwd()}
    script = tmp_path / "ddp.py"
    script.write_text(_DDP)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "ddp.h5"),
                        str(_free_port())], env=env, capture_output=True, text=True,
                       timeout=280, start_new_session=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "step done" in p.stdout
    with load_dump(tmp_path / "ddp.h5") as d:
        assert d.attrs["complete"] and "ops_not_recorded" not in d.attrs
        assert [r["status"] for r in d.attrs["compiled_regions"]] == ["recorded-compiled"], \
            d.attrs["compiled_regions"][0]["reason"]
        assert any(r.op.startswith("inductor.") for r in d.records)
        # the compiled model's parameters are named as in the eager run
        grads = {r.module for r in d.records if r.op == "aten.detach.default"
                 and r.phase == "backward"}
        kernels = {r.module for r in d.records if r.op.startswith("inductor.")
                   and r.phase == "forward"}
    with load_dump(tmp_path / "ddp.h5.eager.h5") as d:
        eager = {r.module for r in d.records if r.op == "aten.detach.default"
                 and r.phase == "backward"}
        eager_modules = {r.module for r in d.records}
    assert grads and grads == eager
    # its kernels are named as eager names their modules: inside DDP's `module` (dynamo
    # traces the wrapped module's frame, `L['self']` is it)
    assert kernels and kernels <= eager_modules, (kernels, eager_modules)
    # the reducer's `mul.out` of each gradient, in another order than eager's, pairs with
    # eager's `mul.out` of the same module, not a transposed weight of it as near by value
    rep = compare(tmp_path / "ddp.h5", tmp_path / "ddp.h5.eager.h5")
    assert rep.summary["counts"]["error"] == 0 and not rep.summary.get("blind"), rep.format()


def _adamw_step(path, fused: bool) -> None:
    torch.manual_seed(0)
    net = _net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, fused=fused, foreach=False if not fused
                            else None)
    with dumper(dump_path=path):
        _step(net)
        opt.step()


def test_an_optimizer_step_compared_with_another_implementation_is_not_a_pass(tmp_path,
                                                                            monkeypatch):
    """Fused AdamW (one `_fused_adamw_` op) against the per-parameter one, in dumps that do
    not name the optimizer's states (made before `extra["optimizer_states"]`, or an optimizer
    whose states the dumper cannot see): the update itself pairs with nothing, however much of
    forward and backward compared; said, and no module summary row passes over ops that were
    never compared. (Named, the states pair: tests/compare/test_optimizer_align.py.)"""
    from accuracy.dumper.optimizer_names import OptimizerNames
    from accuracy.dumper.scope import Scope

    with monkeypatch.context() as m:  # the dumper as it was: states made in step() unknown
        m.setattr(OptimizerNames, "_states", lambda self, ts: [None] * len(ts))
        m.setattr(Scope, "_optimizer_entry", lambda self, t: self._opt_names.get(id(t)))
        _adamw_step(tmp_path / "fused.h5", True)
        _adamw_step(tmp_path / "plain.h5", False)
    rep = compare(tmp_path / "fused.h5", tmp_path / "plain.h5")
    blind = [b for b in rep.summary["blind"] if "optimizer phase" in b]
    assert len(blind) == 1 and "have no golden counterpart" in blind[0]
    assert "1 phase(s) of my run not compared" in rep.format()
    assert rep.exit_code("error") == 1
    fused_rows = [r for r in rep.rows if r.kind == "module" and r.phase == "optimizer"
                  and r.op == "aten._fused_adamw_.default"]
    assert fused_rows and all(r.verdict == "skipped" for r in fused_rows)
    assert all("none of the" in r.message for r in fused_rows)
    # the same implementation on both sides: compared, no such line
    _adamw_step(tmp_path / "fused2.h5", True)
    same = compare(tmp_path / "fused.h5", tmp_path / "fused2.h5")
    assert not same.summary.get("blind") and same.exit_code("error") == 0
