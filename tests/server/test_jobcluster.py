"""`accuracy serve --cluster local:2`: the server starts one loopback LocalCluster, its compare
jobs run their batches there, the report equals an in-process compare's rows, and the cluster's
processes are gone once the server stops."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[2]
HEADERS = {"X-Accuracy-Request": "1", "Content-Type": "application/json"}


def _call(base: str, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(base + path, method=method, headers=HEADERS,
                                 data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_compare_job_runs_on_the_servers_cluster(tmp_path):
    from accuracy.compare import load_report
    from accuracy.jsonsafe import jsonable
    from tests._support.server_data import make_runs

    files = make_runs(tmp_path / "runs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    # one hash seed for the server's job and the reference compare below: compare orders the
    # rows of two modules that output the same tensor by set iteration (seen: rows 446/447)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "accuracy.cli", "serve", "--data", str(tmp_path / "data"),
             "--port", str(port), "--cluster", "local:2", "--allow-root", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                _call(base, "GET", "/api/health")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
        m = re.search(r"scheduler (tcp://127\.0\.0\.1:\d+)", log.read_text())
        assert m, log.read_text()

        runs = {k: _call(base, "POST", "/api/runs/register",
                         {"path": str(files[k]), "name": f"{k}.h5"})["id"]
                for k in ("my", "golden")}
        job = _call(base, "POST", "/api/jobs", {"my_run_id": runs["my"],
                                                "golden_run_id": runs["golden"]})
        while job["status"] in ("queued", "running"):
            assert time.monotonic() < deadline + 120, job
            time.sleep(0.3)
            job = _call(base, "GET", f"/api/jobs/{job['id']}")
        assert job["status"] == "done", job
        page = _call(base, "GET", f"/api/reports/{job['report_id']}/rows?limit=1000")
        served = page["items"]
        assert page["total"] == len(served) > 0

        subprocess.run([sys.executable, "-c", "import sys; from accuracy.compare import compare; "
                        "compare(sys.argv[1], sys.argv[2]).write(sys.argv[3], formats=('json',))",
                        str(files["my"]), str(files["golden"]), str(tmp_path / "inproc")],
                       env=env, check=True, timeout=120)
        want = json.loads(json.dumps(jsonable(load_report(tmp_path / "inproc")["rows"])))
        diffs = [(w["index"], {k: (s.get(k), w.get(k)) for k in {*s, *w} if s.get(k) != w.get(k)})
                 for s, w in zip(served, want, strict=True) if s != w]
        assert not diffs, diffs[:3]

        with distributed.Client(m.group(1), timeout=30) as client:  # the work ran there
            prefixes = client.run_on_scheduler(lambda dask_scheduler: list(
                dask_scheduler.task_prefixes))
        assert "accuracy-compare" in prefixes, prefixes

        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        deadline = time.monotonic() + 30
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not _group_alive(proc.pid), "the cluster's workers outlived the server"
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_without_cluster_no_dask_and_a_bad_spec_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    code = ("import sys; from accuracy.server import create_app; create_app(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a")], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
    bad = subprocess.run([sys.executable, "-m", "accuracy.cli", "serve", "--data",
                          str(tmp_path / "b"), "--cluster", "local:x"], env=env,
                         capture_output=True, text=True, timeout=120, start_new_session=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "local:N" in bad.stderr, bad.stderr
