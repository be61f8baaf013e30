"""The report service's API fuzzed against its own OpenAPI schema (schemathesis), in-process.

Every operation in /openapi.json gets schema-valid and schema-violating requests, once with
generated path parameters and once pointed at a real run, report, job and tensor (a dump made
by `dumper`, a report made by `compare`). Each response must be below 500 and carry no stack
trace and no server path. The UI pages (not in the schema) get the same checks. Bounded: a few
examples per operation, derandomized, each request under a time limit; ACCURACY_SLOW=1 runs
many more (a soak).

Run with -s to see the figures: operations, cases and requests tried, statuses seen.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from datetime import timedelta
from urllib.parse import quote, unquote, unquote_plus

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from accuracy.server import create_app  # noqa: E402

try:
    from accuracy.compare import compare as _compare  # noqa: F401
    HAVE_COMPARE = True
except ImportError:
    HAVE_COMPARE = False

SLOW = bool(os.environ.get("ACCURACY_SLOW"))
EXAMPLES = 60 if SLOW else 6  # per operation, per generation mode, per parameter set
REQUEST_TIMEOUT_S = 20  # a request that takes longer is a hang, and fails the test
FORBIDDEN = ("Traceback", 'File "', "/work/", "site-packages", "/usr/lib/python", sys.prefix)
# Deletes and job starts are fuzzed with generated ids only: pointed at the real run or report
# they would remove what the other operations are meant to reach (or start compare processes).
NO_REAL_IDS = {("DELETE", "/api/runs/{run_id}"), ("DELETE", "/api/reports/{report_id}"),
               ("POST", "/api/jobs")}

STATS: Counter = Counter()
OK_OPS: set[str] = set()  # operations that answered 2xx at least once


# what a legitimate client sends: a loopback Host, and the header that marks a non-browser call
LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """An app over a data dir holding real dumps (one uploaded, two registered), a real report
    (compare, registered and linked to its runs) and a finished job."""
    if not HAVE_COMPARE:
        pytest.skip("accuracy.compare is not installed")
    from fastapi.testclient import TestClient
    from schemathesis.python import asgi

    from accuracy.server.db import Job
    from tests._support.server_data import make_runs

    data = tmp_path_factory.mktemp("fuzzdata")
    files = make_runs(data / "src")  # inside the data dir: the default allowed root
    app = create_app(data, allowed_hosts=["127.0.0.1", "testserver"])  # schemathesis' ASGI host
    c = TestClient(**LOCAL, app=app)  # no lifespan: schemathesis' ASGI transport runs it
    ids: dict[str, str] = {}
    for k in ("my", "golden"):
        r = c.post("/api/runs/register", json={"path": str(files[k]), "name": f"{k}.h5"})
        assert r.status_code == 201, r.text
        ids[k] = r.json()["id"]
    r = c.post("/api/runs?name=uploaded.h5", content=files["golden"].read_bytes(),
               headers={"content-type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    ids["uploaded"] = r.json()["id"]
    r = c.post("/api/reports/register", json={
        "path": str(files["report"]), "name": "my vs golden",
        "my_run_id": ids["my"], "golden_run_id": ids["golden"]})
    assert r.status_code == 201, r.text
    report = r.json()
    culprit = report["summary"]["culprit"]
    storage = app.state.services.storage
    with storage.Session.begin() as ses:
        ses.add(Job(id="f" * 32, status="done", progress=1.0, stage="done",
                    my_run_id=ids["my"], golden_run_id=ids["golden"], report_id=report["id"],
                    data_dir=storage.owner))
    real = {
        "run_id": ids["my"], "report_id": report["id"], "job_id": "f" * 32,
        "idx": int(culprit["index"]), "address": culprit["my_address"],
        "seq": int(culprit["my_address"].split("/")[2]),
    }
    # Each op records its call site in the user's script (file:line) and the API and UI show
    # it on purpose: that is dump content, not the server's. Only those exact strings are
    # exempt from the path check.
    from accuracy.dumpfile import load_dump

    sources: set[str] = set()
    for k in ("my", "golden"):
        with load_dump(files[k]) as d:
            sources |= {r.source for r in d.records if r.source}
    yield {"app": app, "data": data, "real": real, "ids": ids, "report": report,
           "sources": sorted(sources, key=len, reverse=True)}
    try:
        asgi.shutdown_lifespans()  # stop the app schemathesis started (jobs pool, engine)
    except Exception:  # noqa: BLE001 - teardown of a fuzzed app must not mask the test result
        pass


def _sent(request) -> str:
    """What the client sent, so a message that echoes it back is not taken for a leak."""
    body = request.body
    if isinstance(body, bytes):
        body = body.decode("latin-1")
    return f"{unquote_plus(str(request.url))}\n{unquote(str(request.url))}\n{body or ''}"


def check_response(status: int, ctype: str, text: str | None, sent: str, where: str,
                   served: dict) -> None:
    data_dir = served["data"]
    STATS[f"{status // 100}xx"] += 1
    assert status < 500, f"{where}: {status}\n{text}"
    if text is None:  # a binary download (xlsx)
        STATS["binary bodies"] += 1
        return
    for src in served["sources"]:
        text = text.replace(src, "<recorded call site>")
    for bad in (*FORBIDDEN, str(data_dir), str(data_dir.resolve())):
        assert bad not in text or bad in sent, f"{where}: {bad!r} in the response:\n{text}"
    if 400 <= status < 500 and ctype.startswith("application/json"):
        body = json.loads(text)
        assert isinstance(body, dict) and isinstance(body.get("error"), str), \
            f"{where}: {status} without an error message: {text}"


def _fuzz(op, served, mode: GenerationMode, fixed: dict) -> None:
    kw = {}
    if fixed.get("path"):
        kw["path_parameters"] = fixed["path"]
    if fixed.get("query"):
        kw["query"] = fixed["query"]

    @settings(max_examples=EXAMPLES, deadline=timedelta(seconds=REQUEST_TIMEOUT_S),
              derandomize=not SLOW, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(op.as_strategy(generation_mode=mode, **kw))
    def run(case) -> None:
        STATS["cases"] += 1
        resp = case.call(timeout=REQUEST_TIMEOUT_S, headers=LOCAL["headers"])
        STATS["requests"] += 1
        if resp.status_code < 300:
            OK_OPS.add(f"{op.method.upper()} {op.path}")
        ctype = ",".join(resp.headers.get("content-type", []))
        binary = "spreadsheetml" in ctype
        text = None if binary else resp.content.decode("utf-8", "replace")
        where = f"{case.method} {case.formatted_path} query={case.query!r} body={case.body!r}"
        check_response(resp.status_code, ctype, text, _sent(resp.request), where, served)

    try:
        run()
    except Unsatisfiable:
        # nothing to get wrong: no parameters (GET /api/health), or all of them fixed
        assert mode == GenerationMode.NEGATIVE, f"{op.method} {op.path}: no valid request?"
        STATS["no negative cases"] += 1


def test_api_fuzzed_against_its_openapi_schema(served):
    t0 = time.monotonic()
    schema = schemathesis.openapi.from_asgi("/openapi.json", served["app"])
    real = served["real"]
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 20, [f"{o.method} {o.path}" for o in ops]
    for op in ops:
        STATS["operations"] += 1
        path_names = [p.name for p in op.path_parameters]
        query_names = [p.name for p in op.query]
        variants = [{}]
        if (op.method.upper(), op.path) not in NO_REAL_IDS and path_names:
            # the real run/report/job; seq and idx stay generated in this variant
            ids = {k: real[k] for k in path_names if k in ("run_id", "report_id", "job_id")}
            if ids:
                variants.append({"path": ids})
            if {"seq", "idx"} & set(path_names) or "address" in query_names:
                # a real op, row and tensor: the other parameters are generated
                variants.append({"path": {k: real[k] for k in path_names},
                                 "query": {"address": real["address"]}
                                 if "address" in query_names else {}})
        for fixed in variants:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz(op, served, mode, fixed)
    # the real things are still there: nothing the fuzzer sent removed them
    from fastapi.testclient import TestClient

    c = TestClient(**LOCAL, app=served["app"])
    assert c.get(f"/api/runs/{real['run_id']}/ops?limit=1").status_code == 200
    assert c.get(f"/api/reports/{real['report_id']}/rows?limit=1").status_code == 200
    took = time.monotonic() - t0
    print(f"\n[api fuzz] {STATS['operations']} operations, {STATS['cases']} cases, "
          f"{STATS['requests']} requests in {took:.1f}s; statuses: "
          + ", ".join(f"{k} {STATS[k]}" for k in ("2xx", "3xx", "4xx", "5xx") if STATS[k])
          + f"; binary bodies {STATS['binary bodies']}; operations never answering 2xx: "
          + (", ".join(sorted({f"{o.method.upper()} {o.path}" for o in ops} - OK_OPS))
             or "none"))


def test_boundary_integers(served):
    """Integers past SQLite's 64 bits in every integer parameter: a 4xx, not a 500 (the fuzz
    found this one; kept as explicit cases since a short derandomized run may not)."""
    from fastapi.testclient import TestClient

    c = TestClient(**LOCAL, app=served["app"], raise_server_exceptions=False)
    run, rep = served["real"]["run_id"], served["real"]["report_id"]
    n = 0
    for big in (2**63, -2**63 - 1, 10**30):
        for url in (f"/api/runs/{run}/ops/{big}", f"/api/reports/{rep}/rows/{big}",
                    f"/api/reports/{rep}/rows/{big}/histogram",
                    f"/api/reports/{rep}/rows/{big}/heatmap", f"/ui/reports/{rep}/rows/{big}",
                    f"/api/runs/{run}/ops?offset={big}", f"/api/reports/{rep}/rows?offset={big}",
                    f"/api/runs/{run}/tensor/values?address=/aten.mm.default/{big}/output/0"):
            r = c.get(url)
            n += 1
            check_response(r.status_code, r.headers.get("content-type", ""), r.text, url,
                           f"GET {url}", served)
    print(f"\n[boundary] {n} requests")


def test_ui_pages_fuzzed(served):
    """The HTML pages are not in the schema; random report ids and row numbers get a page or
    a clean 404, never a 500 or a trace."""
    from fastapi.testclient import TestClient

    c = TestClient(**LOCAL, app=served["app"], raise_server_exceptions=False)
    real = served["real"]
    n = Counter()
    ids = st.one_of(st.just(real["report_id"]), st.text(min_size=1, max_size=40))
    rows = st.one_of(st.integers(), st.text(min_size=1, max_size=20))

    @settings(max_examples=8 * EXAMPLES, deadline=timedelta(seconds=REQUEST_TIMEOUT_S),
              derandomize=not SLOW, database=None, suppress_health_check=list(HealthCheck))
    @given(rid=ids, idx=rows, which=st.sampled_from(["report", "row", "home"]))
    def run(rid: str, idx: int | str, which: str) -> None:
        url = {"report": f"/ui/reports/{quote(rid, safe='')}",
               "row": f"/ui/reports/{quote(rid, safe='')}/rows/{quote(str(idx), safe='')}",
               "home": "/"}[which]
        r = c.get(url)
        n["requests"] += 1
        check_response(r.status_code, r.headers.get("content-type", ""), r.text,
                       f"{rid}\n{idx}", f"GET {url}", served)

    run()
    print(f"\n[ui fuzz] {n['requests']} page requests")
