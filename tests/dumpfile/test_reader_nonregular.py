"""A FIFO, a device or a directory given where a dump file is expected is refused with one
line before anything opens it (opening a FIFO blocks until a writer comes)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from accuracy.cli import main
from accuracy.dumpfile import DumpError, load_dump

UNBLOCK_AFTER_S = 5.0


# A separate process, since h5py holds the GIL while HDF5 waits in open(): every few seconds
# it opens the FIFO's write end if a reader waits there, and says so in `<fifo>.blocked`.
_WATCHDOG = """
import os, sys, time
fifo, mark, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
while True:
    time.sleep(every)
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        continue
    open(mark, "w").close()
"""


@contextmanager
def unblocked(fifo: Path) -> Iterator[list[bool]]:
    """If the code under test still waits on the FIFO after a while, open its write end (so
    the test ends instead of hanging) and record that it blocked."""
    mark = fifo.with_suffix(".blocked")
    dog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(fifo), str(mark),
                            str(UNBLOCK_AFTER_S)])
    blocked: list[bool] = []
    try:
        yield blocked
    finally:
        dog.kill()
        dog.wait()
        if mark.exists():
            blocked.append(True)


@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "p.h5"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("argv", [
    ["info", "{p}"], ["ls", "{p}"], ["verify", "{p}"], ["extract", "{p}", "-o", "{d}/x.h5"],
    ["convert", "{p}", "-o", "{d}/npy"], ["overflow", "{p}"],
    ["replay", "{p}", "-o", "{d}/r.h5"], ["compare", "-m", "{p}", "-g", "{p}", "-o", "{d}/rep"],
])
def test_every_command_refuses_a_fifo(fifo, argv, capsys):
    args = [a.format(p=fifo, d=fifo.parent) for a in argv]
    with unblocked(fifo) as blocked:
        code = main(args)
    cap = capsys.readouterr()
    err = cap.err or cap.out  # verify reports each file's damage on stdout
    assert not blocked, f"{argv[0]} opened the FIFO"
    assert code in (1, 2) and "FIFO" in err and len(err.strip().splitlines()) == 1, err


def test_load_dump_refuses_fifo_and_directory(fifo, tmp_path):
    with unblocked(fifo) as blocked, pytest.raises(DumpError, match="FIFO"):
        load_dump(fifo)
    assert not blocked
    with pytest.raises(DumpError, match="directory"):
        load_dump(tmp_path)
    with pytest.raises(DumpError, match="device"):
        load_dump("/dev/zero")


def test_server_registration_refuses_a_fifo(fifo, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from accuracy.server import create_app

    data = tmp_path / "data"
    app = create_app(data, allowed_roots=[tmp_path])
    with unblocked(fifo) as blocked, TestClient(
            base_url="http://127.0.0.1", headers={"X-Accuracy-Request": "1"}, app=app) as c:
        r = c.post("/api/runs/register", json={"path": str(fifo)})
    assert not blocked
    assert r.status_code == 422 and "FIFO" in r.json()["error"], r.text
