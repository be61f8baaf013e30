"""The offline report (index.html) shows the culprit once: when the first divergence is the
culprit's own row, one box says so instead of a second, identical "First divergence" box
(#50); when they differ, both are shown."""

from __future__ import annotations

import torch

from accuracy import dumper
from accuracy.compare import compare
from accuracy.compare.html import render
from accuracy.device_backend import sim


def _report(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(8, 16)
    with dumper(tmp_path / "golden.h5"):
        model(x).sum().backward()
    model.zero_grad()
    fault = sim.fault("aten.gelu.default", kind="noise", value=0.1)
    with sim(profile="exact", faults=[fault]), dumper(tmp_path / "my.h5"):
        model(x).sum().backward()
    return compare(tmp_path / "my.h5", tmp_path / "golden.h5")


def test_first_divergence_at_the_culprit_is_not_a_second_box(tmp_path):
    report = _report(tmp_path)
    culprit, first = report.summary["culprit"], report.summary["first_divergence"]
    assert culprit["op"] == "aten.gelu.default" and first["index"] == culprit["index"]
    page = render(report.rows, report.summary)
    assert page.count("<b>Culprit (also the first divergence):</b>") == 1
    assert "First divergence:" not in page

    earlier = next(r for r in report.rows if r.index < culprit["index"])
    report.summary["first_divergence"] = dict(first, index=earlier.index)
    page = render(report.rows, report.summary)
    assert "<b>Culprit:</b>" in page and "<b>First divergence:</b>" in page
