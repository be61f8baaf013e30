"""Fixtures of the server tests: the database a test's servers share, on SQLite and on a
throwaway PostgreSQL server (tests/_support/postgres.py)."""

from __future__ import annotations

import pytest

from tests._support.server_data import fresh_database, postgres_or_skip


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def backend(request):
    """None for SQLite; the URL of a throwaway PostgreSQL server (one per module)."""
    if request.param == "sqlite":
        yield None
        return
    with postgres_or_skip() as url:
        yield url


@pytest.fixture
def db_url(backend, tmp_path):
    """A fresh database for each test: a SQLite file in the test's temporary folder (outside
    any data directory), or a new database on the PostgreSQL server."""
    return fresh_database(backend, tmp_path)
