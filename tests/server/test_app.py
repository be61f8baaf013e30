"""The report service over real dumps (dumper) and real reports (compare): uploads, path rules,
tokens, ops and tensors, report paging/filter/sort, exports, jobs, and error hygiene."""

from __future__ import annotations

import csv
import io
import json
import time
import zipfile
from pathlib import Path

import h5py
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from accuracy.server import create_app  # noqa: E402
from accuracy.server.cli import is_loopback  # noqa: E402
from tests._support.server_data import LOCAL, postgres_or_skip, runs_or_skip, wait_job  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return runs_or_skip(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db_url(request):
    """The index on SQLite (the default) and on a throwaway PostgreSQL server."""
    if request.param == "sqlite":
        yield None
        return
    with postgres_or_skip() as url:
        yield url.replace("postgresql+psycopg://", "postgresql://")  # as a user writes it


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, files, db_url):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def client(data_dir, files, db_url):
    app = create_app(data_dir, db_url=db_url,
                     allowed_roots=[files["golden"].parent, data_dir])
    with TestClient(**LOCAL, app=app) as c:
        yield c


@pytest.fixture(scope="module")
def runs(client, files):
    out = {}
    for k in ("my", "golden"):
        r = client.post("/api/runs/register", json={"path": str(files[k]), "name": f"{k}.h5"})
        assert r.status_code == 201, r.text
        out[k] = r.json()["id"]
    return out


@pytest.fixture(scope="module")
def report(client, files, runs):
    r = client.post("/api/reports/register", json={
        "path": str(files["report"]), "name": "my vs golden",
        "my_run_id": runs["my"], "golden_run_id": runs["golden"]})
    assert r.status_code == 201, r.text
    return r.json()


def _no_leak(resp, *paths: Path) -> None:
    body = resp.text
    assert "Traceback" not in body and 'File "' not in body
    for p in paths:
        assert str(p) not in body, f"server path leaked: {body}"
    assert "error" in resp.json()


def _files_under(d: Path) -> set[Path]:
    return {p for p in d.rglob("*") if p.is_file()}


# -- runs and uploads -----------------------------------------------------------------------


