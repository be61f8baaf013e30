"""Limits of the service against a real `accuracy serve` on 127.0.0.1: a bounded job queue
(429 with Retry-After beyond --max-queued-jobs), and request lines that could name two hosts
(two Host headers, an absolute-form target) refused with 400."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("accuracy.compare")
from tests.server.test_guard import WAIT_S, _read_all, _small_dump, serving  # noqa: E402

MAX_QUEUED = 2


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    with serving(root / "data", root / "serve.log") as s:
        yield s


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    a, b = _small_dump(root / "a.h5"), _small_dump(root / "b.h5")
    with serving(root / "data", root / "serve.log", "--max-queued-jobs", str(MAX_QUEUED),
                 "--run", str(a), "--run", str(b)) as s:
        yield s


def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        data = _read_all(sock)
    return int(data.split(b" ", 2)[1]), data


def test_a_plain_raw_request_is_answered(plain):
    code, _ = _raw(plain.port, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                b"Connection: close\r\n\r\n")
    assert code == 200


def test_two_host_headers_are_refused(plain):
    code, body = _raw(plain.port, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Host: evil.example\r\nConnection: close\r\n\r\n")
    assert code == 400 and b"Host" in body


def test_absolute_form_target_is_refused(plain):
    code, body = _raw(plain.port, b"GET http://evil.example/api/health HTTP/1.1\r\n"
                                   b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert code == 400 and b"absolute" in body


def test_job_queue_is_bounded(server):
    with server.client() as c:
        runs = [r["id"] for r in c.get("/api/runs").json()]
        answers = [c.post("/api/jobs", json={"my_run_id": runs[0], "golden_run_id": runs[1]})
                   for _ in range(MAX_QUEUED + 4)]
        accepted = [r.json()["id"] for r in answers if r.status_code == 202]
        refused = [r for r in answers if r.status_code == 429]
        for job in accepted:
            c.post(f"/api/jobs/{job}/cancel")
    # one job may already run; at most MAX_QUEUED more wait; the others are refused
    assert MAX_QUEUED <= len(accepted) <= MAX_QUEUED + 1, [r.status_code for r in answers]
    assert len(refused) == len(answers) - len(accepted)
    assert all(int(r.headers["Retry-After"]) > 0 for r in refused)
    assert "max-queued-jobs" in refused[0].json()["error"]
