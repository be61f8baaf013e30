"""Small views of large tensors for the browser: histograms, downsampled values, heat maps.

Everything is computed in float64 over finite values; nan/inf are counted, not plotted.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812


def as_f64(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = t.abs()
    return t.detach().to(torch.float64).reshape(-1)


def _finite(x: torch.Tensor) -> torch.Tensor:
    return x[torch.isfinite(x)]


def histogram(tensors: list[torch.Tensor], bins: int = 64) -> dict[str, Any]:
    """Histograms of several tensors over the same edges, so they can be overlaid."""
    bins = max(1, min(int(bins), 1024))
    flats = [as_f64(t) for t in tensors]
    fin = [_finite(x) for x in flats]
    nonempty = [x for x in fin if x.numel()]
    if nonempty:
        lo = min(float(x.min()) for x in nonempty)
        hi = max(float(x.max()) for x in nonempty)
    else:
        lo, hi = 0.0, 1.0
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    counts = [torch.histc(x, bins=bins, min=lo, max=hi).to(torch.int64).tolist()
              if x.numel() else [0] * bins for x in fin]
    return {
        "edges": edges.tolist(),
        "counts": counts,
        "nan": [int(torch.isnan(x).sum()) for x in flats],
        "inf": [int(torch.isinf(x).sum()) for x in flats],
        "numel": [x.numel() for x in flats],
    }


def downsample(t: torch.Tensor, max_points: int = 2048) -> dict[str, Any]:
    """Flattened values in at most max_points buckets, each with its min, max and mean."""
    x = as_f64(t)
    n = x.numel()
    max_points = max(1, min(int(max_points), 100_000))
    if n == 0:
        return {"numel": 0, "bucket": 1, "index": [], "min": [], "max": [], "mean": []}
    step = max(1, math.ceil(n / max_points))
    m = math.ceil(n / step)
    pad = m * step - n
    xf = torch.where(torch.isfinite(x), x, torch.nan)
    padded = torch.cat([xf, torch.full((pad,), torch.nan, dtype=torch.float64)]).view(m, step)
    valid = ~torch.isnan(padded)
    big = torch.finfo(torch.float64).max
    mins = torch.where(valid, padded, big).min(dim=1).values
    maxs = torch.where(valid, padded, -big).max(dim=1).values
    cnt = valid.sum(dim=1)
    means = torch.where(valid, padded, 0.0).sum(dim=1) / cnt.clamp(min=1)
    empty = cnt == 0

    def col(v: torch.Tensor) -> list[float | None]:
        return [None if e else float(a) for a, e in zip(v.tolist(), empty.tolist(), strict=True)]

    return {"numel": n, "bucket": step, "index": [i * step for i in range(m)],
            "min": col(mins), "max": col(maxs), "mean": col(means)}


def error_heatmap(my: torch.Tensor, golden: torch.Tensor, max_cells: int = 64) -> dict[str, Any]:
    """|my - golden| of a 2-D view (leading dims folded into rows), max-pooled to a small grid."""
    if tuple(my.shape) != tuple(golden.shape):
        raise ValueError(f"shapes differ: {list(my.shape)} vs {list(golden.shape)}")
    if my.dim() < 2:
        raise ValueError("a heat map needs a tensor with at least 2 dimensions")
    a = my.detach().to(torch.float64)
    b = golden.detach().to(torch.float64)
    a = a.reshape(-1, a.shape[-1])
    b = b.reshape(-1, b.shape[-1])
    err = (a - b).abs()
    err = torch.where(torch.isnan(err), torch.inf, err)  # a nan on one side is the worst error
    rows, cols = err.shape
    max_cells = max(2, min(int(max_cells), 256))
    out_r, out_c = min(rows, max_cells), min(cols, max_cells)
    finite_cap = torch.finfo(torch.float64).max
    pooled = F.adaptive_max_pool2d(err.clamp(max=finite_cap)[None, None], (out_r, out_c))[0, 0]
    return {
        "rows": rows, "cols": cols, "grid_rows": out_r, "grid_cols": out_c,
        "max": float(pooled.max()) if pooled.numel() else 0.0,
        "values": pooled.tolist(),
    }
