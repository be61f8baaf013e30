"""What a dump says reaches the server's database whole, on SQLite and PostgreSQL: a phase,
backend or name longer than the columns once were (PostgreSQL refused it and failed the job
with its SQL and the row's values in the job's error), and a database error never reaches a
client (one line; the SQL goes to the server log)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import h5py
import pytest

from tests._support import crafted as C

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine, inspect, text  # noqa: E402

from accuracy.server import create_app  # noqa: E402
from tests._support.server_data import LOCAL, wait_job  # noqa: E402

LONG_PHASE = "backward-recompiled-kernel-" + "x" * 40  # the columns held 16 characters
LONG_BACKEND = "npu-" + "y" * 120  # 40
LONG_NAME = "n" * 200  # a report is named "<my> vs <golden>": 404 characters (200)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("long")
    good = C.good_dump(d / "good.h5")

    def edit(f: h5py.File) -> None:
        C.edit_op_texts(f, lambda ops: [o.update(phase=LONG_PHASE) for o in ops])
        f.attrs["backend"] = LONG_BACKEND
    return {"my": C._copy_and_edit(good, d / "my.h5", edit),
            "golden": C._copy_and_edit(good, d / "golden.h5", edit)}


@contextmanager
def server(data_dir, db_url, files):
    app = create_app(data_dir, db_url=db_url, allowed_roots=[files["my"].parent, data_dir])
    with TestClient(**LOCAL, app=app) as c:
        yield c


def _register(c, path: Path, name: str) -> str:
    r = c.post("/api/runs/register", json={"path": str(path), "name": name})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _run_job(c, files) -> dict:
    my, gold = _register(c, files["my"], LONG_NAME), _register(c, files["golden"], LONG_NAME)
    assert c.get(f"/api/runs/{my}").json()["backend"] == LONG_BACKEND
    r = c.post("/api/jobs", json={"my_run_id": my, "golden_run_id": gold})
    assert r.status_code == 202, r.text
    return wait_job(c, r.json()["id"], timeout=180)


def test_long_names_and_phases_from_a_dump_are_stored_whole(tmp_path, db_url, files):
    with server(tmp_path / "data", db_url, files) as c:
        j = _run_job(c, files)
        assert j["status"] == "done", j
        rows = c.get(f"/api/reports/{j['report_id']}/rows").json()
        assert rows["total"] and {r["phase"] for r in rows["items"]} == {LONG_PHASE}
        assert c.get(f"/api/reports/{j['report_id']}").json()["name"] == \
            f"{LONG_NAME} vs {LONG_NAME}"


def test_the_schema_declares_text_of_any_length():
    """A new database never needs the widening below: the tables are declared with TEXT."""
    from accuracy.server.db import TEXT_COLUMNS, Base

    for table, columns in TEXT_COLUMNS.items():
        for column in columns:
            assert getattr(Base.metadata.tables[table].c[column].type, "length", None) is None, \
                f"{table}.{column}"


def test_a_database_made_with_short_columns_is_widened_at_startup(tmp_path, db_url, files):
    from accuracy.server.db import TEXT_COLUMNS

    with server(tmp_path / "data", db_url, files):
        pass
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as con:  # a new database: every such column is TEXT
        for table, columns in TEXT_COLUMNS.items():
            types = {col["name"]: col["type"] for col in inspect(con).get_columns(table)}
            assert all(getattr(types[c_], "length", None) is None for c_ in columns), table
    if engine.dialect.name != "postgresql":  # SQLite never checked a column's length
        engine.dispose()
        return
    with engine.begin() as con:  # the schema earlier versions made
        for table, columns in TEXT_COLUMNS.items():
            for column in columns:
                con.execute(text(f"ALTER TABLE {table} ALTER COLUMN {column} "
                                 "TYPE VARCHAR(16)"))
    with server(tmp_path / "data", db_url, files) as c:
        with engine.connect() as con:
            for table, columns in TEXT_COLUMNS.items():
                types = {col["name"]: col["type"] for col in inspect(con).get_columns(table)}
                assert all(getattr(types[c_], "length", None) is None for c_ in columns), table
        assert _run_job(c, files)["status"] == "done"
    engine.dispose()


def test_a_database_error_reaches_the_client_as_one_line_without_sql(
        tmp_path, db_url, files, monkeypatch, caplog):
    """Whatever the database refuses (here: a report index the database cannot take), the
    job's error says so in one line; the statement and the row's values go to the log."""
    import sqlalchemy.exc

    import accuracy.server.reportindex as ri

    def refused(*a, **k):
        raise sqlalchemy.exc.DataError(
            "INSERT INTO report_rows (report_id, idx, op, phase) VALUES (%(report_id)s, ...)",
            {"phase": "SECRET-ROW-VALUE"}, Exception("value too long for type varchar(16)"))
    monkeypatch.setattr(ri, "index_report", refused)
    with server(tmp_path / "data", db_url, files) as c:
        j = _run_job(c, files)
    assert j["status"] == "failed", j
    err = j["error"]
    assert "database refused to store the result" in err and "\n" not in err
    assert "INSERT" not in err and "SECRET-ROW-VALUE" not in err and "varchar" not in err
    assert "SECRET-ROW-VALUE" in caplog.text  # the server's log has the details
