"""Training-loop integrations: thin callbacks that drive probes (PrecisionDebugger, ...).

Loaded on first use, so `import accuracy.integrations` imports neither transformers nor
lightning. Each callback takes one or more probes, objects with `start(model)`, `stop()` and
`step()`: a second feature plugs in by being passed beside the debugger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accuracy._lazy import lazy_getattr

if TYPE_CHECKING:
    from accuracy.integrations.hf_trainer import AccuracyTrainerCallback
    from accuracy.integrations.pl_callback import AccuracyLightningCallback
    from accuracy.integrations.probes import Probe, Probes

_LAZY = {"AccuracyTrainerCallback": "accuracy.integrations.hf_trainer",
         "AccuracyLightningCallback": "accuracy.integrations.pl_callback",
         "Probes": "accuracy.integrations.probes", "Probe": "accuracy.integrations.probes"}

__all__ = ["AccuracyLightningCallback", "AccuracyTrainerCallback", "Probe", "Probes"]

__getattr__ = lazy_getattr(__name__, _LAZY)
