"""The report service on a shared machine (issue 12, server side): what a web page, a careless
or hostile client, or a second server can do to it.

- Host allow-list (DNS rebinding): a foreign Host is refused (400).
- Cross-site writes: a text/plain upload or a body-less cancel with a foreign Origin is refused
  (403); a write without a JSON body or the X-Accuracy-Request header is refused too.
- Memory: a 16M-element tensor that costs 1.6 MB on disk (never-written blob chunks read back
  as HDF5's fill value) stays under the server's view memory budget (RSS peak of the server
  process measured through /proc, with the peak reset before the request).
- Bodies: JSON bodies are capped (by Content-Length and by the bytes received), a stalled upload
  is dropped after the read timeout, a client that disconnects mid-upload costs one log line.
- The token is checked before any lookup; a 5,000-character path component is a clean 4xx.
- Jobs: a SIGKILLed server's compare child dies too; a SIGKILLed child leaves no `.partial` file
  or report directory; a second server on a held --data is refused and fails nobody's jobs.

Servers run as `accuracy serve` subprocesses on 127.0.0.1, each in its own session, always
killed at the end; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pytest

from accuracy.server.errors import ApiError

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")
from fastapi.testclient import TestClient  # noqa: E402

from accuracy.server import create_app  # noqa: E402
from tests._support.crafted import op_texts, reseal  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
BUDGET_MB = 64
BOMB_ELEMENTS = 16 * 1024 * 1024  # float32: 64 MiB of values (~600 MiB to view whole)
WAIT_S = 60


# -- crafted files -------------------------------------------------------------------------------

def _small_dump(path: Path) -> Path:
    import torch

    from accuracy import dumper

    with dumper(dump_path=path, overwrite=True):
        torch.ones(4, 4) @ torch.ones(4, 4)
    return path


def _fill_bomb(path: Path, elements: int = BOMB_ELEMENTS) -> str:
    """A valid small dump whose last tensor is re-pointed at `elements` float32 zeros: 64 MiB
    of values, ~600 MiB in a careless reader (a float64 copy, sorting, JSON). The zeros are
    written for real: a file whose chunks were never written (1.6 MB on disk, HDF5 reads them
    as zeros) is refused by the layout validator before the server's own budget is reached,
    and this test is about that budget. Returns the tensor's address."""
    from accuracy.dumpfile import schema

    _small_dump(path)
    with h5py.File(path, "r+") as f:
        rows = f[schema.TENSORS][:]
        i = len(rows) - 1
        row = rows[i]
        offset = 1 << 20  # a fresh chunk, past everything written
        row["ndim"], row["dtype"] = 1, b"float32"
        row["shape"][:], row["stride"][:] = 0, 0
        row["shape"][0], row["stride"][0] = elements, 1
        row["offset"], row["nbytes"], row["first"] = offset, elements * 4, i
        for k in ("min", "max", "mean", "l2", "nan_count", "inf_count", "checksum"):
            row[k] = 0  # the statistics of all-zero values
        row["hash"] = 0  # no content hash: checked by the (zero) sum
        rows[i] = row
        f[schema.TENSORS][:] = rows
        blob = f[schema.BLOB]
        blob.resize((offset + elements * 4,))
        step = 16 << 20
        for at in range(offset, offset + elements * 4, step):  # written: chunks exist
            blob[at:min(at + step, offset + elements * 4)] = 0
        status = f["_status"][:]
        status[3] = offset + elements * 4
        f["_status"][:] = status
        reseal(f)  # the metadata hashes, recomputed as whoever crafts a file can
        seqs = f[schema.OPS]["seq"].tolist()
        op = op_texts(f)[seqs.index(int(row["seq"]))]["op"]
    return schema.address(op, int(row["seq"]), int(row["io"]), int(row["idx"]))


