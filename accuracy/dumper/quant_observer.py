"""An observer that writes the fp8/MX quantisation figures of an op into its record.

The figures come from whatever quantised the op's GEMM operands (`sim`'s fp8 and MX
profiles) through `accuracy.device_backend.quant_figures`; they land in the op's `extra`
under "quant" (one dict per operand), in tensor and statistics mode alike.
"""

from __future__ import annotations

from typing import Any

import torch

from accuracy.device_backend import quant_figures
from accuracy.dumper.calls import Call
from accuracy.dumpfile import schema


class QuantFigures:
    """Observer: `extra["quant"]` from the figures published while the op ran."""

    def __init__(self) -> None:
        self.ops = 0
        self._subscribed = True
        quant_figures.subscribe()

    def before(self, call: Call) -> None:
        quant_figures.take()  # figures of ops not recorded (filtered out) are not this op's

    def after(self, call: Call, outputs: list[torch.Tensor]) -> None:
        figs = quant_figures.take()
        if figs:
            call.extra[schema.EXTRA_QUANT] = figs
            self.ops += 1

    def finish(self) -> dict[str, Any]:
        if self._subscribed:
            self._subscribed = False
            quant_figures.unsubscribe()
        return {schema.ROOT_QUANT_OPS: self.ops} if self.ops else {}
