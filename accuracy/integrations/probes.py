"""What every callback shares: start, stop and step each probe around a framework's step.

A probe is anything with msprobe's three calls (PrecisionDebugger is one). A probe that
raises is logged and the training goes on; the others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from accuracy.errors import UsageError

log = logging.getLogger(__name__)


@runtime_checkable
class Probe(Protocol):
    def start(self, model: Any = None) -> None: ...
    def stop(self) -> None: ...
    def step(self) -> None: ...


class Probes:
    """The probes a callback drives, in the order given."""

    def __init__(self, probes: Iterable[Any]) -> None:
        self.probes = tuple(probes)
        if not self.probes:
            raise UsageError("give the callback at least one probe, e.g. "
                             "PrecisionDebugger(config_path='config.json')")
        bad = [type(p).__name__ for p in self.probes if not isinstance(p, Probe)]
        if bad:
            raise UsageError(f"{bad[0]} is not a probe: it needs start(model), stop() and step()")
        self._open = False

    def _each(self, call: str, *args: Any) -> None:
        for p in self.probes:
            try:
                getattr(p, call)(*args)
            except Exception as e:  # noqa: BLE001 - the training goes on
                log.error("%s.%s() failed: %s", type(p).__name__, call, e)

    def sync(self, global_step: int) -> None:
        """Resumed training: the framework's step count is where ours starts."""
        for p in self.probes:
            if hasattr(p, "current_step") and isinstance(global_step, int):
                p.current_step = global_step

    def begin(self, model: Any) -> None:
        self._each("start", model)
        self._open = True

    def end(self) -> None:
        if self._open:
            self._each("stop")
        self._open = False
        self._each("step")

    def close(self) -> None:
        """Training ended or raised: close an open region so its dump is complete."""
        if self._open:
            self._each("stop")
        self._open = False
