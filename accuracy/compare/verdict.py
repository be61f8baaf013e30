"""Pass / warning / error per row, from a dtype-aware config (default_thresholds.toml)."""

from __future__ import annotations

import copy
import math
import os
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from accuracy.compare.row import Row, Verdict
from accuracy.dumpfile.dtypes import is_float
from accuracy.errors import UsageError

DEFAULT_CONFIG = Path(__file__).with_name("default_thresholds.toml")
PASS, WARNING, ERROR, UNMATCHED, SKIPPED = (Verdict.PASS, Verdict.WARNING, Verdict.ERROR,
                                            Verdict.UNMATCHED, Verdict.SKIPPED)
VERDICTS = tuple(Verdict)  # the order of the report's counts
_PRECISION = ["float8", "bfloat16", "float16", "float32", "float64"]


@cache
def _defaults() -> dict[str, Any]:
    return tomllib.loads(DEFAULT_CONFIG.read_text())


def load_config(source: str | os.PathLike[str] | dict | None = None) -> dict[str, Any]:
    """Defaults merged with a user TOML file or dict, section by section."""
    cfg = copy.deepcopy(_defaults())
    if source is None:
        return cfg
    if isinstance(source, dict):
        user = source
    else:
        path = Path(source)
        try:
            user = tomllib.loads(path.read_text())
        except OSError as e:
            raise UsageError(f"config {path}: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"config {path}: not valid TOML: {e}") from None
    for section, values in user.items():
        if not isinstance(values, dict):
            raise UsageError(f"config: [{section}] must be a table of thresholds")
        cfg.setdefault(section, {}).update(values)
    return cfg


def _rank(dtype: str) -> int:
    for i, p in enumerate(_PRECISION):
        if dtype.startswith(p):
            return i
    return 0


def section_for(cfg: dict[str, Any], dtype_my: str, dtype_golden: str) -> dict[str, Any]:
    """Thresholds of the less precise floating dtype of the pair ('integer' when neither is)."""
    floats = [d for d in (dtype_my, dtype_golden) if d and is_float(d)]
    if not floats:
        return cfg["integer"]
    d = min(floats, key=_rank).replace("complex64", "float32").replace("complex128", "float64")
    return cfg.get(d, cfg["float"])


def metric_verdict(row: Row, cfg: dict[str, Any],
                   compute: str | None = None) -> tuple[Verdict, str]:
    """Verdict of a compared tensor pair from its metrics (accumulated error vs golden).

    `compute`: the op's compute precision when coarser than its dtype (see precision.py);
    its thresholds then apply.
    """
    if row.nan_mismatch or row.inf_mismatch:
        return ERROR, (f"non-finite values differ: {row.nan_mismatch or 0} NaN and "
                       f"{row.inf_mismatch or 0} inf positions")
    base = section_for(cfg, row.dtype_my or "", row.dtype_golden or "")
    sec = base
    if compute is not None and "max_abs_error" not in base:
        sec = cfg.get(compute, cfg["float"])
    if "max_abs_error" in sec:
        mae = row.max_abs_err
        if mae is not None and mae > sec["max_abs_error"]:
            return ERROR, f"integer values differ (max abs err {mae:g})"
        return PASS, ""
    cos, red = row.cosine, row.rel_euc_dist
    if cos is None and red is None:
        return PASS, "no finite values to compare"
    floor = base.get("zero_floor", 0.0)  # a property of the tensors' dtype, not the kernel
    # A NaN anywhere makes max/min NaN: the magnitude is then unknown, never "below the floor".
    extremes = [v for v in (row.my_max, row.my_min, row.golden_max, row.golden_min)
                if v is not None]
    magnitude = max((abs(v) if not math.isnan(v) else math.inf for v in extremes), default=0.0)
    if floor and magnitude <= floor:
        return PASS, f"all values below zero_floor {floor:g}: rounding noise, not judged"
    msgs = []
    verdict = PASS
    for level, ck, rk in ((ERROR, "cosine_error", "rel_euc_error"),
                          (WARNING, "cosine_warning", "rel_euc_warning")):
        if cos is not None and ck in sec and cos < sec[ck]:
            msgs.append(f"cosine {cos:.6g} < {sec[ck]:g}")
        if red is not None and rk in sec and red > sec[rk]:
            msgs.append(f"rel_euc_dist {red:.3g} > {sec[rk]:g}")
        if msgs:
            verdict = level
            break
    return verdict, "; ".join(msgs)


def stats_verdict(row: Row, cfg: dict[str, Any]) -> tuple[Verdict, str]:
    """Verdict from statistics only (statistics-mode dumps).

    Non-finite counts are exact in every dump: a NaN or inf on one side only is an error
    (statistics of a non-finite tensor are NaN or inf themselves, and compare nothing)."""
    sec = cfg["statistics"]
    counts = (row.my_nan_count, row.my_inf_count, row.golden_nan_count, row.golden_inf_count)
    if all(c is not None and c >= 0 for c in counts) and counts[:2] != counts[2:]:
        return ERROR, (f"statistics only: non-finite values differ: {counts[0]} NaN, "
                       f"{counts[1]} inf in my run against {counts[2]} NaN, {counts[3]} inf "
                       "in the golden")
    worst, which = 0.0, ""
    for k, v in (("max", row.max_rel_diff), ("min", row.min_rel_diff),
                 ("mean", row.mean_rel_diff), ("l2", row.l2norm_rel_diff)):
        if v is not None and (v > worst or math.isnan(v)):
            worst, which = v, k
    if worst > sec["stat_rel_error"]:
        return ERROR, f"statistics only: {which} differs by {worst:.3g} (relative)"
    if worst > sec["stat_rel_warning"]:
        return WARNING, f"statistics only: {which} differs by {worst:.3g} (relative)"
    return PASS, "statistics only"


def judge_local(op: Any, idx: int, dtype: str, ratio: float | None, cfg: dict[str, Any],
                precision: Any, reference_error: float | None = None
                ) -> tuple[str | None, dict[str, Any]]:
    """Verdict of one op output from its local error ratio alone, and the figures behind it.

    The rule compare applies to a replayed output (judge.py): the ratio over what an honest
    kernel gives at the op's compute precision, dtype and reduction length (the excess),
    against `[replay]`'s thresholds. The outlier score needs the whole run's population of
    the op type, so a single op (the live check, `accuracy.live`) is judged on the excess
    alone. `op` is an OpRecord-like object (op name, input and output shapes);
    `precision` a `precision.ComputePrecision`; `reference_error` the same-dtype reference's
    measured error (the replay's `err_reference`).
    """
    from accuracy.compare.judge import level
    from accuracy.compare.numerics import (
        UNIT_ROUNDOFF,
        expected_ratio,
        input_rms,
        reduction_length,
    )

    compute = precision.coarser(op.op, dtype)
    k = reduction_length(op, idx)
    # the inputs' sizes matter only where the kernel rounds coarser than the dtype (the live
    # check measures them for this, a pass over each input: skipped where unused)
    coarser = (compute in UNIT_ROUNDOFF and dtype in UNIT_ROUNDOFF
               and UNIT_ROUNDOFF[compute] > UNIT_ROUNDOFF[dtype])
    bound = expected_ratio(compute, dtype, k, input_rms(op) if coarser else None,
                           reference_error)
    figures = {"compute_precision": compute, "reduction_length": k, "local_bound": bound,
               "local_excess": None}
    if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
        return None, figures
    excess = ratio / bound if math.isfinite(ratio) else math.inf
    figures["local_excess"] = excess
    return level(excess, 0.0, math.inf, cfg["replay"], "excess"), figures
