"""The report service under concurrent use, bad uploads, and a server killed mid-job.

- Two compare jobs, good uploads, bad uploads, report registrations and reads, all at once
  against a real uvicorn on 127.0.0.1: afterwards every run and report is listed, each report
  has all its rows, the SQLite index is in WAL mode and passes its integrity check, and no
  file is left behind or written outside the data directory.
- Bad uploads (not HDF5, another program's HDF5, a truncated dump, over the cap with and
  without Content-Length, path names, empty): each a 4xx with a message. tests/server/test_app.py
  has the first of each kind one at a time; here they run among the good ones, with more
  variants.
- A server process SIGKILLed while a compare job runs: the next server on the same data marks
  that job failed (not lost, not still "running"), its index is intact and it runs new jobs.

Run with -s to see the figures: requests, bad uploads tried, anything lost.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import h5py
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from accuracy.server import create_app  # noqa: E402

try:
    from accuracy.compare import compare as _compare  # noqa: F401
    HAVE_COMPARE = True
except ImportError:
    HAVE_COMPARE = False

JOB_TIMEOUT_S = 120
LEAKS = ("Traceback", 'File "', "/work/", "site-packages")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    if not HAVE_COMPARE:
        pytest.skip("accuracy.compare is not installed")
    from tests._support.server_data import make_runs

    return make_runs(tmp_path_factory.mktemp("conc") / "data" / "src")


@contextmanager
def serving(app):
    """uvicorn in a thread on 127.0.0.1, on a port the OS picks; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert t.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(60)
        sock.close()


def _client(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=120, trust_env=False,  # never a proxy
                        headers={"X-Accuracy-Request": "1"})  # a non-browser client


def _files_outside(root: Path, data: Path) -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in root.rglob("*")
            if p.is_file() and not p.is_relative_to(data)}


def _db_check(data: Path) -> None:
    con = sqlite3.connect(data / "index.sqlite", timeout=30)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        con.close()


def _wait_job(c: httpx.Client, jid: str, until=lambda j: j["status"] not in ("queued",
                                                                               "running")):
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        j = c.get(f"/api/jobs/{jid}").json()
        if until(j):
            return j
        assert time.monotonic() < deadline, f"job {jid} is still {j['status']}"
        time.sleep(0.1)


