"""The backends we know out of the box: one short definition per vendor.

Sync switches are the vendors' documented ones: CUDA_LAUNCH_BLOCKING (NVIDIA),
ASCEND_LAUNCH_BLOCKING (Ascend Extension for PyTorch), CATCH_ASYNC_DISABLE (Cambricon
PyTorch/CATCH), MUSA_LAUNCH_BLOCKING (Moore Threads), IPEX_XPU_SYNC_MODE (Intel Extension for
PyTorch). MPS has no such switch: `torch.mps.synchronize()` is the only way.
"""

from __future__ import annotations

import platform

import torch

from .base import AcceleratorBackend, Backend, CpuBackend


class CudaBackend(AcceleratorBackend):
    """NVIDIA (and ROCm builds, which also answer to `cuda`)."""

    def version(self) -> str | None:
        if torch.version.cuda:
            return f"CUDA {torch.version.cuda}"
        hip = getattr(torch.version, "hip", None)
        return f"HIP {hip}" if hip else None


class XpuBackend(AcceleratorBackend):
    """Intel GPUs through upstream torch.xpu (IPEX optional)."""

    def version(self) -> str | None:
        xpu = getattr(torch.version, "xpu", None)
        return f"SYCL {xpu}" if xpu else torch.__version__


class MpsBackend(AcceleratorBackend):
    """Apple GPUs. No pinned memory, and availability lives in torch.backends.mps."""

    def is_available(self) -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available())

    def version(self) -> str | None:
        mac = platform.mac_ver()[0]
        return f"macOS {mac}" if mac else None

    def device_name(self) -> str | None:
        return platform.processor() or None


class SimBackend(CpuBackend):
    """`sim`, the emulated accelerator: CPU tensors, numerics changed by an active `sim(...)`."""

    def __init__(self) -> None:
        super().__init__("sim", "emulated accelerator on CPU (numerics profiles, fault injection)")
        self.fallback_note = "not applicable: every op runs on CPU"

    def version(self) -> str | None:
        from accuracy import __version__

        return f"accuracy {__version__}"

    def table_row(self) -> dict:
        row = super().table_row()
        row["device"] = "cpu (emulated)"
        return row


def builtin_backends() -> list[Backend]:
    """Fresh instances of every backend the project ships, in display order."""
    return [
        CpuBackend(),
        SimBackend(),
        CudaBackend(
            "cuda",
            "cuda",
            sync_env={"CUDA_LAUNCH_BLOCKING": "1"},
            fallback_note="no CPU fallback: unsupported ops raise NotImplementedError",
            description="NVIDIA GPUs (also AMD ROCm builds of torch)",
        ),
        AcceleratorBackend(
            "npu",
            "npu",
            "torch_npu",
            sync_env={"ASCEND_LAUNCH_BLOCKING": "1"},
            fallback_note=(
                "torch_npu warns 'CAUTION: The operator ... is not currently supported on the "
                "NPU backend and will fall back to run on the CPU' (UserWarning, once per op)"
            ),
            description="Huawei Ascend NPUs via torch_npu (Ascend Extension for PyTorch)",
        ),
        AcceleratorBackend(
            "mlu",
            "mlu",
            "torch_mlu",
            sync_env={"CATCH_ASYNC_DISABLE": "1"},
            fallback_note=(
                "torch_mlu warns when an op falls back to the CPU; ENABLE_FALLBACK_TO_CPU=0 "
                "turns the fallback into an error"
            ),
            description="Cambricon MLUs via torch_mlu",
        ),
        AcceleratorBackend(
            "musa",
            "musa",
            "torch_musa",
            sync_env={"MUSA_LAUNCH_BLOCKING": "1"},
            fallback_note="torch_musa warns (UserWarning) when an op runs on the CPU fallback",
            description="Moore Threads GPUs via torch_musa",
        ),
        XpuBackend(
            "xpu",
            "xpu",
            sync_env={"IPEX_XPU_SYNC_MODE": "1"},
            fallback_note=(
                "PYTORCH_ENABLE_XPU_FALLBACK=1 allows CPU fallback; PYTORCH_DEBUG_XPU_FALLBACK=1 "
                "names each fallen-back op in a warning"
            ),
            description="Intel GPUs via torch.xpu (IPEX_XPU_SYNC_MODE needs IPEX)",
        ),
        MpsBackend(
            "mps",
            "mps",
            fallback_note=(
                "PYTORCH_ENABLE_MPS_FALLBACK=1 allows CPU fallback; each op warns 'is not "
                "currently supported on the MPS backend and will fall back to run on the CPU'"
            ),
            description="Apple GPUs (Metal Performance Shaders)",
            pin_memory=False,
        ),
    ]
