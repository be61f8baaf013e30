"""Live experiments on a running step: check every op against a reference, run chosen ops
elsewhere, and prove a culprit by substitution. See docs/live.md.
"""

from accuracy.live.check import LiveCheck, LiveCheckError, OpResult, live_check
from accuracy.live.prove import Culprit, Proof, prove
from accuracy.live.substitute import Substitute, substitute

__all__ = ["Culprit", "LiveCheck", "LiveCheckError", "OpResult", "Proof", "Substitute",
           "live_check", "prove", "substitute"]
