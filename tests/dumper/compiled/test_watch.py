"""Never silently blind: compiled regions entered inside `dumper(...)` / `live_check` are
recorded with how they ran, and every reader says so before any verdict.

Dynamo declined every frame while the dumper's TorchDispatchMode was active, so a compiled
region ran its eager code and a compare of such dumps printed a bare PASS over compiled code
nobody saw. Now the dumper's mode steps aside while dynamo compiles; a region whose compiled
program the dumper cannot see into (here: a backend it does not know) is reported by name.
Small custom backends keep these tests fast (Inductor's are in test_inductor.py).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from accuracy import dumper, live_check, load_dump
from accuracy.compare import compare
from accuracy.dumpfile.describe import describe


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.fc1 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc1(self.ln(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def opaque(gm, example_inputs):
    """A backend the dumper does not know: what its program computes is not seen as such."""
    return gm.forward


def _model(backend=opaque) -> tuple[Net, object]:
    torch.manual_seed(0)
    net = Net()
    net.blocks[1] = torch.compile(net.blocks[1], backend=backend)  # regional compilation

    @torch.compile(backend=backend)
    def loss_fn(y: torch.Tensor) -> torch.Tensor:
        return (y * y).mean()
    return net, loss_fn


def _step(net: Net, loss_fn, x: torch.Tensor) -> None:
    loss_fn(net(x)).backward()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_dump_records_each_compiled_region_and_how_it_ran(tmp_path):
    net, loss_fn = _model()
    x = torch.randn(4, 8)
    with dumper(tmp_path / "c.h5", mode="statistics"):
        _step(net, loss_fn, x)
    attrs = load_dump(tmp_path / "c.h5").attrs
    assert attrs["compiled_watch"] == "on"
    regions = {r["kind"]: r for r in attrs["compiled_regions"]}
    assert set(regions) == {"module", "function"}
    mod, fn = regions["module"], regions["function"]
    assert "blocks.1" in mod["name"] and "(Block)" in mod["name"]
    assert fn["name"].endswith("loss_fn")
    for r in (mod, fn):
        assert r["status"] == "not-recorded" and "cannot see into" in r["reason"]
        assert r["backend"] == "opaque" and r["calls"] == 1 and r["steps"] == [0]
    # `accuracy info` says it first, right after the file's state
    lines = describe(tmp_path / "c.h5").format().splitlines()
    assert lines[1].startswith("  BLIND: ") and "blocks.1" in lines[1]
    assert lines[2].startswith("  BLIND: ") and "loss_fn" in lines[2]


def test_aten_backends_are_recorded_op_by_op(tmp_path):
    net, loss_fn = _model("aot_eager")
    with dumper(tmp_path / "a.h5", mode="statistics"):
        _step(net, loss_fn, torch.randn(4, 8))
    d = load_dump(tmp_path / "a.h5")
    assert [r["status"] for r in d.attrs["compiled_regions"]] == ["recorded-compiled"] * 2
    assert "BLIND" not in describe(tmp_path / "a.h5").format()
    # the region ran compiled: aot_eager's decomposed graph, not eager's ops
    assert any(r.op == "aten.native_layer_norm.default" and r.module == "Net.blocks.0.ln"
               for r in d.records)
    fwd = [r.op for r in d.records if r.phase == "forward"]
    assert fwd.count("aten.addmm.default") == 3 and fwd.count("aten.gelu.default") == 3
    # each op of the graph keeps its original module (not `GraphModule`)
    inside = {(r.op, r.module) for r in d.records if r.phase == "forward"}
    assert ("aten.addmm.default", "Net.blocks.1.fc1") in inside
    assert ("aten.native_layer_norm.default", "Net.blocks.1.ln") in inside
    assert not any("GraphModule" in r.module for r in d.records)


def test_an_exported_program_keeps_its_module_names(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    program = torch.export.export(Net(), (x,)).module()
    with dumper(tmp_path / "x.h5", mode="statistics"):
        program(x).sum().backward()
    recs = load_dump(tmp_path / "x.h5").records
    fwd = [(r.op, r.module) for r in recs if r.phase == "forward"]
    assert ("aten.addmm.default", "Net.blocks.1.fc1") in fwd
    assert ("aten.native_layer_norm.default", "Net.blocks.2.ln") in fwd
    assert ("aten.gelu.default", "Net.blocks.0") in fwd
    assert any(r.phase == "backward" and r.module == "Net.blocks.1.fc1" for r in recs)


def test_an_eager_job_has_no_compiled_regions(tmp_path):
    torch.manual_seed(0)
    net = Net()
    with dumper(tmp_path / "e.h5", mode="statistics"):
        net(torch.randn(2, 8)).sum().backward()
    attrs = load_dump(tmp_path / "e.h5").attrs
    assert attrs["compiled_regions"] == [] and attrs["compiled_watch"] == "on"
    assert "BLIND" not in describe(tmp_path / "e.h5").format()


def test_compare_never_prints_a_bare_pass_over_unseen_compiled_code(tmp_path):
    net, loss_fn = _model()
    x = torch.randn(4, 8)
    for name in ("my", "golden"):
        with dumper(tmp_path / f"{name}.h5", mode="statistics"):
            _step(net, loss_fn, x)
    rep = compare(tmp_path / "my.h5", tmp_path / "golden.h5")
    assert rep.summary["verdict"] == "pass"
    text = rep.format().splitlines()
    blind = [i for i, t in enumerate(text) if t.startswith("  BLIND: ")]
    assert len(blind) == 4 and blind == list(range(1, 5))  # first, both sides, both regions
    verdict_line = next(t for t in text if t.startswith("  rows "))
    assert not verdict_line.endswith("->  PASS")
    assert "4 compiled region(s) not seen as compiled" in verdict_line
    paths = rep.write(tmp_path / "report", ("json", "html"))
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert len(summary["blind"]) == 4
    page = paths["html"].read_text()
    assert page.index("Not seen (compiled code") < page.index("Divergence chart")


def test_a_dump_of_an_eager_job_compares_without_blind_lines(tmp_path):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 8)
    for name in ("my", "golden"):
        with dumper(tmp_path / f"{name}.h5", mode="statistics"):
            net(x).sum().backward()
    rep = compare(tmp_path / "my.h5", tmp_path / "golden.h5")
    assert rep.summary["blind"] == [] and "BLIND" not in rep.format()
    assert rep.format().splitlines()[1].endswith("->  PASS")


def test_a_region_runs_compiled_under_the_live_check_and_stays_compiled():
    """Under the live check a region runs its compiled program (the check's mode steps aside
    while dynamo compiles; before, dynamo declined it and marked the frame skipped for good),
    and the program compiled there serves the job's later calls, checked or not."""
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def f(x):
        return (x * 2).sin()

    x = torch.randn(3)
    for _ in range(2):
        with live_check() as lc:
            f(x)
        [region] = lc.report()["compiled_regions"]
        # a backend the check cannot see into: its ATen calls were checked, said BLIND
        assert region["status"] == "not-recorded"
        assert any(r.op == "aten.sin.default" for r in lc.results)
    assert len(compiles) == 1
    f(x)
    assert len(compiles) == 1


