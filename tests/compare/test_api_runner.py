"""How compare() drives a BatchRunner (a Dask cluster's, or any other): the rows of the pairs
already measured are built while later batches still run, the rows are those of a local
compare, and a compare that stops early closes the runner (its pending tasks are cancelled)."""

from __future__ import annotations

import json

import pytest

import accuracy.compare.api as api
import accuracy.compare.batches as batches
from accuracy.compare import compare
from accuracy.compare.blas import single_threaded_blas
from accuracy.compare.engine import BlobReader, compare_refs
from tests._support.lm_dumps import faulty_lm_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return faulty_lm_pair(tmp_path_factory.mktemp("runner"))


class _Runner:
    """Measures each batch here, in order, and notes how many rows compare() had built when
    each batch was handed over, and whether compare() closed it."""

    def __init__(self, rows_built: list[int], events: list[str] | None = None) -> None:
        self.rows_built = rows_built
        self.at_handover: list[int] = []
        self.closed = False
        self.events = events if events is not None else []

    def __call__(self, batches, algorithms):
        reader = BlobReader()
        try:
            for b in batches:
                self.at_handover.append(len(self.rows_built))
                with single_threaded_blas():  # as a worker: the same sums as a local run
                    res = compare_refs(reader, b, algorithms)
                yield res
        finally:
            self.closed = True
            self.events.append("runner closed")
            reader.close()


def _counting_rows(monkeypatch) -> list[int]:
    built: list[int] = []
    real = api.build_row

    def row(i, *a, **k):  # type: ignore[no-untyped-def]
        built.append(i)
        return real(i, *a, **k)

    monkeypatch.setattr(api, "build_row", row)
    return built


def test_rows_are_built_while_later_batches_run(pair, monkeypatch):
    monkeypatch.setattr(batches, "BATCH_BYTES", 64 << 10)  # many batches on a small dump
    local = compare(*pair)
    runner = _Runner(_counting_rows(monkeypatch))
    remote = compare(*pair, runner=runner)
    assert json.dumps(remote.rows, default=str) == json.dumps(local.rows, default=str)
    n = len(runner.at_handover)
    assert n > 4 and runner.closed
    # the last batches are handed over after most rows were built, not after none
    assert runner.at_handover[0] < runner.at_handover[-1]
    assert runner.at_handover[-1] > len(local.rows) // 2


def test_a_compare_that_stops_early_closes_its_runner(pair, monkeypatch):
    from accuracy.dumpfile.reader import Dump

    monkeypatch.setattr(batches, "BATCH_BYTES", 64 << 10)
    real, real_close = api.build_row, Dump.close
    events: list[str] = []

    def failing(i, s, res, *a, **k):  # type: ignore[no-untyped-def]
        if res is not None:
            raise RuntimeError("row failed")
        return real(i, s, res, *a, **k)

    def close(self):  # type: ignore[no-untyped-def]
        events.append("dump closed")
        real_close(self)

    monkeypatch.setattr(api, "build_row", failing)
    monkeypatch.setattr(Dump, "close", close)
    runner = _Runner([], events)
    with pytest.raises(RuntimeError, match="row failed"):
        compare(*pair, runner=runner)
    assert len(runner.at_handover) < 4  # the other batches were never asked for
    # closed by compare itself (its pending tasks cancelled), before it closes the dumps
    assert "runner closed" in events and events.index("runner closed") < events.index(
        "dump closed")
