"""Two servers on one database (PostgreSQL, or one SQLite file) with their own data directories:
each lists, serves and recovers only its own runs, reports and jobs; one data directory still
takes one server."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from accuracy.server import create_app  # noqa: E402
from tests._support.server_data import LOCAL, fresh_database, runs_or_skip, wait_job  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return runs_or_skip(tmp_path_factory.mktemp("runs"))


@contextmanager
def server(data_dir, db_url, files):
    app = create_app(data_dir, db_url=db_url, allowed_roots=[files["golden"].parent, data_dir])
    with TestClient(**LOCAL, app=app) as c:
        yield c


def _register(c, path, name):
    r = c.post("/api/runs/register", json={"path": str(path), "name": name})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_each_server_sees_only_its_own_runs_and_reports(tmp_path, db_url, files):
    from accuracy.server.datalock import DataDirBusy

    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    with server(a_dir, db_url, files) as a, server(b_dir, db_url, files) as b:
        a_my = _register(a, files["my"], "alpha-my.h5")
        a_gold = _register(a, files["golden"], "alpha-golden.h5")
        r = a.post("/api/runs?name=alpha-upload.h5", content=files["golden"].read_bytes(),
                   headers={"content-type": "application/octet-stream"})
        assert r.status_code == 201, r.text
        a_up = r.json()["id"]
        r = a.post("/api/reports/register", json={
            "path": str(files["report"]), "name": "alpha report",
            "my_run_id": a_my, "golden_run_id": a_gold})
        assert r.status_code == 201, r.text
        a_rep = r.json()["id"]
        b_gold = _register(b, files["golden"], "beta-golden.h5")

        assert {x["id"] for x in a.get("/api/runs").json()} == {a_my, a_gold, a_up}
        assert [x["id"] for x in b.get("/api/runs").json()] == [b_gold]
        assert [x["id"] for x in a.get("/api/reports").json()] == [a_rep]
        assert b.get("/api/reports").json() == []
        h = b.get("/api/health").json()
        assert (h["runs"], h["reports"]) == (1, 0)
        h = a.get("/api/health").json()
        assert (h["runs"], h["reports"]) == (3, 1)
        home = b.get("/").text
        assert "beta-golden.h5" in home and "alpha" not in home

        # another server's rows are not found here, whatever the endpoint
        for path in (f"/api/runs/{a_up}", f"/api/runs/{a_my}/ops", f"/api/reports/{a_rep}",
                     f"/api/reports/{a_rep}/rows", f"/api/reports/{a_rep}/rows/0",
                     f"/api/reports/{a_rep}/export?format=csv", f"/ui/reports/{a_rep}"):
            assert b.get(path).status_code == 404, path
        assert b.delete(f"/api/runs/{a_up}").status_code == 404
        assert b.delete(f"/api/reports/{a_rep}").status_code == 404
        assert b.post("/api/jobs", json={"my_run_id": a_my,
                                         "golden_run_id": b_gold}).status_code == 404
        r = b.post("/api/reports/register", json={"path": str(files["report"]),
                                                  "my_run_id": a_my})
        assert r.status_code == 404
        # ... and stay whole on their own server
        assert a.get(f"/api/runs/{a_up}").status_code == 200
        assert (a_dir / "runs" / f"{a_up}.h5").is_file()
        assert a.get(f"/api/reports/{a_rep}/rows").json()["total"] > 0

        # one data directory still takes one server, shared database or not
        with pytest.raises(DataDirBusy):
            create_app(a_dir, db_url=db_url)


def test_a_job_on_one_server_survives_the_others_startup(tmp_path, db_url, files):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    with server(a_dir, db_url, files) as a:
        my, gold = _register(a, files["my"], "my.h5"), _register(a, files["golden"], "g.h5")
        gate = threading.Event()  # holds A's one job slot so its job waits, queued
        a.app.state.services.jobs._pool.submit(gate.wait, 120)
        try:
            r = a.post("/api/jobs", json={"my_run_id": my, "golden_run_id": gold})
            assert r.status_code == 202, r.text
            jid = r.json()["id"]
            with server(b_dir, db_url, files) as b:  # B starts while A's job is queued
                assert a.get(f"/api/jobs/{jid}").json()["status"] == "queued"
                assert b.get(f"/api/jobs/{jid}").status_code == 404
                assert b.get("/api/jobs").json() == []
        finally:
            gate.set()
        j = wait_job(a, jid, ("running", "done", "failed"), timeout=180)
        assert j["status"] == "running", j
        with server(b_dir, db_url, files):  # B restarts while A's job runs
            pass
        j = wait_job(a, jid, timeout=180)
        assert j["status"] == "done", j
        assert a.get(f"/api/reports/{j['report_id']}").status_code == 200


def test_restart_fails_only_its_own_interrupted_jobs(tmp_path, db_url, files):
    """Start-up recovery still fails this server's own orphans on a shared database."""
    from accuracy.server.db import Job

    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    with server(a_dir, db_url, files) as a:
        with server(b_dir, db_url, files) as b:  # B stops with a job running ...
            for c, jid in ((a, "a" * 32), (b, "b" * 32)):  # each server running a job
                storage = c.app.state.services.storage
                with storage.Session.begin() as ses:
                    ses.add(Job(id=jid, status="running", my_run_id="x", golden_run_id="y",
                                data_dir=storage.owner))
        with server(b_dir, db_url, files) as b2:  # ... and comes back
            j = b2.get(f"/api/jobs/{'b' * 32}").json()
            assert j["status"] == "failed" and "restarted" in j["error"]
            assert a.get(f"/api/jobs/{'a' * 32}").json()["status"] == "running"


