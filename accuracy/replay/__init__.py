"""Replay: re-run each recorded op on a reference backend with the device's own inputs.

This separates an op's local error (its own kernel) from the error it inherited from earlier
ops. See docs/replay.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accuracy._lazy import lazy_getattr

if TYPE_CHECKING:
    from accuracy.replay.cluster import replay_on_cluster
    from accuracy.replay.engine import ReplayError, ReplayResult, reference_device, replay
    from accuracy.replay.ops import OpOutcome, replay_op
    from accuracy.replay.registry import lookup_reference, register_reference, unregister_reference

_LAZY = {
    "ReplayError": "accuracy.replay.engine",
    "ReplayResult": "accuracy.replay.engine",
    "reference_device": "accuracy.replay.engine",
    "replay": "accuracy.replay.engine",
    "replay_on_cluster": "accuracy.replay.cluster",
    "OpOutcome": "accuracy.replay.ops",
    "replay_op": "accuracy.replay.ops",
    "lookup_reference": "accuracy.replay.registry",
    "register_reference": "accuracy.replay.registry",
    "unregister_reference": "accuracy.replay.registry",
}

__all__ = [
    "OpOutcome",
    "ReplayError",
    "ReplayResult",
    "lookup_reference",
    "reference_device",
    "register_reference",
    "replay",
    "replay_on_cluster",
    "replay_op",
    "unregister_reference",
]


__getattr__ = lazy_getattr(__name__, _LAZY)
