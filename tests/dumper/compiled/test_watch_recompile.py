"""A recompilation inside the dumped step is recorded: which region, which frame, the step,
and dynamo's guard-failure reason; `accuracy info` and compare's summary say so."""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.dumpfile.describe import describe

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")


def _double_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2


def test_a_recompilation_inside_the_dumped_step_is_listed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    f = torch.compile(_double_sin, backend="aot_eager", dynamic=False)
    try:
        with dumper(tmp_path / "eager.h5", mode="statistics"):
            _double_sin(torch.ones(4))
            _double_sin(torch.ones(6))
        with dumper(tmp_path / "re.h5", mode="statistics"):
            f(torch.ones(4))
            f(torch.ones(6))  # a new shape, dynamic=False: the guard on the size fails
    finally:
        torch._dynamo.reset()
    d = load_dump(tmp_path / "re.h5")
    [region] = d.attrs["compiled_regions"]
    assert "_double_sin" in region["name"] and region["calls"] == 2
    [rec] = region["recompiles"]
    assert "_double_sin" in rec["frame"] and rec["step"] == 0
    assert "size mismatch at index 0. expected 4, actual 6" in rec["reason"], rec["reason"]
    info = describe(tmp_path / "re.h5").format()
    assert "RECOMPILED: compiled region" in info and "_double_sin" in info
    rep = compare(tmp_path / "re.h5", tmp_path / "eager.h5")
    assert any("was recompiled" in s for s in rep.summary["recompiles"])
    assert "RECOMPILED: my dump: compiled region" in rep.format()


def test_no_recompilation_lists_nothing(tmp_path):
    torch._dynamo.reset()
    f = torch.compile(_double_sin, backend="aot_eager", dynamic=False)
    try:
        with dumper(tmp_path / "once.h5", mode="statistics"):
            f(torch.ones(4))
            f(torch.ones(4))
    finally:
        torch._dynamo.reset()
    [region] = load_dump(tmp_path / "once.h5").attrs["compiled_regions"]
    assert region["calls"] == 2 and region["recompiles"] == []
    assert "RECOMPILED" not in describe(tmp_path / "once.h5").format()


def test_a_recompilation_on_a_step_not_recorded_is_not_listed(tmp_path):
    torch._dynamo.reset()
    f = torch.compile(_double_sin, backend="aot_eager", dynamic=False)
    try:
        with dumper(tmp_path / "idle.h5", mode="statistics", steps=[0]) as d:
            f(torch.ones(4))
            f(torch.ones(4))
            d.step()
            f(torch.ones(6))  # recompiled on step 1, which the window does not record
    finally:
        torch._dynamo.reset()
    [region] = load_dump(tmp_path / "idle.h5").attrs["compiled_regions"]
    assert region["steps"] == [0] and region["recompiles"] == []


def test_a_region_on_a_step_not_recorded_is_not_listed_even_with_the_mode_kept(tmp_path):
    """Select mode keeps the dispatch mode installed on every step (seqs count every op):
    a compiled region run only on a step outside `steps` is not listed, not as blind nor
    as recorded, and writes no row."""
    import json

    from accuracy.dumper.filters import SELECTION_FORMAT

    sel = tmp_path / "select.json"
    sel.write_text(json.dumps({"format": SELECTION_FORMAT,
                               "my": [{"seq": 0, "op": "aten.ones.default"}]}))
    torch._dynamo.reset()
    f = torch.compile(_double_sin, backend="aot_eager")
    try:
        with dumper(tmp_path / "sel.h5", mode="statistics", steps=[0], select=sel) as d:
            torch.ones(4)
            d.step()
            f(torch.ones(4))  # step 1: not recorded
    finally:
        torch._dynamo.reset()
    dump = load_dump(tmp_path / "sel.h5")
    assert dump.attrs["compiled_regions"] == []
    assert all(r.step == 0 for r in dump.records)
    assert "BLIND" not in describe(tmp_path / "sel.h5").format()