def _bad_uploads(files: dict[str, Path], tmp: Path, cap: int) -> list[tuple[str, dict, int, str]]:
    """(what, request kwargs, expected status, words the message must hold)."""
    golden = files["golden"].read_bytes()
    foreign = tmp / "foreign.h5"
    with h5py.File(foreign, "w") as f:  # a valid HDF5 file another program wrote
        f["weights"] = list(range(1000))
        f.attrs["creator"] = "not accuracy"
    other = foreign.read_bytes()
    text = b"col1,col2\n1,2\n" * 500
    over = golden + b"\0" * (cap - len(golden) + 1)

    def chunks():  # no Content-Length: the cap must hold while streaming
        for i in range(0, len(over), 1 << 20):
            yield over[i:i + (1 << 20)]

    raw = {"headers": {"content-type": "application/octet-stream"}}
    return [
        ("text file, raw body", {"params": {"name": "notes.h5"}, "content": text, **raw},
         422, "not an HDF5 file"),
        ("text file, multipart", {"files": {"file": ("notes.h5", text)}}, 422, "not an HDF5"),
        ("another program's HDF5, raw", {"params": {"name": "w.h5"}, "content": other, **raw},
         422, "not an accuracy dump"),
        ("another program's HDF5, multipart", {"files": {"file": ("w.h5", other)}}, 422,
         "not an accuracy dump"),
        ("a dump cut in half", {"params": {"name": "half.h5"},
                                "content": golden[:len(golden) // 2], **raw}, 422,
         "not a valid accuracy dump"),
        ("over the cap, Content-Length", {"params": {"name": "big.h5"}, "content": over, **raw},
         413, "limit"),
        ("over the cap, streamed", {"params": {"name": "big.h5"}, "content": chunks(), **raw},
         413, "limit"),
        ("over the cap, multipart", {"files": {"file": ("big.h5", over)}}, 413, "limit"),
        ("name ../../evil.h5", {"params": {"name": "../../evil.h5"}, "content": golden, **raw},
         400, "plain file name"),
        ("name ..\\evil.h5", {"params": {"name": "..\\evil.h5"}, "content": golden, **raw},
         400, "plain file name"),
        ("file name ../../evil.h5", {"files": {"file": ("../../evil.h5", golden)}}, 400,
         "plain file name"),
        ("file name /tmp/evil.h5", {"files": {"file": ("/tmp/evil.h5", golden)}}, 400,
         "plain file name"),
        ("form name ../evil", {"files": {"file": ("ok.h5", golden)},
                               "data": {"name": "../evil"}}, 400, "plain file name"),
        ("name with NUL", {"params": {"name": "evil\0.h5"}, "content": golden, **raw}, 400,
         "plain file name"),
        ("empty body", {"params": {"name": "empty.h5"}, "content": b"", **raw}, 400, "empty"),
        ("multipart without a file", {"data": {"name": "x"},
                                      "files": {"other": (None, "just a field")}}, 400,
         "no file part"),
    ]


def test_concurrent_jobs_uploads_and_bad_uploads_keep_the_index_whole(files, tmp_path):
    root = files["golden"].parents[2]  # tmp dir holding data/ and nothing else of ours
    data = files["golden"].parents[1]
    cap = files["golden"].stat().st_size + 4096
    bad = _bad_uploads(files, tmp_path, cap)
    outside_before = _files_outside(root, data) | _files_outside(tmp_path, data)
    app = create_app(data, max_upload_bytes=cap)
    golden = files["golden"].read_bytes()
    t0 = time.monotonic()
    with serving(app) as base, _client(base) as c:
        ids = {}
        for k in ("my", "golden"):
            r = c.post("/api/runs/register", json={"path": str(files[k]), "name": f"{k}.h5"})
            assert r.status_code == 201, r.text
            ids[k] = r.json()["id"]

        def call(kind: str, what: str, method: str, url: str, **kw):
            with _client(base) as cc:  # one connection per task: truly concurrent requests
                return kind, what, cc.request(method, url, **kw)

        tasks = []
        for i in range(2):
            tasks.append(("job", f"compare {i}", "POST", "/api/jobs",
                          {"json": {"my_run_id": ids["my"], "golden_run_id": ids["golden"]}}))
        for i in range(6):
            kw = ({"params": {"name": f"good-{i}.h5"}, "content": golden,
                   "headers": {"content-type": "application/octet-stream"}} if i % 2 else
                  {"files": {"file": (f"good-{i}.h5", golden)}, "data": {"name": f"good-{i}"}})
            tasks.append(("upload", f"good upload {i}", "POST", "/api/runs", kw))
        for i in range(2):
            tasks.append(("report", f"register report {i}", "POST", "/api/reports/register",
                          {"json": {"path": str(files["report"]), "name": f"registered {i}",
                                    "my_run_id": ids["my"], "golden_run_id": ids["golden"]}}))
        for what, kw, status, words in bad:
            tasks.append(("bad", what, "POST", "/api/runs", {**kw, "_expect": (status, words)}))
        for i in range(12):
            tasks.append(("read", f"read {i}", "GET",
                          ("/api/runs", "/api/reports", "/api/jobs", "/api/health")[i % 4], {}))
        # interleave the kinds so jobs, uploads and index writes overlap
        tasks = [tasks[i] for i in sorted(range(len(tasks)), key=lambda i: (i * 7) % len(tasks))]

        expect = {}
        with ThreadPoolExecutor(max_workers=8) as pool:
            futs = []
            for kind, what, method, url, kw in tasks:
                if "_expect" in kw:
                    expect[what] = kw.pop("_expect")
                futs.append(pool.submit(call, kind, what, method, url, **kw))
            results = [f.result() for f in futs]

        jobs, uploaded, reports, refused = [], [], [], []
        for kind, what, r in results:
            body = r.text
            assert r.status_code < 500, f"{what}: {r.status_code} {body}"
            assert str(data) not in body and str(root) not in body, f"{what}: {body}"
            if r.status_code >= 400:  # (2xx bodies hold the ops' recorded call sites)
                assert not any(s in body for s in LEAKS), f"{what}: {body}"
            if kind == "job":
                assert r.status_code == 202, f"{what}: {body}"
                jobs.append(r.json()["id"])
            elif kind == "upload":
                assert r.status_code == 201, f"{what}: {body}"
                uploaded.append(r.json()["id"])
            elif kind == "report":
                assert r.status_code == 201, f"{what}: {body}"
                reports.append(r.json()["id"])
            elif kind == "bad":
                status, words = expect[what]
                msg = r.json().get("error", "")
                assert (r.status_code, True) == (status, words in msg), \
                    f"{what}: expected {status} with {words!r}, got {r.status_code} {body}"
                refused.append(what)
            else:
                assert r.status_code == 200, f"{what}: {body}"
        done = [_wait_job(c, j) for j in jobs]
        assert [j["status"] for j in done] == ["done", "done"], done
        reports += [j["report_id"] for j in done]

        # nothing lost: every run and report listed, every report with all its rows
        runs_listed = {r["id"] for r in c.get("/api/runs").json()}
        reports_listed = {r["id"]: r for r in c.get("/api/reports").json()}
        lost = ({*ids.values(), *uploaded} - runs_listed) | (set(reports) - set(reports_listed))
        short = [rid for rid in reports if rid in reports_listed and
                 c.get(f"/api/reports/{rid}/rows", params={"limit": 1}).json()["total"]
                 != reports_listed[rid]["n_rows"]]
        assert not lost and not short, (lost, short)
        assert len(runs_listed) == 2 + len(uploaded) == 8  # and nothing extra from bad uploads
        for rid in uploaded:  # each stored file intact
            assert (data / "runs" / f"{rid}.h5").read_bytes() == golden
    took = time.monotonic() - t0
    _db_check(data)
    assert {p.stem for p in (data / "runs").iterdir()} == set(uploaded)
    assert not list((data / "tmp").iterdir())
    assert {p.name for p in (data / "reports").iterdir()} == {j["report_id"] for j in done}
    outside_after = _files_outside(root, data) | _files_outside(tmp_path, data)
    assert outside_after == outside_before, set(outside_after) ^ set(outside_before)
    assert not [p for p in root.rglob("*evil*")] and not Path("/tmp/evil.h5").exists()
    print(f"\n[concurrency] {len(tasks)} requests at once in {took:.1f}s: 2 compare jobs, "
          f"{len(uploaded)} good uploads, {len(reports) - 2} report registrations, "
          f"{len(refused)} bad uploads refused (of {len(bad)} tried: "
          f"{sum(1 for w in bad if w[2] == 422)}x422, {sum(1 for w in bad if w[2] == 413)}x413, "
          f"{sum(1 for w in bad if w[2] == 400)}x400); runs listed {len(runs_listed)}, "
          f"reports listed {len(reports_listed)}; lost {len(lost)}; index: WAL, integrity ok")


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (from /proc; [] where there is none)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _kill_but_tracker(pgid: int) -> None:
    """SIGKILL the server and its compare child, not multiprocessing's resource tracker, as
    an OOM kill of the server leaves it: the tracker then unlinks the semaphores the dead
    held (killing the whole group left three in /dev/shm per run). The group goes in the end
    (the tracker exits once its clients are gone; whatever is left after 15 s is killed)."""
    if not Path("/proc/self/stat").exists():  # no /proc to tell the tracker apart
        os.killpg(pgid, signal.SIGKILL)
        return
    for pid in _group(pgid):
        try:
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        live = _group(pgid)
        if not live or live == [pgid]:  # the server itself: a zombie until waited for
            break
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_killed_mid_job_marks_it_failed(files, tmp_path):
    """A real `accuracy serve` process (and its compare child) SIGKILLed while a job runs."""
    data = tmp_path / "killed"
    data.mkdir()
    for k in ("my", "golden"):
        (data / f"{k}.h5").write_bytes(files[k].read_bytes())
    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "accuracy.cli", "serve", "--data", str(data), "--host",
         "127.0.0.1", "--port", str(port), "--run", str(data / "my.h5"),
         "--run", str(data / "golden.h5")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        with _client(base) as c:
            while True:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    if c.get("/api/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "accuracy serve did not come up"
                time.sleep(0.1)
            runs = {r["name"]: r["id"] for r in c.get("/api/runs").json()}
            r = c.post("/api/jobs", json={"my_run_id": runs["my.h5"],
                                          "golden_run_id": runs["golden.h5"], "replay": True})
            assert r.status_code == 202, r.text
            jid = r.json()["id"]
            # killed once the compare child has started working (replaying), not before
            running = _wait_job(c, jid, until=lambda j: j["status"] != "queued"
                                and (j["stage"] not in ("queued", "starting")
                                     or j["status"] != "running"))
            assert running["status"] == "running", running
        _kill_but_tracker(proc.pid)  # the server and the compare child it spawned
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log.close()

    _db_check(data)
    with serving(create_app(data)) as base, _client(base) as c:
        j = c.get(f"/api/jobs/{jid}").json()
        assert j["status"] == "failed" and "restarted" in j["error"], j
        assert {r["name"] for r in c.get("/api/runs").json()} >= {"my.h5", "golden.h5"}
        r = c.post("/api/jobs", json={"my_run_id": runs["my.h5"],
                                      "golden_run_id": runs["golden.h5"]})
        again = _wait_job(c, r.json()["id"])
        assert again["status"] == "done", again
        assert c.get(f"/api/reports/{again['report_id']}").status_code == 200
        indexed = {r["id"] for r in c.get("/api/runs").json()}
    _db_check(data)
    left = [p.name for p in (data / "reports").iterdir() if p.name != again["report_id"]]
    left += [p.name for p in (data / "runs").iterdir() if p.stem not in indexed]
    # the killed job's partial files (replay dump, report dir) do not outlive the restart
    assert not left, left
    print(f"\n[restart] server SIGKILLed with job {running['stage']!r} running: job marked "
          f"{j['status']} ({j['error']}); runs kept; a new job ran to done; unindexed partial "
          f"files left by the killed job (replay dump, report dir): {len(left)}")
