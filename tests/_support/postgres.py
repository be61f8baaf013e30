"""A throwaway PostgreSQL server for tests: initdb into a temporary directory, `pg_ctl start` on
127.0.0.1 with a free port (as the `postgres` user when run as root: postgres refuses root),
stopped and removed at the end. `postgres_url()` says why it cannot run, or yields the URL."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


def unavailable() -> str | None:
    """Why no throwaway PostgreSQL can run here, or None."""
    if _bin("initdb") is None or _bin("pg_ctl") is None:
        return "PostgreSQL's initdb/pg_ctl not found (make postgres-deps installs them)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (the 'server' extra)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser (postgres refuses to run as root)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_url() -> Iterator[str]:
    """Start a throwaway server; yield its SQLAlchemy URL; stop and remove it."""
    root = Path(tempfile.mkdtemp(prefix="accuracy-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    run = {"check": True, "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "timeout": 120}
    try:
        subprocess.run([*as_user, _bin("initdb"), "-D", str(data), "-U", "postgres",
                        "--auth=trust", "-E", "UTF8", "--no-sync"], **run)
        subprocess.run([*as_user, _bin("pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w",
                        "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
                        "start"], **run)
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*as_user, _bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                            "stop"], **{**run, "check": False})
    finally:
        shutil.rmtree(root, ignore_errors=True)
