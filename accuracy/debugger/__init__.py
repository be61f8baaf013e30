"""msprobe's `PrecisionDebugger` and `config.json` on top of the dumper (docs/long-runs.md)."""

from accuracy.debugger.core import PrecisionDebugger

__all__ = ["PrecisionDebugger"]
