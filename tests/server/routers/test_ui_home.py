"""The home page (runs and reports) says what matters without opening a report (#50): each
report's verdict, culprit and the two runs it compared; each run's last verdict and culprit."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from accuracy import dumper  # noqa: E402
from accuracy.server import create_app  # noqa: E402
from accuracy.server.reportindex import index_report  # noqa: E402

LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}


def _rows(page: str, table_id: str) -> list[str]:
    table = page[page.index(f'id="{table_id}"'):]
    table = table[:table.index("</table>")]
    return re.split(r"<tr[ >]", table.split("<tbody>")[1])[1:]


@pytest.fixture()
def home(tmp_path):
    model = torch.nn.Linear(4, 3)
    for name in ("dev.h5", "gold.h5", "spare.h5"):
        with dumper(tmp_path / name):
            model(torch.ones(2, 4))
    app = create_app(tmp_path / "data", allowed_roots=[tmp_path])
    with TestClient(**LOCAL, app=app) as c:
        ids = {n: c.post("/api/runs/register", json={"path": str(tmp_path / n)}).json()["id"]
               for n in ("dev.h5", "gold.h5", "spare.h5")}
        storage = app.state.services.storage
        index_report(storage, {
            "verdict": "error", "my": "/elsewhere/dev.h5", "golden": "/elsewhere/gold.h5",
            "culprit": {"index": 3, "op": "aten.gelu.default", "module": "Net.block.act"}},
            [], name="first", my_run_id=ids["dev.h5"], golden_run_id=ids["gold.h5"])
        index_report(storage, {
            "verdict": "pass", "my": "/x/other_dev.h5", "golden": "/x/other_gold.h5",
            "blind": ["a compiled region"]}, [], name="unindexed runs")
        index_report(storage, {"verdict": ["not", "text"], "culprit": {"op": 5, "index": "3"}},
                     [], name="odd summary")
        yield c.get("/").text, ids


def test_reports_list_shows_verdict_culprit_and_the_runs_compared(home):
    page, _ = home
    rows = {re.search(r">([^<]+)</a>", r).group(1): r for r in _rows(page, "reports")}
    first = rows["first"]
    assert 'class="pill v-error">error<' in first
    assert "<b>aten.gelu.default</b>" in first and "in Net.block.act" in first
    assert "/rows/3" in first
    assert re.search(r"dev\.h5 <span class=\"muted\">vs</span> gold\.h5", first)
    other = rows["unindexed runs"]  # runs not indexed here: the dump files the report names
    assert 'v-pass">pass<' in other and "over what was recorded" in other
    assert "no culprit" in other and "other_dev.h5" in other and "other_gold.h5" in other
    odd = rows["odd summary"]  # a summary is the report's own file: nothing but text shown
    assert "unknown" in odd and "<b>?</b>" in odd and "/rows/" not in odd


def test_runs_list_shows_each_runs_last_verdict_and_culprit(home):
    page, ids = home
    runs = {re.search(r"<td>([^<]+)</td>", r).group(1): r for r in _rows(page, "runs")}
    for name in ("dev.h5", "gold.h5"):
        assert 'v-error">error<' in runs[name] and "aten.gelu.default" in runs[name], name
        assert ">first</a>" in runs[name]
    assert "not compared yet" in runs["spare.h5"] and "pill" not in runs["spare.h5"]
