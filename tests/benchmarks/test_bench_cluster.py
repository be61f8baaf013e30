"""bench_cluster's --repeat: several rounds of the compare sides are summed up by their
medians (one busy round on a shared 2-core machine decided the whole table before)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_cluster import median_rounds  # noqa: E402


def _round(inproc: float, one: float, two: float, same: bool = True) -> list[dict]:
    return [{"how": "in-process", "wall": inproc, "cpu": inproc, "same": True, "load": "l"},
            {"how": "--cluster local:1", "wall": one, "cpu": one, "same": same, "load": "l"},
            {"how": "--cluster local:2", "wall": two, "cpu": two / 2, "same": True,
             "load": "l"}]


def test_rounds_are_summed_up_by_their_medians():
    rows = median_rounds([_round(1.0, 1.2, 0.7), _round(0.9, 3.0, 0.6),
                          _round(1.1, 1.1, 2.0, same=False)])
    assert [r["how"] for r in rows] == ["in-process", "--cluster local:1", "--cluster local:2"]
    assert [r["wall"] for r in rows] == [1.0, 1.2, 0.7]
    assert rows[1]["walls"] == [1.2, 3.0, 1.1] and rows[2]["cpu"] == 0.35
    assert [r["same"] for r in rows] == [True, False, True]  # one round differing is said


def test_one_round_is_the_round_itself():
    (a, b, c), = [median_rounds([_round(1.0, 1.5, 0.8)])]
    assert (a["wall"], b["wall"], c["wall"]) == (1.0, 1.5, 0.8)


# -- the cluster judged against what the machine allows, and the N-worker plan ---------------

import pytest  # noqa: E402
from bench_cluster import against_ceiling, simulate_plan  # noqa: E402


def test_local2_is_judged_as_a_share_of_the_memory_ceiling():
    share, ok = against_ceiling(1.34, 1.08)
    assert round(share, 3) == round(1.34 / 1.08, 3) and ok
    share, ok = against_ceiling(0.95, 1.08)
    assert round(share, 2) == 0.88 and not ok


def test_a_ceiling_below_one_asks_two_workers_to_match_one():
    # a busy machine measured 2 streams slower than 1: two workers still have to match one
    share, ok = against_ceiling(0.85, 0.8)
    assert share == 0.85 and not ok


def _model(**kw: float) -> dict[str, float]:
    m = {"bytes": 32e9, "busy": 10.0, "tasks": 64, "gap": 0.0, "serial": 0.0, "wall": 10.0,
         "per_task": 0.0}
    return {**m, **kw}


def test_the_plan_shares_the_tasks_among_the_workers():
    p = simulate_plan(8, 32 * (32 << 20) / 1e9, _model())  # 32 batches per worker, no costs
    assert p["tasks_speedup"] == pytest.approx(8) and p["efficiency"] == pytest.approx(1)
    assert p["one"] == pytest.approx(8 * p["wall"])


def test_the_plan_pays_each_task_gap_and_the_serial_part():
    free = simulate_plan(4, 10.0, _model())
    paid = simulate_plan(4, 10.0, _model(gap=0.05, serial=0.5))
    assert paid["wall"] > free["wall"] and paid["efficiency"] < 1
    # the client's part grows with the bytes
    assert paid["serial"] == pytest.approx(0.5 * 40e9 / 32e9)


def test_a_scheduler_that_cannot_keep_up_is_the_floor():
    p = simulate_plan(8, 10.0, _model(per_task=1.0))
    assert p["wall"] == pytest.approx(p["tasks"] * 1.0)
