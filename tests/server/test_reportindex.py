"""The report rows' in-memory index (reportindex.ReportColumns) gives exactly the rows, in
exactly the order, that SQL over the index table gives: the SQL below is how the server
filtered and sorted before the columns moved into numpy, and stays here as the reference.
Rows are random, with names that exercise case, globs, LIKE's own wildcards and non-ASCII."""

from __future__ import annotations

import random
import threading

import pytest

pytest.importorskip("sqlalchemy")
from sqlalchemy import and_, or_, select  # noqa: E402

from accuracy.server.db import METRIC_COLUMNS, ReportRow  # noqa: E402
from accuracy.server.reportindex import (  # noqa: E402
    SORTABLE,
    ReportColumns,
    RowIndex,
    RowQuery,
    index_report,
)
from accuracy.server.storage import Storage  # noqa: E402

OPS = ["aten.mm.default", "aten.MM.out", "aten.mm", "aten.mmx.default", "aten.layer_norm.default",
       "aten.native_layer_norm.default", "aten.add_.Tensor", "aten.a%b.default", "aten.é.default",
       "aten.É.default", "c10d.all_reduce", "aten.mm.default.x", ""]
MODULES = ["Net.encoder.layers.0", "Net.encoder.layers.0.linear1", "Net.encoder.layers.01",
           "Net.encoder.layers.1.norm", "Other.encoder.layers.0", "Net.Encoder.x_y", "Net",
           "Net.dec[0].ff", "Net.ünï.code", ""]
VERDICTS = ["pass", "warning", "error", "unmatched", "skipped", ""]
PHASES = ["forward", "backward", "optimizer", ""]


