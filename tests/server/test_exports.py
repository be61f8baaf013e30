"""The service's CSV and XLSX exports escape formula-like text as the CLI's reports do: a dump
whose module or op names hold spreadsheet formulas exports them as text, never as formulas."""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import h5py
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("xlsxwriter")
from fastapi.testclient import TestClient  # noqa: E402

from accuracy import dumper  # noqa: E402
from accuracy.compare import compare  # noqa: E402
from accuracy.server import create_app  # noqa: E402
from tests._support.crafted import edit_op_texts, reseal  # noqa: E402

LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
FORMULAS = ('=HYPERLINK("http://x","y")', "+cmd|' /C calc'!A0", "@SUM(1,2)", "-1+2")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _dump(path: Path, scale: float) -> None:
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    with dumper(dump_path=path):
        for _ in range(2):
            ((x * scale) @ x).relu().sum()
    with h5py.File(path, "r+") as f:  # names an attacker controls, as a dump holds them
        def formulas(ops: list[dict[str, str]]) -> None:
            for i, r in enumerate(ops):
                r["module"] = FORMULAS[i % len(FORMULAS)]
                r["phase"] = FORMULAS[(i + 1) % len(FORMULAS)]
                r["op"] = FORMULAS[(i + 2) % len(FORMULAS)]
        edit_op_texts(f, formulas)
        reseal(f)  # the attacker recomputes the (unkeyed) metadata hashes


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    my, golden = root / "my.h5", root / "golden.h5"
    _dump(my, 1.01)
    _dump(golden, 1.0)
    compare(my, golden).write(root / "report", formats=("json",))
    data = tmp_path_factory.mktemp("data")
    with TestClient(**LOCAL, app=create_app(data, allowed_roots=[root, data])) as c:
        ids = [c.post("/api/runs/register", json={"path": str(p), "name": p.name}).json()["id"]
               for p in (my, golden)]
        r = c.post("/api/reports/register", json={
            "path": str(root / "report"), "name": "hostile", "my_run_id": ids[0],
            "golden_run_id": ids[1]})
        assert r.status_code == 201, r.text
        yield c, r.json()["id"]


def test_csv_export_has_no_live_formula(hostile):
    c, rid = hostile
    r = c.get(f"/api/reports/{rid}/export?format=csv")
    assert r.status_code == 200
    rows = list(csv.reader(io.StringIO(r.text)))
    cells = [v for row in rows[1:] for v in row]
    assert any("HYPERLINK" in v for v in cells)  # the text is there
    bad = [v for v in cells if v.startswith(FORMULA_START) and not _is_number(v)]
    assert bad == []


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def test_xlsx_export_has_no_formula_cell(hostile):
    c, rid = hostile
    r = c.get(f"/api/reports/{rid}/export?format=xlsx")
    assert r.status_code == 200
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        xml = "".join(z.read(n).decode() for n in z.namelist() if n.startswith("xl/"))
    assert "<f>" not in xml and "<f " not in xml
    assert "HYPERLINK" in xml and "cmd|" in xml and "@SUM(" in xml
