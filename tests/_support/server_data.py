"""Real dumps and a real report for the server tests: a golden CPU step, the same step on the
`sim` accelerator with noise injected into one matmul, and `accuracy.compare` over the pair."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from accuracy import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm


def make_runs(root: Path) -> dict[str, Path]:
    """golden.h5, my.h5 (fault on the first aten.mm) and report/ written by compare."""
    from accuracy.compare import compare
    from accuracy.device_backend import sim

    root.mkdir(parents=True, exist_ok=True)
    golden, my, report = root / "golden.h5", root / "my.h5", root / "report"
    with dumper(dump_path=golden, overwrite=True):
        lm_step(tiny_lm(), lm_batch())
    with sim(profile="exact", faults=[sim.fault("aten.mm.default", kind="noise", value=0.1)]):
        with dumper(dump_path=my, overwrite=True):
            lm_step(tiny_lm(), lm_batch())
    compare(my, golden).write(report, formats=("json", "csv"))
    return {"golden": golden, "my": my, "report": report}


# what a legitimate client sends: a loopback Host, and the header that marks a non-browser call
LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}


def runs_or_skip(root: Path) -> dict[str, Path]:
    """`make_runs`, or skip the module where `accuracy.compare` is not installed."""
    try:
        import accuracy.compare  # noqa: F401
    except ImportError:
        pytest.skip("accuracy.compare is not installed")
    return make_runs(root)


@contextlib.contextmanager
def postgres_or_skip() -> Iterator[str]:
    """A throwaway PostgreSQL server's SQLAlchemy URL, or skip with the reason it cannot run."""
    from tests._support.postgres import postgres_url, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    with postgres_url() as url:
        yield url


def wait_job(client, job_id: int, until=("done", "failed", "cancelled"), timeout: float = 120):
    """Poll a job until its status is one of `until`; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        j = client.get(f"/api/jobs/{job_id}").json()
        if j["status"] in until:
            return j
        assert time.monotonic() < deadline, f"job {job_id} still {j['status']} after {timeout}s"
        time.sleep(0.05)


def fresh_database(backend: str | None, folder: Path) -> str:
    """The URL of a new, empty database: a SQLite file in `folder` when `backend` is None,
    else a new database on the PostgreSQL server at `backend`."""
    if backend is None:
        return f"sqlite:///{folder / 'index.sqlite'}"
    import uuid

    from sqlalchemy import create_engine, text

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(backend, isolation_level="AUTOCOMMIT")
    with admin.connect() as con:
        con.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return backend.rsplit("/", 1)[0] + "/" + name
