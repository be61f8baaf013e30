"""Load mode: feed each live op the golden dump's recorded inputs (same op name, same seq).

Ascend's dumper had it as `load_file_path=`: the model runs on the device, but every matching
op computes on the golden run's inputs, so its recorded output measures the device kernel's
local error on real hardware. `dumper(load_file_path=...)` adds a `GoldenFeeder` as the first
observer of its loop (accuracy/dumper/loop.py): its `before` swaps the inputs in.
The golden file is a whole dump, or an `accuracy extract` file of just the ops to load (also
after h5copy, as in Ascend's guide): ops it lacks run on their live inputs.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from accuracy.aten import plan_of, written_ids
from accuracy.dumper.calls import Call, KernelCall
from accuracy.dumper.flatten import tensors_in
from accuracy.dumpfile import schema
from accuracy.dumpfile.extract import ExtractedOp, ExtractedOps, is_extract_file
from accuracy.dumpfile.reader import Dump, DumpError, OpRecord, load_dump

log = logging.getLogger(__name__)


def open_golden(path: str | os.PathLike[str]) -> Dump | ExtractedOps:
    """A dump, or an extract file (which `load_dump` refuses: it is not a whole run)."""
    if os.path.isfile(path) and is_extract_file(path):
        return ExtractedOps(path)
    return load_dump(path)


class GoldenFeeder:
    """Replaces an op's input tensors with the golden dump's, when op and seq match."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.dump: Dump | ExtractedOps = open_golden(path)
        if self.dump.attrs.get("mode") == "statistics":
            self.dump.close()
            raise DumpError(f"{path}: load mode needs a tensor-mode golden dump, this one holds "
                            "statistics only")
        self.fed = 0

    def _golden(self, name: str, seq: int) -> OpRecord | ExtractedOp | None:
        try:
            rec = self.dump.record(seq)
        except KeyError:
            return None
        return rec if rec.op == name else None

    def feed(self, name: str, seq: int, func: Any, args: tuple, kwargs: dict
             ) -> tuple[tuple, dict, bool]:
        """(args, kwargs, fed): the call with golden inputs, or unchanged when none match."""
        rec = self._golden(name, seq)
        if rec is None or plan_of(func).view:
            return args, kwargs, False
        flat, spec = tree_flatten((args, kwargs))
        slots = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        if len(slots) != len(rec.inputs) or not all(t.has_data for t in rec.inputs):
            return args, kwargs, False
        if any(tuple(flat[i].shape) != tuple(g.shape)
               for i, g in zip(slots, rec.inputs, strict=True)):
            log.debug("load mode: %s seq %d shapes differ from the golden dump", name, seq)
            return args, kwargs, False
        written = written_ids(func, args, kwargs)
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            for i, g in zip(slots, rec.inputs, strict=True):
                live = flat[i]
                value = g.load()
                if id(live) in written:
                    live.copy_(value)
                else:
                    new = torch.empty_like(live)
                    new.copy_(value)
                    flat[i] = new
        self.fed += 1
        args, kwargs = tree_unflatten(flat, spec)
        return tuple(args), kwargs, True

    # -- observer ----------------------------------------------------------------------------

    def before(self, call: Call) -> None:
        if type(call) is KernelCall:  # a launch reaches the loop after it ran: nothing to feed
            return
        args, kwargs, fed = self.feed(call.name, call.seq, call.func, call.args, call.kwargs)
        if fed:
            call.args, call.kwargs = args, kwargs
            call.inputs = tensors_in(kwargs, tensors_in(args))
            call.extra[schema.EXTRA_LOADED] = True

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        pass

    def finish(self) -> dict[str, Any]:
        return {schema.ROOT_OPS_LOADED: self.fed}

    def close(self) -> None:
        self.dump.close()