def test_a_database_from_before_ownership_goes_to_its_first_server(tmp_path, db_url, files):
    """A database written before rows had owners (no data_dir column) still reads: the first
    server that starts on it adopts its rows, a second server does not see them."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    with server(a_dir, db_url, files) as a:
        old = _register(a, files["golden"], "old.h5")
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as con:  # back to the schema of earlier versions
        for table in ("runs", "reports", "jobs"):
            con.execute(text(f"DROP INDEX IF EXISTS ix_{table}_data_dir"))
            con.execute(text(f"ALTER TABLE {table} DROP COLUMN data_dir"))
    engine.dispose()
    with server(a_dir, db_url, files) as a, server(b_dir, db_url, files) as b:
        assert [x["id"] for x in a.get("/api/runs").json()] == [old]
        assert a.get(f"/api/runs/{old}").status_code == 200
        assert b.get("/api/runs").json() == []
        assert b.get(f"/api/runs/{old}").status_code == 404


def test_servers_starting_at_once_create_the_schema_once(backend, tmp_path):
    """Servers started together on a new database (a reboot) all come up: creating the tables
    and migrating them is serialised, not a race that fails some of them."""
    import multiprocessing as mp

    from tests._support.schema_start import start_engine

    ctx = mp.get_context("spawn")
    failures = []
    for trial in range(2):
        if backend is None:
            url = f"sqlite:///{tmp_path / f'fresh{trial}.sqlite'}"
        else:
            url = fresh_database(backend, tmp_path / str(trial))
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=start_engine, args=(url, barrier, results), daemon=True)
                 for _ in range(4)]
        for p in procs:
            p.start()
        try:
            got = [results.get(timeout=90) for _ in procs]
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        failures += [g for g in got if g != "ok"]
    assert failures == []


def test_a_sqlite_server_opens_no_connection_before_it_holds_the_schema_lock(tmp_path):
    """The first thing a connection does is switch the file to WAL, and SQLite refuses switches
    that race with another server's with "database is locked" at once (no busy wait): so no
    connection may open until this server holds the schema lock."""
    import fcntl
    import os

    from accuracy.server.db import make_engine

    path = tmp_path / "index.sqlite"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another server is creating the schema
    done = threading.Event()
    t = threading.Thread(target=lambda: (make_engine(f"sqlite:///{path}").dispose(), done.set()),
                         daemon=True)
    t.start()
    try:
        assert not done.wait(1.0)
        assert path.stat().st_size == 0 and not path.with_name("index.sqlite-wal").exists()
    finally:
        os.close(fd)
    assert done.wait(30)
    assert path.stat().st_size > 0