def test_a_region_declined_under_another_mode_compiles_again_after_it():
    """Dynamo marks a frame it declined as skipped for good; a region declined under a mode
    dynamo does not trace through (`sim`'s, inside a live check) must not stay eager for the
    rest of the job once that mode is gone."""
    from accuracy.device_backend import sim

    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def f(x):
        return (x * 2).sin()

    x = torch.randn(3)
    for _ in range(2):
        with sim(profile="bf16"), live_check() as lc:
            f(x)
        assert [r["status"] for r in lc.report()["compiled_regions"]] == ["ran-eager"]
        assert "TorchDispatchMode" in lc.report()["compiled_regions"][0]["reason"]
    assert compiles == []
    f(x)
    assert len(compiles) == 1


def test_live_check_says_which_compiled_regions_it_did_not_check():
    net, loss_fn = _model()
    with live_check() as lc:
        loss_fn(net(torch.randn(4, 8)))
    names = [r["name"] for r in lc.report()["compiled_regions"]]
    assert any("blocks.1" in n for n in names) and any(n.endswith("loss_fn") for n in names)
    # both ran compiled by a backend the check cannot see into as kernels
    regions = lc.report()["compiled_regions"]
    assert {r["status"] for r in regions} == {"not-recorded"}
    assert all("live check" in r["reason"] for r in regions)
    text = lc.text().splitlines()
    assert text[1].startswith("  BLIND: ") and text[2].startswith("  BLIND: ")
    assert lc.notes[0].startswith("compiled region ")