def _rows(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = {"index": rnd.randrange(0, 10 * n) * 2 + (i % 2), "op": rnd.choice(OPS),
             "module": rnd.choice(MODULES), "phase": rnd.choice(PHASES),
             "verdict": rnd.choice(VERDICTS), "dtype_my": rnd.choice(["float32", "bfloat16"])}
        for c in METRIC_COLUMNS:
            r[c] = rnd.choice([None, float("nan"), float("inf"), 0.0, -0.0, 1.0,
                               round(rnd.uniform(-1, 1), 2), rnd.random()])
        out.append(r)
    seen: set[int] = set()  # idx is unique in a report
    return [r for r in out if not (r["index"] in seen or seen.add(r["index"]))]


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _glob(col, pattern: str):  # noqa: ANN001, ANN202 - SQLAlchemy column expressions
    if any(ch in pattern for ch in "*?["):
        like = _escape(pattern).replace("*", "%").replace("?", "_")
        return col.like(like, escape="\\")
    return or_(col == pattern, and_(col >= pattern + ".", col < pattern + "/"))


def _sql_order(storage: Storage, rid: str, q: RowQuery) -> list[int]:
    conds = [ReportRow.report_id == rid]
    if q.verdict:
        conds.append(ReportRow.verdict.in_(q.verdict))
    if q.phase:
        conds.append(ReportRow.phase == q.phase)
    if q.op:
        conds.append(_glob(ReportRow.op, q.op))
    if q.module:
        conds.append(or_(_glob(ReportRow.module, q.module),
                         _glob(ReportRow.module_tail, q.module)))
    if q.q:
        like = f"%{_escape(q.q)}%"
        conds.append(or_(ReportRow.op.like(like, escape="\\"),
                         ReportRow.module.like(like, escape="\\")))
    where = and_(*conds)
    col = getattr(ReportRow, q.sort)
    desc = q.order == "desc"
    order = [col.desc(), ReportRow.idx.desc()] if desc else [col.asc(), ReportRow.idx.asc()]
    with storage.engine.connect() as con:
        if q.sort not in METRIC_COLUMNS:
            return list(con.scalars(select(ReportRow.idx).where(where).order_by(*order)))
        ids = list(con.scalars(select(ReportRow.idx).where(and_(where, col.is_not(None)))
                               .order_by(*order)))
        return ids + list(con.scalars(select(ReportRow.idx).where(and_(where, col.is_(None)))
                                      .order_by(ReportRow.idx)))


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    storage = Storage(tmp_path_factory.mktemp("data"))
    rep = index_report(storage, {}, _rows(3000, seed=1), name="random")
    yield storage, rep.id
    storage.close()


FILTERS = [
    {}, {"verdict": ("error",)}, {"verdict": ("warning", "unmatched")}, {"phase": "backward"},
    {"op": "aten.mm"}, {"op": "aten.MM"}, {"op": "aten.mm.default"}, {"op": "aten.mm*"},
    {"op": "ATEN.*NORM*"}, {"op": "aten.?m.*"}, {"op": "aten.a%b*"}, {"op": "aten.a_b*"},
    {"op": "aten.É*"}, {"op": "aten.é*"}, {"op": "aten.[m]*"}, {"op": "aten.add_*"},
    {"module": "encoder.layers.0"}, {"module": "Net.encoder.layers.0"}, {"module": "*.x?y"},
    {"module": "encoder.*"}, {"module": "Net"}, {"module": "*[0]*"}, {"module": "*ÜNÏ*"},
    {"q": "norm"}, {"q": "NORM"}, {"q": "_"}, {"q": "%"}, {"q": "ünï"}, {"q": "Ünï"},
    {"q": "layers.0", "verdict": ("error", "pass"), "phase": "forward"},
    {"op": "aten.mm", "module": "encoder.layers.0", "phase": "forward"},
]


@pytest.mark.parametrize("filters", FILTERS, ids=[str(f) for f in FILTERS])
def test_every_filter_and_sort_matches_sql(indexed, filters):
    storage, rid = indexed
    index = RowIndex(storage)
    for sort in SORTABLE:
        for order in ("asc", "desc"):
            q = RowQuery(**filters, sort=sort, order=order)
            want = _sql_order(storage, rid, q)
            got = index.columns(rid).idx[index.order(rid, q)].tolist()
            assert got == want, (sort, order)
            assert index.count(rid, q) == len(want)


def test_pages_are_slices_of_the_order_with_the_stored_rows(indexed):
    storage, rid = indexed
    index = RowIndex(storage)
    q = RowQuery(verdict=("error", "warning"), sort="max_rel_err", order="desc")
    want = _sql_order(storage, rid, q)
    import json

    for offset, limit in ((0, 50), (37, 100), (len(want) - 3, 50), (len(want) + 10, 5)):
        body = json.loads(index.page_json(rid, q, offset, limit))
        assert body["total"] == len(want) and body["offset"] == offset
        assert [r["index"] for r in body["items"]] == want[offset:offset + limit]
        assert body == json.loads(index.page_json(rid, q, offset, limit))  # from the cache


def test_concurrent_requests_load_a_report_once(indexed, monkeypatch):
    storage, rid = indexed
    index = RowIndex(storage)
    loads = []
    real_init = ReportColumns.__init__

    def counting_init(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        loads.append(1)
        real_init(self, *a, **kw)

    monkeypatch.setattr(ReportColumns, "__init__", counting_init)
    q = RowQuery(sort="cosine", phase="forward")
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            results.append(index.page_ids(rid, q, 0, 20))
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 12
    assert len(loads) == 1
    assert all(r == _sql_order(storage, rid, q)[:20] for r in results)


def test_unknown_report_and_bad_sort_are_refused(indexed):
    from accuracy.server.errors import ApiError

    storage, rid = indexed
    index = RowIndex(storage)
    with pytest.raises(ApiError) as e:
        index.page_json("0" * 32, RowQuery(), 0, 10)
    assert e.value.status == 404
    with pytest.raises(ApiError) as e:
        index.order(rid, RowQuery(sort="data"))
    assert e.value.status == 400


def test_memory_per_row_stays_within_the_budget(indexed):
    """76 bytes a row for the columns, 4 more per sort key used: a 1M-row report with every
    sort key in use needs about 130 MB."""
    storage, rid = indexed
    index = RowIndex(storage)
    cols = index.columns(rid)
    n = len(cols)
    base = cols.nbytes - sum(len(v) + 60 for t in cols.text.values() for v in t.values)
    assert base == 76 * n
    for sort in SORTABLE:
        index.order(rid, RowQuery(sort=sort))
    assert cols.nbytes - base - sum(len(v) + 60 for t in cols.text.values() for v in t.values) \
        == 4 * n * len(SORTABLE)


def test_columns_built_while_indexing_equal_the_loaded_ones(tmp_path):
    storage = Storage(tmp_path / "d")
    try:
        index = RowIndex(storage)
        rid = index_report(storage, {}, _rows(800, seed=2), name="r", rows_index=index).id
        built, loaded = index.columns(rid), ReportColumns.load(storage, rid)
        assert built is not loaded and len(built) == len(loaded) > 0
        assert built.idx.tolist() == loaded.idx.tolist()
        for c in built.text:
            assert [built.text[c].values[i] for i in built.text[c].codes] == \
                   [loaded.text[c].values[i] for i in loaded.text[c].codes]
        for sort in SORTABLE:
            q = RowQuery(sort=sort, order="desc", verdict=("error", "pass"))
            assert built.order(q).tolist() == loaded.order(q).tolist()
            assert built.idx[built.order(q)].tolist() == _sql_order(storage, rid, q)
    finally:
        storage.close()
