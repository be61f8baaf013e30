"""A monitor file in a few lines: rows, steps, loss range, events (triggers and captures)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from accuracy.monitor.series import read_series


def summarise(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Figures of the file and a text rendering (`text`)."""
    s = read_series(path)
    finite = s.loss[np.isfinite(s.loss)]
    info: dict[str, Any] = {
        "file": str(s.path), "rank": s.attrs.get("rank"), "rows": int(s.step.size),
        "first_step": int(s.step[0]) if s.step.size else None,
        "last_step": int(s.step[-1]) if s.step.size else None,
        "complete": bool(s.attrs.get("complete")), "modules": len(s.module_names),
        "parameters": len(s.param_names),
        "loss_min": float(finite.min()) if finite.size else None,
        "loss_max": float(finite.max()) if finite.size else None,
        "non_finite_loss_steps": [int(x) for x in s.step[~np.isfinite(s.loss)][:20]],
        "events": s.events,
        "resumed_parts": [str(p) for p in s.segments],
    }
    lines = [f"{info['file']}: {info['rows']} rows, steps {info['first_step']}.."
             f"{info['last_step']}, {info['modules']} modules, {info['parameters']} parameters"
             + ("" if info["complete"] else " (not closed: the job was killed or is running)")
             + (f"; joined with {len(s.segments)} resumed part(s): "
                f"{', '.join(p.name for p in s.segments[:5])}" if s.segments else "")]
    if finite.size:
        lines.append(f"loss {info['loss_min']:.6g} .. {info['loss_max']:.6g}")
    if info["non_finite_loss_steps"]:
        lines.append(f"non-finite loss at steps {info['non_finite_loss_steps']}")
    for e in s.events[:50]:
        what = e.get("reasons") or e.get("messages") or e.get("message") or ""
        if isinstance(what, list):
            what = "; ".join(str(x) for x in what)
        lines.append(f"step {e.get('step')}: {e.get('kind')}: {what}")
    info["text"] = "\n".join(lines)
    return info