def test_a_watch_that_cannot_be_installed_is_said(tmp_path, monkeypatch):
    from torch._dynamo import convert_frame

    monkeypatch.delattr(convert_frame.CatchErrorsWrapper, "_handle_skip")  # as if torch moved it
    with dumper(tmp_path / "u.h5", mode="statistics"):
        torch.ones(2).sum()
    attrs = load_dump(tmp_path / "u.h5").attrs
    assert attrs["compiled_watch"].startswith("unavailable: ")
    lines = describe(tmp_path / "u.h5").format().splitlines()
    assert lines[1].startswith("  BLIND: compiled regions were not watched")


def test_a_watch_that_cannot_be_installed_is_logged_once_and_said_in_every_dump(
        tmp_path, monkeypatch, caplog):
    """On a torch whose dynamo internals moved (torch 2.11 on a real GPU machine), a job that
    opens a dumper per step logged the same warning every step; now once per process, while
    every dump still says it (its BLIND line)."""
    from torch._dynamo import convert_frame

    from accuracy.dumper.compiled import watch

    monkeypatch.delattr(convert_frame.CatchErrorsWrapper, "_handle_skip")
    monkeypatch.setattr(watch, "_said", set(), raising=False)
    with caplog.at_level(logging.WARNING, logger=watch.__name__):
        for i in range(3):
            with dumper(tmp_path / f"s{i}.h5", mode="statistics"):
                torch.ones(2).sum()
    said = [r for r in caplog.records if "cannot watch for compiled regions" in r.message]
    assert len(said) == 1, [r.message for r in said]
    for i in range(3):
        assert load_dump(tmp_path / f"s{i}.h5").attrs["compiled_watch"].startswith(
            "unavailable: ")


def test_web_report_page_shows_unseen_compiled_regions_first(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from accuracy.server.app import create_app

    net, loss_fn = _model()
    x = torch.randn(4, 8)
    for name in ("my", "golden"):
        with dumper(tmp_path / f"{name}.h5", mode="statistics"):
            _step(net, loss_fn, x)
    compare(tmp_path / "my.h5", tmp_path / "golden.h5").write(tmp_path / "rep")
    data = tmp_path / "data"
    app = create_app(data, allowed_roots=[tmp_path])
    with TestClient(app, base_url="http://127.0.0.1",
                    headers={"X-Accuracy-Request": "1"}) as c:
        r = c.post("/api/reports/register", json={"path": str(tmp_path / "rep"), "name": "c"})
        assert r.status_code == 201, r.text
        page = c.get(f"/ui/reports/{r.json()['id']}").text
    assert 'id="blind"' in page and page.index('id="blind"') < page.index('id="culprit"')
    assert "<h2>Not seen</h2>" in page  # it lists tensor subclasses too, not only compiled code
    assert "blocks.1 (Block)" in page


def test_a_compiled_model_names_its_parameters_as_the_eager_model(tmp_path):
    """`torch.compile(model)` wraps it in an OptimizedModule: gradient, optimizer and other
    eager rows of the compiled run are named `Net.blocks.0.fc1.weight`, as in the eager run
    (not `OptimizedModule._orig_mod.blocks…`), so they pair."""
    def run(path, compiled: bool | str) -> set[tuple[str, str]]:
        torch.manual_seed(0)
        net = Net()
        model = torch.compile(net, backend=opaque) if compiled is True else net
        if compiled == "regional":  # a block compiled inside the eager model
            net.blocks[1] = torch.compile(net.blocks[1], backend=opaque)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with dumper(path, mode="statistics"):
            model(torch.randn(4, 8)).square().mean().backward()
            opt.step()
        return {(r.phase, r.module) for r in load_dump(path).records
                if r.phase in ("optimizer", "backward") and r.op in (
                    "aten.add_.Tensor", "aten.detach.default")}

    eager, compiled = run(tmp_path / "e.h5", False), run(tmp_path / "c.h5", True)
    assert ("optimizer", "Net.blocks.0.fc1.weight") in eager
    assert compiled == eager
    assert run(tmp_path / "r.h5", "regional") == eager  # not `Net.blocks.1._orig_mod.fc1…`
