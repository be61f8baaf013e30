"""Live experiments on a running step: check every op against a reference, run chosen ops
elsewhere, and prove a culprit by substitution. See docs/live.md.
"""

from accuracy.live.check import LiveCheck, LiveCheckError, OpResult, live_check

__all__ = ["LiveCheck", "LiveCheckError", "OpResult", "live_check"]
