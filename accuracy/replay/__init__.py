"""Replay: re-run each recorded op on a reference backend with the device's own inputs.

This separates an op's local error (its own kernel) from the error it inherited from earlier
ops. See docs/replay.md.
"""

from accuracy.replay.engine import ReplayError, ReplayResult, reference_device, replay
from accuracy.replay.ops import OpOutcome, replay_op
from accuracy.replay.registry import lookup_reference, register_reference, unregister_reference

__all__ = [
    "OpOutcome",
    "ReplayError",
    "ReplayResult",
    "lookup_reference",
    "reference_device",
    "register_reference",
    "replay",
    "replay_op",
    "unregister_reference",
]
