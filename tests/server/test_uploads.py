"""The upload size cap holds on every path, not only where Content-Length gives it away:
a streamed raw body, and a multipart file just over the cap (inside the multipart slack that
the Content-Length check allows for form overhead)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from accuracy import dumper  # noqa: E402
from accuracy.server import create_app  # noqa: E402

# Sent by every scripted client (the server's cross-site write guard asks for it).
H = {"X-Accuracy-Request": "1"}
RAW = {"content-type": "application/octet-stream", **H}
LOCAL = "http://127.0.0.1"  # a loopback Host, which the server's Host allow-list accepts


@pytest.fixture(scope="module")
def dump_bytes(tmp_path_factory) -> bytes:
    import torch

    p = tmp_path_factory.mktemp("up") / "small.h5"
    with dumper(str(p)):
        torch.ones(8).neg()
    return p.read_bytes()


def _left(d) -> list:
    return [p for sub in ("runs", "tmp") if (d / sub).exists()
            for p in (d / sub).rglob("*") if p.is_file()]


def test_streamed_raw_body_over_the_cap_is_refused(dump_bytes, tmp_path):
    cap = len(dump_bytes) - 1
    d = tmp_path / "data"

    def chunks():  # a generator body: no Content-Length header
        for i in range(0, len(dump_bytes), 1000):
            yield dump_bytes[i:i + 1000]

    with TestClient(create_app(d, max_upload_bytes=cap), base_url=LOCAL) as c:
        r = c.post("/api/runs?name=s.h5", content=chunks(),
                   headers=RAW)
        assert r.status_code == 413 and "limit" in r.json()["error"]
        assert not _left(d) and c.get("/api/runs").json() == []
        r = c.post("/api/runs?name=ok.h5", content=dump_bytes,
                   headers=RAW)
        assert r.status_code == 413  # and with Content-Length too
    with TestClient(create_app(d, max_upload_bytes=len(dump_bytes)), base_url=LOCAL) as c:
        r = c.post("/api/runs?name=ok.h5", content=chunks(),
                   headers=RAW)
        assert r.status_code == 201, r.text  # exactly at the cap is allowed


def test_multipart_file_one_byte_over_the_cap_is_refused(dump_bytes, tmp_path):
    cap = len(dump_bytes) - 1
    d = tmp_path / "data"
    with TestClient(create_app(d, max_upload_bytes=cap), base_url=LOCAL) as c:
        r = c.post("/api/runs", files={"file": ("m.h5", dump_bytes)}, headers=H)
        assert r.status_code == 413 and "limit" in r.json()["error"]
        assert not _left(d) and c.get("/api/runs").json() == []
