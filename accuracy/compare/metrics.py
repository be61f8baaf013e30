"""Comparison metrics, accumulated in float64 over chunks so a huge tensor needs bounded memory.

Names follow msaccucmp / msprobe (see docs/metrics.md for formulas and edge-case choices). The
streaming accumulator keeps a handful of float64 sums; every metric is derived from them at the
end, so one pass over each tensor's bytes computes them all.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from accuracy import native
from accuracy.errors import UsageError

# Row keys of the metric columns, in report order.
DEFAULT_ALGORITHMS: tuple[str, ...] = (
    "cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "rmse", "rel_euc_dist", "euc_dist",
    "acc_rel_err", "mean_rel_err", "one_thousandth_err_ratio", "five_thousandths_err_ratio",
)
# KL needs two logarithms per element (about 3x the cost of all the others): opt-in with -alg.
ALL_ALGORITHMS: tuple[str, ...] = DEFAULT_ALGORITHMS + ("kl_div",)

# msaccucmp / msprobe spellings accepted by -alg, mapped to our row keys.
ALIASES: dict[str, str] = {
    "cosinesimilarity": "cosine", "cos": "cosine",
    "maxabsoluteerror": "max_abs_err", "maxabserr": "max_abs_err",
    "maxrelativeerror": "max_rel_err", "maxrelativeerr": "max_rel_err",
    "meanabsoluteerror": "mean_abs_err", "rootmeansquareerror": "rmse",
    "relativeeuclideandistance": "rel_euc_dist", "euclideandistance": "euc_dist",
    "eucdist": "euc_dist", "accumulatedrelativeerror": "acc_rel_err",
    "meanrelativeerror": "mean_rel_err", "kullbackleiblerdivergence": "kl_div", "kl": "kl_div",
    "onethousandtherrratio": "one_thousandth_err_ratio",
    "fivethousandthserrratio": "five_thousandths_err_ratio",
}

_F64 = np.dtype(np.float64)
KL_EPS = 1e-10  # floor of each min-max normalised value before the KL sum
UserMetric = Callable[[np.ndarray, np.ndarray], float]
_USER_METRICS: dict[str, UserMetric] = {}


def register_metric(name: str, fn: UserMetric) -> None:
    """Add a metric: `fn(my, golden)` gets the finite float64 values of a tensor pair.

    User metrics see the whole tensor at once (no streaming), so they cost memory on huge
    tensors; the built-in ones do not.
    """
    if name in ALL_ALGORITHMS:
        raise ValueError(f"metric {name!r} is built in")
    _USER_METRICS[name] = fn


def user_metric(name: str) -> UserMetric | None:
    return _USER_METRICS.get(name)


def resolve_algorithms(names: list[str] | tuple[str, ...] | str | None) -> tuple[str, ...]:
    """Normalise an -alg selection ("all", "default", aliases, "pkg.mod:func") to row keys."""
    if names is None:
        return DEFAULT_ALGORITHMS
    if isinstance(names, str):
        names = [n for n in names.replace(",", " ").split() if n]
    out: list[str] = []
    for raw in names:
        key = raw.strip()
        low = key.lower().replace("_", "").replace(" ", "")
        if low == "all":
            out.extend(ALL_ALGORITHMS)
            continue
        if low == "default":
            out.extend(DEFAULT_ALGORITHMS)
            continue
        if key in ALL_ALGORITHMS or key in _USER_METRICS:
            out.append(key)
            continue
        squashed = {a.replace("_", ""): a for a in ALL_ALGORITHMS}
        if low in squashed:
            out.append(squashed[low])
            continue
        if low in ALIASES:
            out.append(ALIASES[low])
            continue
        if ":" in key:
            mod, _, fn_name = key.partition(":")
            fn = getattr(importlib.import_module(mod), fn_name, None)
            if not callable(fn):
                raise UsageError(f"-alg {key}: {mod} has no function {fn_name}")
            register_metric(fn_name, fn)
            out.append(fn_name)
            continue
        raise UsageError(
            f"unknown metric {raw!r}; choose from {', '.join(ALL_ALGORITHMS)}, 'all', or "
            "'package.module:function' for your own")
    return tuple(dict.fromkeys(out))


@dataclass
class StreamingMetrics:
    """Float64 sums over chunks of (my, golden) values; `result()` derives every metric."""

    rel_eps: float
    kl_range: tuple[tuple[float, float], tuple[float, float]] | None = None
    n: int = 0  # elements seen
    n_cmp: int = 0  # finite pairs compared
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    sxx: float = 0.0
    syy: float = 0.0
    sxy: float = 0.0
    sdd: float = 0.0
    sad: float = 0.0
    max_ad: float = 0.0
    srel: float = 0.0
    max_rel: float = 0.0
    c1: int = 0
    c5: int = 0
    kl_p: float = 0.0
    kl_q: float = 0.0
    kl_s: float = 0.0
    _extra: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    keep_values: bool = False
    mask_at: float | None = None  # |values| at or beyond this on both sides: masks, not data
    masked: int = 0  # pairs left out as mask values
    _buf: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def update(self, x: np.ndarray, y: np.ndarray, *, finite: bool = False,
               identical: bool = False) -> None:
        """Add one chunk. `finite`: caller knows both are all finite; `identical`: equal bytes."""
        if not identical and self._fused_update(x, y):
            return
        self.n += x.size
        if not finite:
            x, y = self._split_nonfinite(x, y)
        if self.mask_at is not None:
            x, y = self._split_masks(x, y, self.mask_at)
        if x.size == 0:
            return
        self.n_cmp += x.size
        if self.keep_values:
            self._extra.append((x.copy(), y.copy()))
        if self.kl_range is not None:
            self._update_kl(x, y)
        if identical:
            s = float(np.dot(y, y))
            self.sxx += s
            self.syy += s
            self.sxy += s
            self.c1 += x.size
            self.c5 += x.size
            return
        self.sxx += float(np.dot(x, x))
        self.syy += float(np.dot(y, y))
        self.sxy += float(np.dot(x, y))
        d, ay, mask = self._scratch(x.size)
        np.subtract(x, y, out=d)
        self.sdd += float(np.dot(d, d))
        np.abs(d, out=d)
        self.sad += float(d.sum())
        self.max_ad = max(self.max_ad, float(d.max()))
        np.abs(y, out=ay)
        if ay.min() < self.rel_eps:  # else the floor changes nothing: skip its pass
            np.maximum(ay, self.rel_eps, out=ay)
        np.divide(d, ay, out=d)
        self.srel += float(d.sum())
        top = float(d.max())
        self.max_rel = max(self.max_rel, top)
        # A chunk whose largest relative error is below a threshold counts whole: no pass.
        self.c1 += (x.size if top < 0.001
                    else int(np.count_nonzero(np.less(d, 0.001, out=mask))))
        self.c5 += (x.size if top < 0.005
                    else int(np.count_nonzero(np.less(d, 0.005, out=mask))))

    def _fused_update(self, x: np.ndarray, y: np.ndarray) -> bool:
        """The plain case (no masks, KL or kept values; every value finite) in one pass of C
        (accuracy/native), the same sums as the numpy passes below; False: not taken here."""
        if (self.mask_at is not None or self.kl_range is not None or self.keep_values
                or not self.rel_eps > 0 or x.dtype != _F64 or y.dtype != _F64 or x.size == 0
                or not (x.flags.c_contiguous and y.flags.c_contiguous)):
            return False
        got = native.compare_pass(x.ctypes.data, y.ctypes.data, x.size, self.rel_eps)
        if got is None:  # no kernels, or a non-finite value: the numpy path sets those apart
            return False
        (sxx, syy, sxy, sdd, sad, max_ad, srel, max_rel), c1, c5 = got
        self.n += x.size
        self.n_cmp += x.size
        self.sxx += sxx
        self.syy += syy
        self.sxy += sxy
        self.sdd += sdd
        self.sad += sad
        self.max_ad = max(self.max_ad, max_ad)
        self.srel += srel
        self.max_rel = max(self.max_rel, max_rel)
        self.c1 += c1
        self.c5 += c5
        return True

    def _scratch(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reused work arrays: no allocation per chunk."""
        if self._buf is None or self._buf[0].size < n:
            self._buf = (np.empty(n), np.empty(n), np.empty(n, dtype=bool))
        d, ay, m = self._buf
        return d[:n], ay[:n], m[:n]

    def _split_nonfinite(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fx, fy = np.isfinite(x), np.isfinite(y)
        if fx.all() and fy.all():
            return x, y
        nx, ny = np.isnan(x), np.isnan(y)
        self.nan_mismatch += int(np.count_nonzero(nx != ny))
        ix, iy = np.isinf(x), np.isinf(y)
        self.inf_mismatch += int(np.count_nonzero((ix | iy) & ~(nx | ny) & (x != y)))
        both = fx & fy
        return x[both], y[both]

    def _split_masks(self, x: np.ndarray, y: np.ndarray, at: float
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Leave out pairs both at or beyond `at` with one sign: attention-mask fills
        (finfo.min, -1e30...). Their magnitude would swamp every relative figure (a 1e38 norm
        makes any real deviation of the scores read as 1e-41), and each side writes its own
        format's limit there, so their difference is not an error either."""
        m = (np.abs(x) >= at) & (np.abs(y) >= at) & ((x > 0) == (y > 0))
        n = int(np.count_nonzero(m))
        if n == 0:
            return x, y
        self.masked += n
        keep = ~m
        return x[keep], y[keep]

    def _update_kl(self, x: np.ndarray, y: np.ndarray) -> None:
        assert self.kl_range is not None
        (xmin, xmax), (ymin, ymax) = self.kl_range
        q = _minmax_norm(x, xmin, xmax)
        p = _minmax_norm(y, ymin, ymax)
        self.kl_p += float(p.sum())
        self.kl_q += float(q.sum())
        self.kl_s += float(np.dot(p, np.log(p) - np.log(q)))

    def result(self, algorithms: tuple[str, ...]) -> dict[str, float | None]:
        """The selected metrics; None for all of them when no finite pair was compared."""
        out: dict[str, float | None] = {}
        n = self.n_cmp
        for name in algorithms:
            out[name] = None if n == 0 else self._metric(name)
        return out

    def _metric(self, name: str) -> float | None:
        n = self.n_cmp
        nx, ny = math.sqrt(self.sxx), math.sqrt(self.syy)
        euc = math.sqrt(self.sdd)
        if name == "cosine":
            if nx == 0.0 and ny == 0.0:
                return 1.0
            if nx == 0.0 or ny == 0.0:
                return 0.0
            return max(-1.0, min(1.0, self.sxy / (nx * ny)))
        if name == "rel_euc_dist":
            if ny == 0.0:
                return 0.0 if euc == 0.0 else math.inf
            return euc / ny
        simple = {
            "max_abs_err": self.max_ad, "mean_abs_err": self.sad / n,
            "rmse": math.sqrt(self.sdd / n), "euc_dist": euc, "max_rel_err": self.max_rel,
            "mean_rel_err": self.srel / n, "acc_rel_err": self.srel,
            "one_thousandth_err_ratio": self.c1 / n, "five_thousandths_err_ratio": self.c5 / n,
        }
        if name in simple:
            return simple[name]
        if name == "kl_div":
            if self.kl_range is None:
                return None
            return max(0.0, self.kl_s / self.kl_p + math.log(self.kl_q / self.kl_p))
        fn = _USER_METRICS.get(name)
        if fn is None:
            return None
        x = np.concatenate([a for a, _ in self._extra]) if self._extra else np.zeros(0)
        y = np.concatenate([b for _, b in self._extra]) if self._extra else np.zeros(0)
        return float(fn(x, y))


def _minmax_norm(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Min-max normalise, floor at KL_EPS; a constant tensor becomes uniform."""
    if not hi > lo:
        return np.ones_like(v)
    p = (v - lo) / (hi - lo)
    np.maximum(p, KL_EPS, out=p)
    return p


def statistics_metrics(my: dict[str, float], golden: dict[str, float]) -> dict[str, float | None]:
    """Differences of the recorded statistics, for statistics-only dumps (msprobe's 'diff')."""
    out: dict[str, float | None] = {}
    scale = max(abs(golden.get("max", 0.0)), abs(golden.get("min", 0.0)))
    for k in ("max", "min", "mean", "l2"):
        a, b = my.get(k), golden.get(k)
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            out[f"{k}_diff"] = None
            out[f"{k}_rel_diff"] = None
            continue
        out[f"{k}_diff"] = a - b
        denom = abs(b) if k == "l2" else scale
        if denom == 0.0:
            out[f"{k}_rel_diff"] = 0.0 if a == b else math.inf
        else:
            out[f"{k}_rel_diff"] = abs(a - b) / denom
    return out
