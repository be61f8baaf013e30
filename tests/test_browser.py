"""The report page in a real browser: uvicorn on 127.0.0.1, headless Chromium loads the page, the
divergence chart and the table render, and a screenshot is kept under test-artifacts/."""

from __future__ import annotations

import os
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
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(*args: str, profile: Path, timeout: int = 90) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--no-first-run",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("headless Chromium not found (apt-get install chromium; see DEVELOPERS.md)")
    pytest.importorskip("accuracy.compare")
    from _server_data import make_runs
    from fastapi.testclient import TestClient

    from accuracy.server import create_app

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
        yield base, rep
    finally:
        proc.terminate()
        proc.wait(10)


def test_report_page_renders_chart_and_table(served, tmp_path):
    base, rep = served
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
