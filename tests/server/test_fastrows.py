"""The rows endpoint's fast lane (fastrows.py) answers exactly what the FastAPI route answers:
same status, headers and body for valid, repeated, odd and invalid parameters, with and
without a read token."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from accuracy.server import create_app  # noqa: E402
from accuracy.server.fastrows import parse_rows_query  # noqa: E402
from accuracy.server.reportindex import index_report  # noqa: E402

LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}

VALID = [
    "", "limit=10", "offset=20&limit=7", "sort=cosine", "sort=max_abs_err&order=desc",
    "verdict=error", "verdict=error,warning&verdict=pass", "verdict=", "phase=backward",
    "phase=forward&phase=backward", "op=aten.mm", "op=aten.*NORM*", "module=encoder.layers.0",
    "q=norm&sort=op&order=desc", "op=&module=&q=", "offset=05&limit=050", "offset=999999",
    "unknown=1&limit=3", "sort=verdict&limit=1000", "module=%C3%BCn%C3%AF&q=%25",
]
ROUTER_ONLY = [  # refused, or coerced by the route: the router answers these
    "limit=0", "limit=1001", "limit=5.0", "limit=+5", "offset=-1", "offset=1_0", "limit=x",
    "phase=sideways", "phase=", "sort=data", "order=up", "op=" + "a" * 201, "q=" + "b" * 201,
    "module=" + "m" * 401,
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.server.test_reportindex import _rows

    data = tmp_path_factory.mktemp("data")
    app = create_app(data)
    rid = index_report(app.state.services.storage, {}, _rows(500, seed=3), name="r").id
    with TestClient(**LOCAL, app=app) as c:
        yield c, rid


def _both(c: TestClient, url: str) -> tuple:
    out = []
    for lane in (True, False):
        c.app.state.rows_fast_lane = lane
        r = c.get(url)
        out.append((r.status_code, r.headers.get("content-type"),
                    r.headers.get("content-length"), r.content))
    c.app.state.rows_fast_lane = True
    return tuple(out)


@pytest.mark.parametrize("qs", VALID + ROUTER_ONLY)
def test_fast_lane_answers_as_the_route_does(served, qs):
    c, rid = served
    accepted = parse_rows_query(qs.encode()) is not None
    assert accepted == (qs in VALID)
    fast, routed = _both(c, f"/api/reports/{rid}/rows?{qs}")
    assert fast == routed
    assert fast[0] == (200 if accepted else fast[0])


def test_unknown_report_and_token_go_to_the_route(tmp_path):
    from tests.server.test_reportindex import _rows

    app = create_app(tmp_path / "d", token="s3cret", protect_reads=True)
    rid = index_report(app.state.services.storage, {}, _rows(50, seed=4), name="r").id
    with TestClient(**LOCAL, app=app) as c:
        for url, headers in ((f"/api/reports/{rid}/rows", {}),
                             (f"/api/reports/{rid}/rows", {"Authorization": "Bearer nope"}),
                             ("/api/reports/" + "0" * 32 + "/rows",
                              {"Authorization": "Bearer s3cret"}),
                             (f"/api/reports/{rid}/rows?limit=2",
                              {"Authorization": "Bearer s3cret"})):
            got = []
            for lane in (True, False):
                c.app.state.rows_fast_lane = lane
                r = c.get(url, headers=headers)
                got.append((r.status_code, r.content))
            assert got[0] == got[1], url
        assert got[0][0] == 200
        c.app.state.rows_fast_lane = True
        assert c.get(f"/api/reports/{rid}/rows").status_code == 401


def test_fast_lane_sits_behind_the_host_check(served):
    """A page from a foreign Host (DNS rebinding) is refused before the fast lane answers."""
    c, rid = served
    assert c.app.state.rows_fast_lane
    r = c.get(f"/api/reports/{rid}/rows", headers={"Host": "evil.example"})
    assert r.status_code == 400
    assert b'"items"' not in r.content
