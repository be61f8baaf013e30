"""The web UI's defaults without a browser: the chart's data, the table's source and bound, the
compare form's sides, and the API docs served from the package
(tests/server/routers/test_ui_browser.py renders them in Chromium)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from accuracy.server import create_app  # noqa: E402
from accuracy.server.db import Run  # noqa: E402
from accuracy.server.reportindex import index_report  # noqa: E402
from accuracy.server.routers.ui import compare_defaults  # noqa: E402

LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
NOISE = ("all values below zero_floor 1e-06: rounding noise, not judged; local error 1x an "
         "honest kernel's")
ROWS = [
    {"index": 0, "kind": "op", "io": "output", "op": "aten.mm.default", "phase": "forward",
     "verdict": "pass", "rel_euc_dist": 1e-4, "local_error_ratio": 2075.0,
     "local_bound": 2732.95, "compute_precision": "float16", "reduction_length": 64,
     "source": "/home/someone/model.py:12", "message": "judged at float16"},
    {"index": 1, "kind": "op", "io": "input", "op": "aten.native_layer_norm.default",
     "phase": "forward", "verdict": "pass", "rel_euc_dist": 3e-4},
    {"index": 2, "kind": "op", "io": "output", "op": "aten.native_layer_norm.default",
     "phase": "forward", "verdict": "pass", "rel_euc_dist": 1.4, "cosine": -0.0239,
     "message": NOISE},
    {"index": 3, "kind": "op", "io": "output", "op": "aten.gelu.default", "phase": "forward",
     "verdict": "error", "rel_euc_dist": 4.2e-4, "cosine": 0.9999999154251403},
]
SUMMARY = {"culprit": ROWS[3], "counts": {"pass": 3, "error": 1}}


@pytest.fixture()
def served(tmp_path):
    app = create_app(tmp_path / "data")
    with TestClient(**LOCAL, app=app) as c:
        rep = index_report(app.state.services.storage, SUMMARY, ROWS, name="r")
        yield c, rep.id


def test_chart_is_op_outputs_distance_with_noise_apart_and_the_culprit(served):
    c, rid = served
    body = c.get(f"/ui/reports/{rid}/chart").json()
    assert body["metric"] == "rel_euc_dist"
    assert body["idx"] == [0, 2, 3]  # op outputs only, as the offline chart
    # the layer norm's mean (1e-8 of noise, distance 1.4) is not a passing op high on the chart
    assert body["verdict"] == ["pass", "not judged", "error"]
    assert body["culprit"] == {"index": 3, "op": "aten.gelu.default"}
    assert c.get("/ui/reports/nope/chart").status_code == 404


def test_table_has_source_and_the_honest_bound(served):
    c, rid = served
    page = c.get(f"/ui/reports/{rid}").text
    assert ">model.py:12</td>" in page and 'title="/home/someone/model.py:12"' in page
    assert "(bound 2.73e+03)" in page
    assert "an honest kernel reaches 2733 at float16, K=64" in page
    assert "cosine 0.99999992" in page  # the culprit card: 8 digits, not "1"
    assert 'data-culprit="3"' in page and 'value="rel_euc_dist"' in page


def _run(rid: str, backend: str | None, profile: str | None = None) -> Run:
    return Run(id=rid, name=rid, source="upload", path="", backend=backend, profile=profile)


def test_compare_form_sides_follow_the_recorded_backend():
    cpu, simr, npu = _run("cpu1", "cpu"), _run("sim1", "sim", "fp16-cube"), _run("npu1", "npu")
    assert compare_defaults([cpu, simr]) == ("sim1", "cpu1")  # newest first: cpu listed first
    assert compare_defaults([simr, cpu]) == ("sim1", "cpu1")
    assert compare_defaults([cpu, npu, simr]) == ("npu1", "cpu1")
    assert compare_defaults([_run("a", "cpu"), _run("b", "cpu")]) == ("a", "b")  # no device
    assert compare_defaults([cpu]) == (None, None)


def test_api_docs_come_from_the_package(served):
    c, _ = served
    page = c.get("/docs")
    assert page.status_code == 200 and "https://" not in page.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"):
        url = f"/static/vendor/swagger-ui/{asset}"
        assert url in page.text and c.get(url).status_code == 200
    assert c.get("/openapi.json").status_code == 200
    assert 'href="/docs"' in c.get("/").text  # the header's API link


def test_offline_chart_draws_the_noise_row_at_the_floor_too():
    """The served chart is the offline one: both draw a below-zero-floor row apart."""
    from accuracy.compare.html import COLOURS, chart
    from accuracy.compare.row import Row

    c = chart([Row.from_dict(r) for r in ROWS], SUMMARY["culprit"])
    by_index = {p["index"]: p for p in c["points"]}
    floor_y = c["pad_t"] + c["ph"]
    assert by_index[2]["y"] == pytest.approx(floor_y)  # was log10(1.4): near the top
    assert by_index[2]["fill"] == COLOURS["skipped"] and "not judged" in by_index[2]["tip"]
    assert by_index[0]["y"] < floor_y and by_index[0]["fill"] == COLOURS["pass"]
    assert c["culprit_x"] is not None


def test_chart_reads_rows_without_being_fooled_by_their_strings():
    """The chart reads three keys from each stored row's text; a key spelled inside an op name
    or message (escaped there) is not a key, and a row in another JSON layout is parsed whole."""
    import json

    from accuracy.server.uichart import _point

    tricky = {"index": 1, "kind": "op", "op": 'x", "io": "input', "io": "output",
              "rel_euc_dist": float("nan"), "message": 'a "rel_euc_dist": 5 not judged'}
    assert _point(json.dumps(tricky)) == (True, None, tricky["message"])
    tricky["rel_euc_dist"] = 0.25
    assert _point(json.dumps(tricky, separators=(",", ":"))) == (True, 0.25, tricky["message"])
    assert _point(json.dumps({"kind": "module", "io": "output"}))[0] is False
