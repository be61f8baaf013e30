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
