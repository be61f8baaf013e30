"""Where the monitor's scalars go besides its own file: the writers users already open.

A sink has `scalars(step, {tag: value})` and `text(step, tag, text)`. `TensorBoard` writes
through `torch.utils.tensorboard.SummaryWriter` (given one, or a log folder); the Trainer and
Lightning adapters (accuracy/integrations) hand the same scalars to the framework's own
loggers. What goes: the loss, the global gradient norm, the per-layer figures a trigger reads
(`Trigger.figures`), and each trigger firing and capture as text. The heat map and the
capture stay in the monitor's own file and page.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Protocol, runtime_checkable

from accuracy.errors import UsageError

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    def scalars(self, step: int, values: dict[str, float]) -> None: ...
    def text(self, step: int, tag: str, text: str) -> None: ...


class TensorBoard:
    """A `SummaryWriter` (or a log folder one is opened in: closed with the monitor)."""

    def __init__(self, writer: Any) -> None:
        self._own = isinstance(writer, str | os.PathLike)
        if self._own:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise UsageError("tensorboard= needs the tensorboard package: pip install "
                                 "'accuracy[tensorboard]'") from None
            writer = SummaryWriter(log_dir=str(writer))
        if not (hasattr(writer, "add_scalar") and hasattr(writer, "add_text")):
            raise UsageError(f"tensorboard= takes a SummaryWriter or a folder, not "
                             f"{type(writer).__name__}")
        self.writer = writer

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, step)

    def text(self, step: int, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if self._own:
            self.writer.close()
        else:
            self.writer.flush()


def scalars_of(loss: float, grad_norm: float, figs: dict[str, Any] | None,
               figure_keys: list[str], module_names: list[str],
               param_names: list[str]) -> dict[str, float]:
    """The tags and values of one step: `monitor/loss`, `monitor/grad_norm`, and
    `monitor/<kind>/<figure>/<name>` for each figure a trigger reads (not-measured left out)."""
    out: dict[str, float] = {}
    if not math.isnan(loss):
        out["monitor/loss"] = loss
    if figs is not None and not math.isnan(grad_norm):
        out["monitor/grad_norm"] = grad_norm
    for key in figure_keys if figs is not None else ():
        kind, _, fig = key.partition("/")
        values = figs.get(kind, {}).get(fig)
        if values is None:
            continue
        names = module_names if kind == "module" else param_names
        for name, v in zip(names, values, strict=False):
            if not math.isnan(v):
                out[f"monitor/{key}/{name}"] = v
    return out
