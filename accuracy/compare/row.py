"""The typed report row and its verdict: what compare builds, judge decides, and every report
file (JSON, CSV, XLSX, HTML) and the server read.

Field order is the report's column order (rows.json keys, the CSV's extra columns), so it is
part of the file format; see docs/metrics.md for each field's meaning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    """A row's verdict. A str, so JSON, CSV and templates write it as before ("error")."""

    PASS = "pass"
    WARNING = "warning"
    ERROR = "error"
    UNMATCHED = "unmatched"
    SKIPPED = "skipped"

    @property
    def rank(self) -> int:
        """How bad: pass and skipped 0 < unmatched 1 < warning 2 < error 3. One ranking for
        judging (worst op in a module), drawing (errors on top) and sorting (server)."""
        return _RANK[self]

    @classmethod
    def rank_of(cls, v: str | None) -> int:
        """Rank of a verdict given as text (a report read back from JSON); 0 for None."""
        return _RANK.get(v, 0) if v is not None else 0  # type: ignore[call-overload]


_RANK = {Verdict.PASS: 0, Verdict.SKIPPED: 0, Verdict.UNMATCHED: 1, Verdict.WARNING: 2,
         Verdict.ERROR: 3}
JUDGED = (Verdict.PASS, Verdict.WARNING, Verdict.ERROR)


def worst(verdicts: Iterable[str | None], default: Verdict = Verdict.PASS) -> Verdict:
    """The worst of some verdicts (by `Verdict.rank`; the first of equals); `default` if none."""
    out = default
    for v in verdicts:
        if v is not None and Verdict.rank_of(v) > out.rank:
            out = Verdict(v)
    return out


@dataclass(slots=True, eq=True)
class Row:
    """One compared tensor pair (an op's input or output, or a module's output)."""

    # -- which tensors --------------------------------------------------------------------
    index: int
    kind: str  # "op" or "module"
    my_address: str | None = None
    golden_address: str | None = None
    op: str | None = None
    op_golden: str | None = None
    seq_my: int | None = None
    seq_golden: int | None = None
    io: str = "output"
    tensor_index: int = 0
    phase: str | None = None
    module: str | None = None
    source: str | None = None
    dtype_my: str | None = None
    dtype_golden: str | None = None
    shape_my: list[int] | None = None
    shape_golden: list[int] | None = None
    # -- metrics (metrics.ALL_ALGORITHMS, in that order) -----------------------------------
    cosine: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mean_abs_err: float | None = None
    rmse: float | None = None
    rel_euc_dist: float | None = None
    euc_dist: float | None = None
    acc_rel_err: float | None = None
    mean_rel_err: float | None = None
    one_thousandth_err_ratio: float | None = None
    five_thousandths_err_ratio: float | None = None
    kl_div: float | None = None
    nan_mismatch: int | None = None
    inf_mismatch: int | None = None
    bit_exact: bool | None = None
    # -- recorded statistics, and their differences ----------------------------------------
    my_max: float | None = None
    my_min: float | None = None
    my_mean: float | None = None
    my_l2norm: float | None = None
    my_nan_count: int | None = None
    my_inf_count: int | None = None
    golden_max: float | None = None
    golden_min: float | None = None
    golden_mean: float | None = None
    golden_l2norm: float | None = None
    golden_nan_count: int | None = None
    golden_inf_count: int | None = None
    max_diff: float | None = None
    max_rel_diff: float | None = None
    min_diff: float | None = None
    min_rel_diff: float | None = None
    mean_diff: float | None = None
    mean_rel_diff: float | None = None
    l2norm_diff: float | None = None
    l2norm_rel_diff: float | None = None
    # -- judgement (judge.py) ----------------------------------------------------------------
    local_error_ratio: float | None = None
    local_verdict: Verdict | None = None
    replay_status: str | None = None
    amplification: float | None = None
    accumulated_verdict: Verdict | None = None
    verdict: Verdict = Verdict.PASS
    message: str = ""
    compute_precision: str | None = None
    local_error: float | None = None
    local_bound: float | None = None
    local_excess: float | None = None
    local_z: float | None = None
    reduction_length: int | None = None
    cancellation: float | None = None  # a sum's terms over the sum (numerics.cancellation)
    amplification_z: float | None = None
    produced_by: str | None = None
    quant: str | None = None  # fp8/MX figures of the op's GEMM operands (dumpfile/quant.py)
    emulated_error: float | None = None  # residual against the emulated reference (replay)
    emulated_excess: float | None = None  # that residual over its honest bound (numerics.py)
    # -- multi-rank compare only (absent from a single rank's files) -----------------------
    rank: int | None = None
    epoch: int | None = None
    rank_index: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The row as the report files write it (a plain dict, keys in column order)."""
        keys = _KEYS if self.rank is not None else _SINGLE_RANK_KEYS
        return {k: getattr(self, k) for k in keys}

    to_dict = as_dict

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        """A row read back from rows.json (unknown keys dropped, verdicts typed)."""
        kw = {k: d[k] for k in _KEYS if k in d}
        for k in ("verdict", "local_verdict", "accumulated_verdict"):
            if kw.get(k) is not None:
                kw[k] = Verdict(kw[k])
        return cls(**kw)

    # Read-only mapping access, as rows were dicts before: `row["cosine"]`, `row.get(...)`.
    def __getitem__(self, key: str) -> Any:
        if key not in _KEY_SET:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key in _KEY_SET else default

    def keys(self) -> list[str]:
        return list(_KEYS if self.rank is not None else _SINGLE_RANK_KEYS)


_KEYS = tuple(f.name for f in fields(Row))
_SINGLE_RANK_KEYS = _KEYS[:_KEYS.index("rank")]
_KEY_SET = frozenset(_KEYS)
