"""The report page in a real browser: uvicorn on 127.0.0.1, headless Chromium loads the page, the
divergence chart and the table render, and a screenshot is kept under test-artifacts/."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(*args: str, profile: Path, timeout: int = 90) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--no-first-run",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}",
           # the network off: every name but the test server's address fails to resolve, so a
           # page that needs a CDN renders blank here
           "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("headless Chromium not found (apt-get install chromium; see DEVELOPERS.md)")
    pytest.importorskip("accuracy.compare")
    from fastapi.testclient import TestClient

    from accuracy.server import create_app
    from tests._support.server_data import make_runs

    files = make_runs(tmp_path_factory.mktemp("runs"))
    data = tmp_path_factory.mktemp("data")
    local = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
    with TestClient(**local, app=create_app(data, allowed_roots=[files["my"].parent])) as c:
        ids = {k: c.post("/api/runs/register", json={"path": str(files[k])}).json()["id"]
               for k in ("my", "golden")}
        rep = c.post("/api/reports/register", json={
            "path": str(files["report"]), "name": "browser report",
            "my_run_id": ids["my"], "golden_run_id": ids["golden"]}).json()
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "accuracy.cli", "serve", "--data", str(data), "--host",
         "127.0.0.1", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150  # a loaded CI machine starts python slowly
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()  # reading a live server's pipe would block until the timeout
                    out = proc.communicate(timeout=10)[0].decode() if proc.stdout else ""
                    pytest.fail(f"server did not start: {out[-2000:]}")
                time.sleep(0.3)
        yield base, rep, ids
    finally:
        proc.terminate()
        proc.wait(10)


def test_report_page_renders_chart_and_table(served, tmp_path):
    base, rep, _ = served
    url = f"{base}/ui/reports/{rep['id']}"
    dom = _chromium("--virtual-time-budget=15000", "--dump-dom", url, profile=tmp_path / "p1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-chart="ready"' in html, "the chart script did not finish"
    assert "u-wrap" in html and "<canvas" in html, "uPlot did not draw the divergence chart"
    table = html[html.find('id="rows"'):]
    assert table.count('<tr class="v-') == 50, "the table's first page did not render"
    assert "aten.mm.default" in html[html.find('id="culprit"'):], "culprit card missing"
    assert "of " + str(rep["n_rows"]) in html

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report_page.png"
    shot.unlink(missing_ok=True)
    r = _chromium("--virtual-time-budget=15000", f"--screenshot={shot}",
                  "--window-size=1400,1600", url, profile=tmp_path / "p2")
    assert r.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]

    op = f"{base}/ui/reports/{rep['id']}/rows/{rep['summary']['culprit']['index']}"
    shot_op = ARTIFACTS / "op_page.png"
    r = _chromium("--virtual-time-budget=15000", f"--screenshot={shot_op}",
                  "--window-size=1400,1600", op, profile=tmp_path / "p3")
    assert r.returncode == 0 and shot_op.exists()


def _dom(url: str, profile: Path) -> str:
    dom = _chromium("--virtual-time-budget=15000", "--dump-dom", url, profile=profile)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def _marker(html: str) -> str:
    i = html.find('id="culprit-marker"')
    return html[html.rfind("<", 0, i):html.find(">", i) + 1] if i >= 0 else ""


def test_chart_defaults_to_the_offline_reports_with_the_culprit_marked(served, tmp_path):
    """The offline report's chart (log relative Euclidean distance, dashed culprit line) is
    the default; the marker sits at the culprit's row; the address's metric/log/filters are
    honoured."""
    base, rep, _ = served
    culprit = rep["summary"]["culprit"]["index"]
    html = _dom(f"{base}/ui/reports/{rep['id']}", tmp_path / "p1")
    assert 'data-chart="ready"' in html
    assert 'data-metric="rel_euc_dist"' in html and 'data-log="1"' in html, \
        "the default chart is not the log distance"
    marker = _marker(html)
    assert marker and f'data-index="{culprit}"' in marker, "no culprit marker on the chart"
    assert "left:" in marker.replace(" ", "")

    html = _dom(f"{base}/ui/reports/{rep['id']}?metric=cosine&log=0&verdict=error",
                tmp_path / "p2")
    assert 'data-metric="cosine"' in html and _marker(html), "URL metric ignored"
    assert 'data-log="0"' in html, "URL log=0 ignored"
    body = html[html.find('id="rows"'):]
    body = body[body.find("<tbody>"):body.find("</tbody>")]
    verdicts = re.findall(r'<tr class="v-(\w+)"', body)
    assert verdicts and set(verdicts) == {"error"}, f"URL filter ignored: {verdicts[:5]}"


def test_compare_form_puts_the_device_run_on_the_device_side(served, tmp_path):
    """The CPU run (golden.h5) is the newest and sorts first; the form still preselects the
    sim run as the device and the CPU run as the golden, from their recorded backends."""
    base, _, ids = served
    html = _dom(f"{base}/", tmp_path / "p1")
    form = html[html.find('id="newjob"'):]
    mine = form[form.find('name="my_run_id"'):form.find("</select>")]
    golden = form[form.find('name="golden_run_id"'):]
    golden = golden[:golden.find("</select>")]
    assert re.search(rf'value="{ids["my"]}"[^>]*selected', mine), mine
    assert re.search(rf'value="{ids["golden"]}"[^>]*selected', golden), golden
    assert 'href="/docs"' in html  # the header's API link


def test_api_docs_render_with_the_network_off(served, tmp_path):
    base, _, _ = served
    page = urllib.request.urlopen(f"{base}/docs", timeout=10).read().decode()
    assert "https://" not in page and "/static/vendor/swagger-ui/" in page
    html = _dom(f"{base}/docs", tmp_path / "p1")
    assert "opblock" in html and "/api/reports/{report_id}/rows" in html, \
        "Swagger UI did not render the operations"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "api_docs.png"
    r = _chromium("--virtual-time-budget=15000", f"--screenshot={shot}",
                  "--window-size=1200,1200", f"{base}/docs", profile=tmp_path / "p2")
    assert r.returncode == 0 and shot.exists()
