"""Confirmation: re-run each birth op on a reference with the dump's own inputs.

The same op in the same dtype, and once more widened (16-bit floats to float32, float32 to
float64), tells apart "the data is out of range" (the reference overflows too in the same dtype:
a scaling problem) from "the device kernel is wrong" (the reference stays finite).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_flatten

from accuracy import safeops
from accuracy.dumpfile import Dump, OpRecord
from accuracy.dumpfile.argcodec import decode_call

log = logging.getLogger(__name__)


class Births(Protocol):
    """What confirming needs of a scan's report (`scan.OverflowReport`): its births, each with
    a `seq` and a `confirmation` to fill. Scan imports this module, so nothing here imports
    scan back, not even for an annotation."""

    births: list[Any]


OUT_OF_RANGE = "data out of range (reference overflows too)"
KERNEL = "device kernel problem (reference stays finite)"
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
          torch.float32: torch.float64}


def _nonfinite(out: Any) -> bool:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            x = torch.view_as_real(t) if t.is_complex() else t
            if not bool(torch.isfinite(x).all()):
                return True
    return False


def _run(r: OpRecord, inputs: list[torch.Tensor], device: str, widen: bool) -> bool:
    ts = [t.to(device) for t in inputs]
    if widen:
        ts = [t.to(_WIDER[t.dtype]) if t.dtype in _WIDER else t for t in ts]
    args, kwargs = decode_call(r.args_json, ts)
    if widen:  # explicit dtype arguments would narrow again
        if isinstance(kwargs.get("dtype"), torch.dtype) and kwargs["dtype"] in _WIDER:
            kwargs["dtype"] = _WIDER[kwargs["dtype"]]
    fn = safeops.compute_op(r.op)  # a name from the file: only allow-listed compute ops run
    safeops.check_call(fn, args, kwargs)
    return _nonfinite(fn(*args, **kwargs))


def confirm_op(r: OpRecord, device: str = "cpu") -> dict[str, Any]:
    """Replay one birth op; the verdict with both reference results."""
    res: dict[str, Any] = {"device": device}
    try:
        inputs = [t.load() for t in r.inputs]
    except Exception as e:  # noqa: BLE001 - statistics-only dumps have no values
        res["verdict"] = f"not confirmed: {e}"
        return res
    try:
        res["same_dtype_overflows"] = _run(r, inputs, device, widen=False)
    except Exception as e:  # noqa: BLE001 - an op the reference cannot run: say so
        res["verdict"] = f"not confirmed: replay failed ({type(e).__name__}: {e})"
        return res
    try:
        res["wide_overflows"] = _run(r, inputs, device, widen=True)
    except Exception as e:  # noqa: BLE001
        res["wide_overflows"] = None
        log.info("widened replay of op %d failed: %s", r.seq, e)
    if res["same_dtype_overflows"]:
        res["verdict"] = OUT_OF_RANGE
        if res.get("wide_overflows") is False:
            res["verdict"] += "; finite in a wider dtype: a scaling/precision-range problem"
    else:
        res["verdict"] = KERNEL
    return res


def confirm_births(d: Dump, rep: Births, device: str = "cpu") -> None:
    """Fill `confirmation` of each birth in `rep` by replaying it on `device`."""
    for b in rep.births:
        b.confirmation = confirm_op(d.record(b.seq), device)