# -- a real `accuracy serve` ---------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, data: Path, log: Path, *args: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "accuracy.cli", "serve", "--data", str(data), "--host",
             "127.0.0.1", "--port", str(self.port), *args],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            deadline = time.monotonic() + WAIT_S
            with self.client() as c:
                while True:
                    assert self.proc.poll() is None, self.log()
                    with contextlib.suppress(httpx.TransportError):
                        if c.get("/api/health").status_code == 200:
                            break
                    assert time.monotonic() < deadline, "accuracy serve did not come up"
                    time.sleep(0.1)
        except BaseException:
            self.stop()  # never leave a server behind
            raise

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=WAIT_S, trust_env=False,
                            headers=LOCAL["headers"])

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM first (uvicorn shuts down, the job children stop, and multiprocessing's
        resource tracker unlinks their semaphores: a group SIGKILL left three in /dev/shm),
        then SIGKILL whatever of the group is left after 10 s."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()


@contextlib.contextmanager
def serving(data: Path, log: Path, *args: str):
    s = Served(data, log, *args)
    try:
        yield s
    finally:
        s.stop()


def _raw_request(port: int, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(head.encode() + b"\r\n" + body)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _wait(pred, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- Host and Origin (in-process app) ------------------------------------------------------------

@pytest.fixture
def app_client(tmp_path):
    dump = _small_dump(tmp_path / "data" / "small.h5")
    with TestClient(**LOCAL, app=create_app(tmp_path / "data")) as c:
        r = c.post("/api/runs/register", json={"path": str(dump)})
        assert r.status_code == 201, r.text
        yield c, r.json()["id"], dump


def test_foreign_host_is_refused(app_client, tmp_path):
    c, _, _ = app_client
    for host in ("127.0.0.1:8000", "localhost", "[::1]:8000", "LOCALHOST."):
        assert c.get("/api/runs", headers={"host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "",
                 "[::2]"):
        r = c.get("/api/runs", headers={"host": host})
        assert r.status_code == 400, host
        assert "--allowed-hosts" in r.json()["error"]
    assert c.get("/", headers={"host": "evil.example"}).status_code == 400
    with TestClient(app=create_app(tmp_path / "named", allowed_hosts=["team.example.org",
                                                                      "*.lab.example"]),
                    base_url="http://team.example.org") as c2:
        assert c2.get("/api/runs").status_code == 200
        assert c2.get("/api/runs", headers={"host": "gpu1.lab.example"}).status_code == 200
        assert c2.get("/api/runs", headers={"host": "lab.example.evil"}).status_code == 400


def test_cross_site_writes_are_refused(app_client, tmp_path):
    c, rid, dump = app_client
    raw = dump.read_bytes()
    before = set((tmp_path / "data" / "runs").iterdir())
    # a page on another site posting a file as text/plain (a "simple" request: no preflight)
    r = c.post("/api/runs?name=x.h5", content=raw,
               headers={"content-type": "text/plain", "origin": "http://evil.example"})
    assert r.status_code == 403 and "Origin" in r.json()["error"]
    r = c.post("/api/runs?name=x.h5", content=raw,
               headers={"content-type": "text/plain", "origin": "null"})
    assert r.status_code == 403
    assert set((tmp_path / "data" / "runs").iterdir()) == before
    # a body-less cancel from a cross-site form
    assert c.post("/api/jobs/" + "0" * 32 + "/cancel",
                  headers={"origin": "http://evil.example"}).status_code == 403
    assert c.delete(f"/api/runs/{rid}", headers={"origin": "http://evil.example"}
                    ).status_code == 403
    assert c.get(f"/api/runs/{rid}").status_code == 200  # still there
    # no header, no JSON, no Origin: still not a request a browser page could be trusted with
    plain = TestClient(app=c.app, base_url="http://127.0.0.1")
    r = plain.post("/api/runs?name=x.h5", content=raw, headers={"content-type": "text/plain"})
    assert r.status_code == 403 and "X-Accuracy-Request" in r.json()["error"]
    assert plain.post("/api/jobs/" + "0" * 32 + "/cancel").status_code == 403
    # legitimate: JSON from the server's own page (same origin), or the header
    assert plain.post("/api/jobs/" + "0" * 32 + "/cancel", json={},
                      headers={"origin": "http://127.0.0.1:8000"}).status_code == 404
    assert c.post("/api/jobs/" + "0" * 32 + "/cancel").status_code == 404
    r = c.post("/api/runs?name=ok.h5", content=raw, headers={"origin": "http://localhost:8000"})
    assert r.status_code == 201, r.text


def test_ui_sends_the_header_with_its_writes():
    js = (REPO / "accuracy" / "server" / "static" / "runs.js").read_text()
    assert '"x-accuracy-request": "1"' in js


def test_json_body_is_capped(app_client):
    c, _, _ = app_client
    big = json.dumps({"path": "x" * (2 * 1024 * 1024)})
    r = c.post("/api/runs/register", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunks():  # no Content-Length: the cap holds on the bytes actually received
        yield b'{"path": "'
        for _ in range(64):
            yield b"x" * 65536
        yield b'"}'

    r = c.post("/api/runs/register", content=chunks(),
               headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = c.post("/api/runs/register", json={"path": "/nowhere/nope.h5"})  # small: goes through
    assert r.status_code == 403 and "allowed roots" in r.json()["error"]


def test_token_is_checked_before_any_lookup(tmp_path):
    with TestClient(**LOCAL, app=create_app(tmp_path / "d", token="s3cret",
                                            protect_reads=True)) as c:
        for url in ("/ui/reports/" + "0" * 32, "/ui/reports/nope/rows/3",
                    "/api/reports/nope", "/api/runs/nope/ops"):
            assert c.get(url).status_code == 401, url
        assert c.get("/ui/reports/nope?token=s3cret").status_code == 404


def test_long_path_component_is_a_clean_4xx(app_client, tmp_path):
    c, _, _ = app_client
    root = tmp_path / "data"
    for path in ("/" + "a" * 5000, str(root / ("b" * 300)), str(root / ("c" * 300) / "d.h5")):
        r = c.post("/api/runs/register", json={"path": path})
        assert 400 <= r.status_code < 500, (len(path), r.status_code, r.text)
        assert "error" in r.json()
        r = c.post("/api/reports/register", json={"path": path})
        assert 400 <= r.status_code < 500, (len(path), r.status_code, r.text)


def test_second_server_on_held_data_is_refused(tmp_path, capsys):
    from accuracy.server.datalock import DataDirBusy
    from accuracy.server.db import Job

    d = tmp_path / "held"
    with TestClient(**LOCAL, app=create_app(d)) as c:
        jobs = c.app.state.services.jobs
        storage = c.app.state.services.storage
        with storage.Session.begin() as ses:
            ses.add(Job(id="b" * 32, status="running", my_run_id="x", golden_run_id="y",
                        data_dir=storage.owner))
        with pytest.raises(DataDirBusy, match=f"pid {os.getpid()}"):
            create_app(d)
        from accuracy.cli import main

        assert main(["serve", "--data", str(d), "--port", str(_free_port())]) == 2
        assert f"in use by another accuracy server (pid {os.getpid()})" in capsys.readouterr().err
        assert c.get("/api/jobs/" + "b" * 32).json()["status"] == "running"
        # a job that was failed is never rewritten as done later
        assert jobs._set("b" * 32, status="failed", error="boom")
        assert not jobs._set("b" * 32, only_if=("running",), status="done")
        j = c.get("/api/jobs/" + "b" * 32).json()
        assert j["status"] == "failed" and j["error"] == "boom"
    with TestClient(**LOCAL, app=create_app(d)):  # released with the first server
        pass


def test_streamed_views_equal_whole_views(tmp_path):
    """The windowed histogram and values give what the in-memory ones give (nan, inf, a
    short last bucket, buckets larger and smaller than a window)."""
    import torch

    from accuracy import dumper
    from accuracy.dumpfile import load_dump
    from accuracy.server import tensorview
    from accuracy.server.boundedread import (
        TensorSource,
        ViewLimits,
        stream_downsample,
        stream_histogram,
    )

    x = torch.randn(100_003)
    x[5], x[77_777], x[1000:3000] = float("nan"), float("inf"), float("nan")
    with dumper(dump_path=tmp_path / "x.h5", overwrite=True):
        (x * 2).sum()
    with load_dump(tmp_path / "x.h5") as d:
        t = next(r for r in d.tensors if r.op == "aten.mul.Tensor" and r.io == 1)
        whole = t.load()
        limits = ViewLimits()
        limits.budget_bytes = 4 << 20  # windows of 8192 elements; whole up to 65536
        src = TensorSource(d, t, limits)
        assert not src.whole
        for points in (1, 7, 100, 2048, 100_000):
            a, b = stream_downsample(src, points), tensorview.downsample(whole, points)
            assert (a["bucket"], a["index"]) == (b["bucket"], b["index"])
            for k in ("min", "max", "mean"):
                assert [v is None for v in a[k]] == [v is None for v in b[k]], (points, k)
                assert [v for v in a[k] if v is not None] == pytest.approx(
                    [v for v in b[k] if v is not None], rel=1e-9), (points, k)
            assert None in stream_downsample(src, 100)["min"]  # the all-nan stretch
        a, b = stream_histogram([src, src], 33), tensorview.histogram([whole, whole], 33)
        assert (a["counts"], a["nan"], a["inf"]) == (b["counts"], b["nan"], b["inf"])
        assert a["edges"] == pytest.approx(b["edges"])


def test_streamed_view_of_a_strided_row_reads_its_elements_in_order(tmp_path):
    """A view stored as strides over another row's bytes (schema 6: `w.t()`) is read in
    windows through its strides: the windowed figures are those of the whole view."""
    import torch

    from accuracy import dumper
    from accuracy.dumpfile import load_dump
    from accuracy.server import tensorview
    from accuracy.server.boundedread import (
        TensorSource,
        ViewLimits,
        stream_downsample,
        stream_histogram,
    )

    w = torch.randn(401, 300)
    with dumper(dump_path=tmp_path / "w.h5", mode="tensor"):
        w.t().sum()
    with load_dump(tmp_path / "w.h5") as d:
        t = next(r for r in d.tensors if r.op == "aten.t.default" and r.io == 1)
        assert t.strided and torch.equal(t.load(), w.t())
        limits = ViewLimits()
        limits.budget_bytes = 4 << 20
        src = TensorSource(d, t, limits)
        assert not src.whole
        a, b = stream_downsample(src, 1000), tensorview.downsample(w.t(), 1000)
        assert a["index"] == b["index"] and a["max"] == pytest.approx(b["max"])
        a, b = stream_histogram([src], 33), tensorview.histogram([w.t()], 33)
        assert a["counts"] == b["counts"]


def test_streamed_view_of_damaged_data_is_refused(tmp_path):
    """A view read in windows checks the stored checksum like a whole read: one flipped byte
    is a 410 naming the tensor, not a plot of altered values."""
    import h5py
    import torch

    from accuracy import dumper
    from accuracy.dumpfile import load_dump, schema
    from accuracy.server.boundedread import TensorSource, ViewLimits, stream_histogram

    with dumper(dump_path=tmp_path / "x.h5", overwrite=True):
        (torch.randn(100_003) * 2).sum()
    with load_dump(tmp_path / "x.h5") as d:
        t = next(r for r in d.tensors if r.op == "aten.mul.Tensor" and r.io == 1)
        at = t.offset + t.nbytes // 2
    with h5py.File(tmp_path / "x.h5", "r+") as f:
        f[schema.BLOB][at] ^= 0x10
    with load_dump(tmp_path / "x.h5") as d:
        t = next(r for r in d.tensors if r.op == "aten.mul.Tensor" and r.io == 1)
        limits = ViewLimits()
        limits.budget_bytes = 4 << 20  # windows, not a whole read
        src = TensorSource(d, t, limits)
        assert not src.whole
        with pytest.raises(ApiError) as err:
            stream_histogram([src], 16)
    assert err.value.status == 410 and t.address in str(err.value)


# -- memory, bodies, disconnects (a real server) -------------------------------------------------

@contextlib.contextmanager
def serving_here(app):
    """uvicorn in a thread of this process on 127.0.0.1 (its records reach caplog)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           log_config=None))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    _wait(lambda: server.started or not t.is_alive(), "uvicorn to start")
    assert t.is_alive()
    try:
        yield port
    finally:
        server.should_exit = True
        t.join(WAIT_S)
        sock.close()


@pytest.fixture(scope="module")
def bomb_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bomb")
    small = _small_dump(root / "small.h5")
    bomb = root / "bomb.h5"
    address = _fill_bomb(bomb)
    app = create_app(root / "data", allowed_roots=[root], read_timeout_s=2,
                     view_memory_bytes=BUDGET_MB * 1024 * 1024)
    with serving_here(app) as port:
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S, trust_env=False,
                         headers=LOCAL["headers"])
        with c:
            runs = {}
            for p in (small, bomb):
                r = c.post("/api/runs/register", json={"path": str(p)})
                assert r.status_code == 201, r.text
                runs[p.name] = r.json()["id"]
            yield c, port, runs, address, root / "data"


def _rss_peak_after(action) -> tuple[int, object]:
    """(peak RSS of this process above its RSS before, result); the peak is reset first."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = psutil.Process().memory_info().rss
    result = action()
    status = Path("/proc/self/status").read_text()
    hwm = int(next(ln for ln in status.splitlines() if ln.startswith("VmHWM")).split()[1]) * 1024
    return hwm - before, result


def test_bomb_tensor_view_stays_under_the_memory_budget(bomb_server):
    c, _, runs, address, _ = bomb_server
    budget = BUDGET_MB * 1024 * 1024
    small = runs["small.h5"]
    for kind in ("values", "histogram"):  # the same op in the unmodified dump: warm-up
        assert c.get(f"/api/runs/{small}/tensor/{kind}",
                     params={"address": address}).status_code == 200
    url = f"/api/runs/{runs['bomb.h5']}/tensor"
    grew, r = _rss_peak_after(lambda: c.get(f"{url}/values",
                                            params={"address": address, "max_points": 1000}))
    assert r.status_code == 200, r.text
    v = r.json()
    assert v["numel"] == BOMB_ELEMENTS and v["max"][0] == 0.0 and len(v["min"]) <= 1000
    print(f"\n[bomb] {BOMB_ELEMENTS} float32 elements ({BOMB_ELEMENTS * 4 >> 20} MiB of "
          f"values): /values peak RSS +{grew >> 20} MiB (budget {BUDGET_MB} MiB)")
    assert grew < budget, f"/values took {grew >> 20} MiB, budget {BUDGET_MB} MiB"

    def two_at_once():
        out = {}

        def get(kind: str) -> None:
            out[kind] = c.get(f"{url}/{kind}", params={"address": address})

        ts = [threading.Thread(target=get, args=(k,)) for k in ("histogram", "values")]
        for t in ts:
            t.start()
        for t in ts:
            t.join(WAIT_S)
        return out

    grew2, out = _rss_peak_after(two_at_once)
    assert out["histogram"].status_code == 200 and out["values"].status_code == 200
    h = out["histogram"].json()
    assert h["numel"] == [BOMB_ELEMENTS] and sum(h["counts"][0]) == BOMB_ELEMENTS
    print(f"[bomb] histogram + values at once: peak RSS +{grew2 >> 20} MiB")
    assert grew2 < 2 * budget


def test_stalled_upload_is_dropped(bomb_server):
    _, port, _, _, data = bomb_server
    sock = _raw_request(port, "POST /api/runs?name=s.h5 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                "X-Accuracy-Request: 1\r\nContent-Length: 4000000000\r\n",
                        b"\x89HDF\r\n\x1a\n" + b"\0" * 1000)
    with sock:
        answer = _read_all(sock)  # the server answers and closes; WAIT_S bounds the read
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"stopped arriving" in answer
    _wait(lambda: not list((data / "tmp").iterdir()), "the partial upload to be removed", 10)


def test_client_disconnect_mid_upload_logs_one_line(bomb_server, caplog):
    _, port, _, _, data = bomb_server
    caplog.set_level(logging.INFO)
    sock = _raw_request(port, "POST /api/runs?name=d.h5 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                "X-Accuracy-Request: 1\r\nContent-Length: 1000000\r\n",
                        b"\x89HDF\r\n\x1a\n" + b"\0" * 65536)
    time.sleep(0.2)
    sock.close()
    _wait(lambda: any("disconnected" in r.getMessage() for r in caplog.records),
          "the disconnect log line", 10)
    time.sleep(0.5)  # anything else it would log comes right after
    noted = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(noted) == 1 and not noted[0].exc_info, [
        (r.name, r.getMessage(), bool(r.exc_info)) for r in noted]
    _wait(lambda: not list((data / "tmp").iterdir()), "the partial upload to be removed", 10)


# -- jobs ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def job_files(tmp_path_factory):
    pytest.importorskip("accuracy.compare")
    from tests._support.server_data import make_runs

    return make_runs(tmp_path_factory.mktemp("jobruns"))


def _job_child(server_pid: int) -> psutil.Process:
    def find():
        for p in psutil.Process(server_pid).children():
            with contextlib.suppress(psutil.Error):
                if any("spawn_main" in a for a in p.cmdline()):
                    return p
        return None

    return _wait(find, "the compare child")


def _start_job(c: httpx.Client) -> str:
    runs = {r["name"]: r["id"] for r in c.get("/api/runs").json()}
    r = c.post("/api/jobs", json={"my_run_id": runs["my.h5"], "golden_run_id": runs["golden.h5"],
                                  "replay": True})
    assert r.status_code == 202, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def job_server(job_files, tmp_path_factory):
    """One `accuracy serve` for both job tests; the last of them SIGKILLs it."""
    root = tmp_path_factory.mktemp("jobserver")
    s = Served(root / "data", root / "serve.log", "--run", str(job_files["my"]),
               "--run", str(job_files["golden"]))
    try:
        yield s, root / "data"
    finally:
        s.stop()


def _step_until(child: psutil.Process, done, what: str) -> None:
    """Let the child run in short steps until done() holds; it is left suspended."""
    deadline = time.monotonic() + WAIT_S
    while True:
        child.suspend()
        if done():
            return
        assert child.is_running() and time.monotonic() < deadline, f"timed out: {what}"
        child.resume()
        time.sleep(0.02)


def test_sigkilled_job_child_leaves_no_partial_files(job_server):
    s, data = job_server
    with s.client() as c:
        jid = _start_job(c)
        child = _job_child(s.proc.pid)
        _step_until(child, lambda: list((data / "runs").glob("*.partial")),
                    "the replay to write its .partial file")
        child.kill()
        j = _wait(lambda: (lambda j: j if j["status"] not in ("queued", "running") else None)(
            c.get(f"/api/jobs/{jid}").json()), "the job to end")
        assert j["status"] == "failed" and "exited with code" in j["error"], j
        assert list((data / "runs").iterdir()) == []  # no replay dump, no .partial
        assert list((data / "reports").iterdir()) == []
        time.sleep(0.5)
        assert c.get(f"/api/jobs/{jid}").json()["status"] == "failed"


def test_killed_servers_job_child_dies(job_server):
    s, data = job_server
    child = None
    try:
        with s.client() as c:
            jid = _start_job(c)
            child = _job_child(s.proc.pid)
            # past its start-up (where it arms PR_SET_PDEATHSIG), then held still
            _step_until(child, lambda: c.get(f"/api/jobs/{jid}").json()["stage"] not in (
                "queued", "starting"), "the compare child to report its first stage")
        os.kill(s.proc.pid, signal.SIGKILL)  # the server only, not its process group
        s.proc.wait(30)
        _wait(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
              "the compare child to die with its server", 20)
    finally:
        if child is not None:
            with contextlib.suppress(psutil.Error):
                child.kill()
    # the next server on this data: the job failed, nothing half-written is left
    with TestClient(**LOCAL, app=create_app(data)) as c:
        j = c.get(f"/api/jobs/{jid}").json()
        assert j["status"] == "failed" and "restarted" in j["error"], j
        indexed = {r["id"] for r in c.get("/api/runs").json()}
        assert [p.name for p in (data / "runs").iterdir() if p.stem not in indexed] == []
        assert list((data / "reports").iterdir()) == []