def test_health(client):
    r = client.get("/api/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["compare_available"] is True


def test_upload_raw_and_multipart_roundtrip(client, files, data_dir):
    raw = files["golden"].read_bytes()
    r = client.post("/api/runs?name=golden-upload.h5", content=raw,
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["name"] == "golden-upload.h5" and run["ops"] > 100 and run["source"] == "upload"
    assert run["summary"]["by_phase"]["backward"] > 0 and "path" not in run["summary"]
    stored = data_dir / "runs" / f"{run['id']}.h5"
    assert stored.read_bytes() == raw  # stored under its id, not the client's name

    r = client.post("/api/runs", files={"file": ("dev.h5", raw)}, data={"name": "dev run"})
    assert r.status_code == 201, r.text
    second = r.json()
    assert second["name"] == "dev run"
    ids = {x["id"] for x in client.get("/api/runs").json()}
    assert {run["id"], second["id"]} <= ids
    for rid in (run["id"], second["id"]):
        assert client.delete(f"/api/runs/{rid}").status_code == 204
    assert not stored.exists()
    assert client.get(f"/api/runs/{run['id']}").status_code == 404
    assert not list((data_dir / "tmp").iterdir())


def test_upload_non_hdf5_and_foreign_hdf5_are_refused(client, data_dir, tmp_path):
    before = _files_under(data_dir / "runs")
    r = client.post("/api/runs?name=notes.h5", content=b"this is not hdf5" * 100)
    assert r.status_code == 422
    assert "not an HDF5 file" in r.json()["error"]
    _no_leak(r, data_dir)

    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2, 3]
    r = client.post("/api/runs", files={"file": ("foreign.h5", foreign.read_bytes())})
    assert r.status_code == 422
    assert "not an accuracy dump" in r.json()["error"]
    _no_leak(r, data_dir)
    assert _files_under(data_dir / "runs") == before
    assert not list((data_dir / "tmp").iterdir())


def test_upload_over_cap_is_refused_and_leaves_nothing(files, tmp_path):
    d = tmp_path / "capped"
    with TestClient(**LOCAL, app=create_app(d, max_upload_bytes=4096)) as c:
        raw = files["golden"].read_bytes()
        r = c.post("/api/runs?name=big.h5", content=raw)
        assert r.status_code == 413 and "limit" in r.json()["error"]
        r = c.post("/api/runs", files={"file": ("big.h5", raw)})
        assert r.status_code == 413
        assert not _files_under(d / "runs") and not list((d / "tmp").iterdir())


def test_upload_path_names_are_refused(client, files, data_dir):
    raw = files["golden"].read_bytes()
    outside = data_dir.parent
    before = set(outside.iterdir())
    r = client.post("/api/runs?name=../../evil.h5", content=raw)
    assert r.status_code == 400 and "plain file name" in r.json()["error"]
    r = client.post("/api/runs", files={"file": ("../../evil.h5", raw)})
    assert r.status_code == 400
    r = client.post("/api/runs", files={"file": ("..\\evil.h5", raw)})
    assert r.status_code == 400
    assert set(outside.iterdir()) == before
    assert not any("evil" in p.name for p in _files_under(data_dir))


def test_register_outside_allowed_roots_is_refused(client, files, data_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere.h5"
    elsewhere.write_bytes(files["golden"].read_bytes())
    traversal = str(data_dir / ".." / ".." / elsewhere.relative_to(elsewhere.anchor))
    for path in (str(elsewhere), traversal, "/etc/passwd", str(data_dir / ".." / "x.h5")):
        r = client.post("/api/runs/register", json={"path": path})
        assert r.status_code == 403, (path, r.text)
        _no_leak(r, data_dir, tmp_path)
    link = data_dir / "link.h5"
    link.symlink_to(elsewhere)  # inside the root by name, outside once resolved
    try:
        r = client.post("/api/runs/register", json={"path": str(link)})
        assert r.status_code == 403
    finally:
        link.unlink()


def test_token_rules(files, tmp_path):
    d = tmp_path / "tok"
    raw = files["golden"].read_bytes()
    with TestClient(**LOCAL, app=create_app(d, token="s3cret")) as c:
        assert c.get("/api/health").json()["auth"] is True
        assert c.post("/api/runs?name=a.h5", content=raw).status_code == 401
        r = c.post("/api/runs?name=a.h5", content=raw, headers={"Authorization": "Bearer no"})
        assert r.status_code == 401
        assert not _files_under(d / "runs")
        r = c.post("/api/runs?name=a.h5", content=raw,
                   headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 201
        rid = r.json()["id"]
        assert c.get("/api/runs").status_code == 200  # reads open on loopback
        assert c.delete(f"/api/runs/{rid}").status_code == 401
        assert c.post("/api/jobs", json={"my_run_id": rid, "golden_run_id": rid}
                      ).status_code == 401
        assert c.delete(f"/api/runs/{rid}", headers={"X-Accuracy-Token": "s3cret"}
                        ).status_code == 204
    with TestClient(**LOCAL, app=create_app(tmp_path / "tok2", token="s3cret",
                                            protect_reads=True)) as c:
        assert c.get("/api/runs").status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/").status_code == 401
        assert c.get("/?token=s3cret").status_code == 200


def test_serve_refuses_public_host_without_token(tmp_path, capsys):
    from accuracy.cli import main

    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    assert main(["serve", "--data", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "without an API token" in capsys.readouterr().err


# -- ops and tensors ------------------------------------------------------------------------


def test_ops_filters_pages_and_tensor_views(client, runs):
    rid = runs["my"]
    all_ops = client.get(f"/api/runs/{rid}/ops?limit=1000").json()
    r = client.get(f"/api/runs/{rid}/ops", params={"op": "aten.mm", "limit": 3})
    page = r.json()
    assert page["total"] > 3 and len(page["items"]) == 3
    assert all(o["op"] == "aten.mm.default" for o in page["items"])
    bw = client.get(f"/api/runs/{rid}/ops", params={"phase": "backward", "limit": 1000}).json()
    assert 0 < bw["total"] < all_ops["total"]
    assert {o["phase"] for o in bw["items"]} == {"backward"}
    second = client.get(f"/api/runs/{rid}/ops", params={"op": "aten.mm", "limit": 3,
                                                        "offset": 3}).json()
    assert {o["seq"] for o in second["items"]}.isdisjoint({o["seq"] for o in page["items"]})
    mod = client.get(f"/api/runs/{rid}/ops", params={"module": "encoder.layers.0",
                                                     "limit": 1000}).json()
    assert mod["total"] > 0 and all("encoder.layers.0" in o["module"] for o in mod["items"])
    assert client.get(f"/api/runs/{rid}/ops", params={"dtype": "int64"}).json()["total"] > 0

    op = page["items"][0]
    one = client.get(f"/api/runs/{rid}/ops/{op['seq']}").json()
    assert one["outputs"][0]["address"] == op["outputs"][0]["address"]
    addr = op["outputs"][0]["address"]
    t = client.get(f"/api/runs/{rid}/tensor", params={"address": addr}).json()
    assert t["dtype"] == "float32" and t["stats"]["l2"] > 0
    h = client.get(f"/api/runs/{rid}/tensor/histogram", params={"address": addr, "bins": 16})
    h = h.json()
    numel = 1
    for s in t["shape"]:
        numel *= s
    assert len(h["edges"]) == 17 and sum(h["counts"][0]) == numel
    v = client.get(f"/api/runs/{rid}/tensor/values",
                   params={"address": addr, "max_points": 100}).json()
    assert len(v["min"]) <= 100 and v["numel"] == numel
    assert min(x for x in v["min"] if x is not None) == pytest.approx(t["stats"]["min"])
    r = client.get(f"/api/runs/{rid}/tensor", params={"address": "/aten.mm.default/0/output/9"})
    assert r.status_code == 404
    r = client.get(f"/api/runs/{rid}/tensor", params={"address": "../../etc/passwd"})
    assert r.status_code == 404


# -- reports --------------------------------------------------------------------------------


def test_report_summary_hides_paths(client, report, files):
    s = client.get(f"/api/reports/{report['id']}").json()["summary"]
    assert s["counts"]["error"] > 0 and s["culprit"]["op"] == "aten.mm.default"
    assert str(files["my"]) not in json.dumps(s) and str(files["golden"]) not in json.dumps(s)
    assert s["my"] == "my.h5"


def test_report_rows_page_filter_sort(client, report):
    rid = report["id"]
    counts = client.get(f"/api/reports/{rid}").json()["summary"]["counts"]
    total = report["n_rows"]
    seen = []
    for off in range(0, total, 400):
        page = client.get(f"/api/reports/{rid}/rows", params={"offset": off, "limit": 400})
        body = page.json()
        assert body["total"] == total
        seen += [r["index"] for r in body["items"]]
    assert seen == sorted(seen) and len(set(seen)) == total

    err = client.get(f"/api/reports/{rid}/rows", params={"verdict": "error", "limit": 5}).json()
    assert err["total"] == counts["error"] and {r["verdict"] for r in err["items"]} == {"error"}
    both = client.get(f"/api/reports/{rid}/rows", params=[("verdict", "error"),
                                                          ("verdict", "warning")]).json()
    assert both["total"] == counts["error"] + counts["warning"]

    mm = client.get(f"/api/reports/{rid}/rows", params={"op": "aten.mm", "phase": "forward",
                                                        "limit": 1000}).json()
    assert mm["total"] > 0
    assert all(r["op"] == "aten.mm.default" and r["phase"] == "forward" for r in mm["items"])
    glob = client.get(f"/api/reports/{rid}/rows", params={"op": "aten.*norm*"}).json()
    assert glob["total"] > 0 and all("norm" in r["op"] for r in glob["items"])

    asc = client.get(f"/api/reports/{rid}/rows", params={"sort": "cosine", "limit": 200}).json()
    cos = [r["cosine"] for r in asc["items"] if isinstance(r["cosine"], float)]
    assert cos == sorted(cos) and cos[0] < 0.999
    desc = client.get(f"/api/reports/{rid}/rows", params={"sort": "max_abs_err",
                                                          "order": "desc"}).json()
    errs = [r["max_abs_err"] for r in desc["items"] if isinstance(r["max_abs_err"], float)]
    assert errs == sorted(errs, reverse=True)
    bad = client.get(f"/api/reports/{rid}/rows", params={"sort": "data; drop table runs"})
    assert bad.status_code == 400
    assert client.get(f"/api/reports/{rid}/rows", params={"limit": 5000}).status_code == 422


def test_row_detail_side_by_side_histogram_heatmap(client, report):
    rid = report["id"]
    culprit = report["summary"]["culprit"]
    d = client.get(f"/api/reports/{rid}/rows/{culprit['index']}").json()
    assert d["row"]["op"] == "aten.mm.default"
    assert d["my"]["address"] == culprit["my_address"]
    assert d["golden"]["address"] == culprit["golden_address"]
    # tensor dumps: their bytes told apart by the content hash (no bit-pattern sum stored)
    assert "checksum" not in d["my"]["stats"]
    mine, theirs = d["my"]["content_hash"], d["golden"]["content_hash"]
    assert mine and theirs and mine != theirs
    h = client.get(f"/api/reports/{rid}/rows/{culprit['index']}/histogram?bins=32").json()
    assert len(h["counts"]) == 2 and sum(h["counts"][0]) == sum(h["counts"][1])
    m = client.get(f"/api/reports/{rid}/rows/{culprit['index']}/heatmap?max_cells=16").json()
    assert m["grid_rows"] <= 16 and m["max"] == pytest.approx(culprit["max_abs_err"], rel=1e-5)
    s = client.get(f"/api/reports/{rid}/series?metric=cosine&max_points=100").json()
    assert len(s["idx"]) <= 100 and "error" in s["verdict"]


def test_exports(client, report):
    rid = report["id"]
    r = client.get(f"/api/reports/{rid}/export?format=csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == report["n_rows"] and rows[0]["index"] == "0"
    r = client.get(f"/api/reports/{rid}/export?format=json&verdict=error")
    body = r.json()
    assert len(body["rows"]) == body["summary"]["counts"]["error"]
    r = client.get(f"/api/reports/{rid}/export?format=xlsx&verdict=warning")
    assert r.status_code == 200
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        sheet = z.read("xl/worksheets/sheet1.xml").decode()
    assert sheet.count("<row ") == report["summary"]["counts"]["warning"] + 1
    assert client.get(f"/api/reports/{rid}/export?format=pickle").status_code == 422


def test_ui_pages_render(client, report):
    rid = report["id"]
    home = client.get("/")
    assert home.status_code == 200 and "my vs golden" in home.text
    page = client.get(f"/ui/reports/{rid}")
    assert page.status_code == 200
    assert 'id="chart"' in page.text and "/static/vendor/uplot/uPlot.iife.min.js" in page.text
    assert "aten.mm.default" in page.text  # the culprit card
    assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN
    op = client.get(f"/ui/reports/{rid}/rows/{report['summary']['culprit']['index']}")
    assert op.status_code == 200 and 'id="heat"' in op.text and 'id="hist"' in op.text
    assert client.get("/static/vendor/uplot/LICENSE").status_code == 200
    assert client.get("/ui/reports/nope").status_code == 404


def test_startup_import_links_report_to_its_runs(files, tmp_path):
    from accuracy.server.startup import import_paths
    from accuracy.server.storage import Storage

    storage = Storage(tmp_path / "s")
    lines = import_paths(storage, runs=[str(files["my"]), str(files["golden"])],
                         reports=[str(files["report"])])
    rep = storage.reports()[0]
    by_name = {r.name: r.id for r in storage.runs()}
    assert rep.my_run_id == by_name["my.h5"] and rep.golden_run_id == by_name["golden.h5"]
    assert f"/ui/reports/{rep.id}" in lines[-1]
    storage.close()


def test_runs_page_offers_a_compare_form(client, runs):
    page = client.get("/")
    assert 'id="newjob"' in page.text and runs["my"] in page.text


# -- errors ---------------------------------------------------------------------------------


def test_errors_are_json_without_traces_or_paths(client, files, data_dir, tmp_path):
    for url in ("/api/runs/nope", "/api/reports/nope", "/api/reports/nope/rows",
                "/api/jobs/nope", "/api/runs/nope/ops"):
        r = client.get(url)
        assert r.status_code == 404, url
        _no_leak(r, data_dir)
    r = client.post("/api/runs/register", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 422
    _no_leak(r, data_dir)
    # a registered dump that disappears later: a clean 410, not a trace with its path
    gone = data_dir / "gone.h5"
    gone.write_bytes(files["golden"].read_bytes())
    rid = client.post("/api/runs/register", json={"path": str(gone)}).json()["id"]
    gone.unlink()
    r = client.get(f"/api/runs/{rid}/ops")
    assert r.status_code == 410
    _no_leak(r, data_dir, gone)


# -- jobs -----------------------------------------------------------------------------------


def test_compare_job_runs_in_background_and_cancel(client, runs):
    r = client.post("/api/jobs", json={"my_run_id": runs["my"], "golden_run_id": runs["golden"]})
    assert r.status_code == 202
    job = r.json()
    assert job["status"] in ("queued", "running")
    # a second job queued behind it is cancelled before it starts
    second = client.post("/api/jobs", json={"my_run_id": runs["my"],
                                            "golden_run_id": runs["golden"], "replay": True})
    c = client.post(f"/api/jobs/{second.json()['id']}/cancel")
    assert c.status_code == 200 and c.json()["status"] == "cancelled"
    done = wait_job(client, job["id"])
    assert done["status"] == "done", done
    assert done["progress"] == 1.0 and done["report_id"]
    rep = client.get(f"/api/reports/{done['report_id']}").json()
    assert rep["summary"]["culprit"]["op"] == "aten.mm.default"
    assert rep["my_run_id"] == runs["my"]
    assert client.post(f"/api/jobs/{job['id']}/cancel").status_code == 409
    assert client.post("/api/jobs", json={"my_run_id": "nope", "golden_run_id": runs["golden"]}
                       ).status_code == 404


def test_running_job_is_cancelled_for_real(client, runs):
    r = client.post("/api/jobs", json={"my_run_id": runs["my"], "golden_run_id": runs["golden"],
                                       "replay": True})
    jid = r.json()["id"]
    deadline = time.monotonic() + 60
    while client.get(f"/api/jobs/{jid}").json()["status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.post(f"/api/jobs/{jid}/cancel").status_code == 200
    j = wait_job(client, jid, timeout=30)
    assert j["status"] == "cancelled" and j["report_id"] is None


def test_restart_marks_interrupted_jobs_failed(runs, tmp_path):
    from accuracy.server.db import Job

    d = tmp_path / "restart"
    with TestClient(**LOCAL, app=create_app(d)) as c1:
        storage = c1.app.state.services.storage
        with storage.Session.begin() as ses:
            ses.add(Job(id="a" * 32, status="running", my_run_id=runs["my"],
                        golden_run_id=runs["golden"], data_dir=storage.owner))
    with TestClient(**LOCAL, app=create_app(d)) as c2:  # the server comes back on the same data
        j = c2.get(f"/api/jobs/{'a' * 32}").json()
    assert j["status"] == "failed" and "restarted" in j["error"]
