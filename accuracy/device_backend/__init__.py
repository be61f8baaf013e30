"""Device backends (cpu, cuda, npu, mlu, musa, xpu, mps) and `sim`, the emulated accelerator.

The one place that knows devices: which exist here, how to sync them, how to copy a tensor to
the host without stalling, and which switches make them synchronous for debugging. Vendor
extensions (torch_npu, torch_mlu, torch_musa) are imported lazily, only when asked about.

`sim` runs on CPU and applies, op by op, the numerics of a target device (a profile) plus
injected faults; see docs/backends.md.
"""

from . import quant_figures
from .base import AcceleratorBackend, Backend, CpuBackend, HostCopy
from .faults import Fault, register_replacement, replacements
from .profiles import (
    MATRIX_OPERANDS,
    Profile,
    Rule,
    get_profile,
    matrix_rules,
    profiles,
    register_profile,
)
from .quantizer import requantize
from .registry import (
    all_backends,
    available_backends,
    backend_for_tensor,
    backends_table,
    get_backend,
    register_backend,
)
from .rounding import get_rounding, register_rounding, roundings
from .simulator import SimMode, active, sim

__all__ = [
    "MATRIX_OPERANDS",
    "AcceleratorBackend",
    "Backend",
    "CpuBackend",
    "Fault",
    "HostCopy",
    "Profile",
    "Rule",
    "SimMode",
    "active",
    "all_backends",
    "available_backends",
    "backend_for_tensor",
    "backends_table",
    "get_backend",
    "get_profile",
    "get_rounding",
    "matrix_rules",
    "profiles",
    "quant_figures",
    "register_backend",
    "register_profile",
    "register_replacement",
    "register_rounding",
    "replacements",
    "requantize",
    "roundings",
    "sim",
]
