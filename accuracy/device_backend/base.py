"""What a backend is: a device family, its extension module, sync, host copies and memory.

Everything device-specific the rest of the project needs goes through a `Backend`, so the
dumper never has `if device == "npu"` branches of its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger(__name__)

_UNSET = object()


class HostCopy:
    """A device-to-host copy that may still be in flight.

    `wait()` returns a contiguous CPU tensor that no one else holds, so the caller may keep it
    after the source tensor is mutated in place or freed.
    """

    def __init__(self, host: torch.Tensor, event: Any = None, source: torch.Tensor | None = None):
        self._host = host
        self._event = event
        # Keep the source alive until the copy is known to be finished.
        self._source = source

    def ready(self) -> bool:
        """True when `wait()` would not block."""
        if self._event is None:
            return True
        query = getattr(self._event, "query", None)
        return bool(query()) if query is not None else False

    def wait(self) -> torch.Tensor:
        """Block until the copy is complete and return the host tensor (no wait for a copy
        already known done: a later event on the same queue was waited for)."""
        if self._event is not None:
            if not self.ready():
                self._event.synchronize()
            self._event = None
            self._source = None
        return self._host


def _registered_device(device_type: str) -> bool:
    """Whether `device_type` is the PrivateUse1 device already registered with a
    `torch.<device_type>` module (an out-of-tree device whose extension has another name)."""
    try:
        return (torch._C._get_privateuse1_backend_name() == device_type
                and getattr(torch, device_type, None) is not None)
    except Exception:  # an older torch without the query: the extension path decides
        return False


def _private_cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy made outside any dispatch mode (never recorded, never faulted)."""
    with torch._C._DisableTorchDispatch(), torch.no_grad():
        if t.device.type == "cpu":
            return t.detach().clone(memory_format=torch.contiguous_format)
        return t.detach().to("cpu", copy=True).contiguous()


class Backend:
    """One device family. Subclass it, or instantiate `AcceleratorBackend` for a CUDA-like one.

    Attributes:
        name: registry key and what dumps record ("cuda", "npu", "sim"...).
        device_type: the `torch.device` type its tensors have.
        extension: module to import before the device exists (e.g. "torch_npu"), or None.
        sync_env: environment switches that make kernels run synchronously, for debugging.
        fallback_note: where the backend reports ops that silently fell back to the CPU.
    """

    def __init__(
        self,
        name: str,
        device_type: str,
        extension: str | None = None,
        *,
        sync_env: dict[str, str] | None = None,
        fallback_note: str = "",
        description: str = "",
    ) -> None:
        self.name = name
        self.device_type = device_type
        self.extension = extension
        self.sync_env: dict[str, str] = dict(sync_env or {})
        self.fallback_note = fallback_note
        self.description = description

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device_type={self.device_type!r})"

    def is_available(self) -> bool:
        """Whether tensors can be created on this backend in this process."""
        raise NotImplementedError

    def version(self) -> str | None:
        """The version that matters for numerics (runtime or extension), if known."""
        return None

    def synchronize(self) -> None:
        """Wait for all queued work on the current device."""

    def to_host(self, t: torch.Tensor) -> HostCopy:
        """Start copying `t` to host memory; `.wait()` gives a private contiguous CPU tensor."""
        return HostCopy(_private_cpu_copy(t))

    def memory(self) -> dict[str, int] | None:
        """Memory figures in bytes where the backend has them, else None."""
        return None

    def device(self, index: int | None = None) -> torch.device:
        """The torch.device for this backend (imports the extension first)."""
        return torch.device(self.device_type if index is None else f"{self.device_type}:{index}")

    def device_name(self) -> str | None:
        """Human name of device 0 (e.g. the GPU model), if known."""
        return None

    def table_row(self) -> dict[str, Any]:
        """One row of `accuracy backends` (JSON-serialisable)."""
        available = self.is_available()
        device = self.device_type
        if available and self.device_type != "cpu":
            label = self.device_name()
            device = f"{self.device_type}:0" + (f" ({label})" if label else "")
        return {
            "name": self.name,
            "available": available,
            "device": device,
            "extension": self.extension,
            "version": self.version() if available else _installed_version(self.extension),
            "sync_env": dict(self.sync_env),
            "memory": self.memory() if available else None,
        }


def _installed_version(module: str | None) -> str | None:
    """Version of an installed-but-unusable extension, without importing it."""
    if module is None:
        return None
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - stdlib since 3.8
        return None
    for dist in (module, module.replace("_", "-")):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


class CpuBackend(Backend):
    """Plain CPU: always present, synchronous, host copy is a clone."""

    def __init__(self, name: str = "cpu", description: str = "host CPU (the reference)") -> None:
        super().__init__(
            name,
            "cpu",
            None,
            fallback_note="not applicable: CPU is the fallback target",
            description=description,
        )

    def is_available(self) -> bool:
        return True

    def version(self) -> str | None:
        return torch.__version__

    def memory(self) -> dict[str, int] | None:
        try:
            import resource
        except ImportError:  # not on Windows
            return None
        # ru_maxrss is KiB on Linux.
        return {"max_rss": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


class AcceleratorBackend(Backend):
    """A CUDA-like backend reached through `torch.<device_type>` once its extension is imported.

    Works for any vendor whose extension mirrors the `torch.cuda` API (is_available,
    synchronize, Event, memory_allocated...), which is what torch_npu, torch_mlu, torch_musa
    and torch.xpu do.
    """

    def __init__(
        self,
        name: str,
        device_type: str,
        extension: str | None = None,
        *,
        sync_env: dict[str, str] | None = None,
        fallback_note: str = "",
        description: str = "",
        pin_memory: bool = True,
    ) -> None:
        super().__init__(
            name,
            device_type,
            extension,
            sync_env=sync_env,
            fallback_note=fallback_note,
            description=description,
        )
        self.pin_memory = pin_memory
        self._module: Any = _UNSET

    def module(self) -> ModuleType | None:
        """`torch.<device_type>` after importing the extension; None when it cannot be had."""
        if self._module is not _UNSET and (self._module is not None
                                           or not _registered_device(self.device_type)):
            return self._module  # (a device registered since the last call is taken up)
        mod = None
        try:
            if _registered_device(self.device_type):
                # the device is plugged in already, under this name, by whatever extension
                # registered it (the test device, a vendor's renamed package): use it
                mod = getattr(torch, self.device_type)
            elif self.extension is not None and self.extension not in sys.modules:
                # find_spec first: a missing extension is the common case and must be cheap.
                if importlib.util.find_spec(self.extension) is None:
                    raise ImportError(f"{self.extension} is not installed")
                importlib.import_module(self.extension)
                mod = getattr(torch, self.device_type, None)
            else:
                mod = getattr(torch, self.device_type, None)
        except Exception as exc:  # a broken vendor install must not break the tool
            log.debug("backend %s unavailable: %s", self.name, exc)
            mod = None
        self._module = mod
        return mod

    def is_available(self) -> bool:
        mod = self.module()
        if mod is None:
            return False
        try:
            return bool(mod.is_available())
        except Exception as exc:
            log.debug("backend %s: is_available() failed: %s", self.name, exc)
            return False

    def version(self) -> str | None:
        if self.extension is None or self.module() is None:
            return None
        ext = sys.modules.get(self.extension)
        if ext is None:  # the device was registered by another package (the test device)
            if importlib.util.find_spec(self.extension) is None:
                return None
            ext = importlib.import_module(self.extension)
        return getattr(ext, "__version__", None) or _installed_version(self.extension)

    def synchronize(self) -> None:
        mod = self.module()
        if mod is not None and self.is_available():
            mod.synchronize()

    def device(self, index: int | None = None) -> torch.device:
        self.module()  # registers the device type with torch
        return super().device(index)

    def device_name(self) -> str | None:
        fn = getattr(self.module(), "get_device_name", None)
        try:
            return str(fn(0)) if fn is not None else None
        except Exception:
            return None

    def to_host(self, t: torch.Tensor) -> HostCopy:
        mod = self.module()
        event_cls = getattr(mod, "Event", None) if mod is not None else None
        if t.device.type != self.device_type or event_cls is None:
            return HostCopy(_private_cpu_copy(t))
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            src = t.detach()
            host = self._host_buffer(src)
            host.copy_(src, non_blocking=True)
            event = event_cls()
            event.record()
        return HostCopy(host, event, src)

    def _host_buffer(self, src: torch.Tensor) -> torch.Tensor:
        """Pinned when possible, so the copy can overlap with compute."""
        if self.pin_memory:
            try:
                return torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            except Exception as exc:
                log.debug("backend %s: pinned memory unavailable (%s)", self.name, exc)
                self.pin_memory = False
        # Pageable destination: the copy is synchronous, which is still correct.
        return torch.empty(src.shape, dtype=src.dtype)

    def memory(self) -> dict[str, int] | None:
        mod = self.module()
        if mod is None:
            return None
        figures: dict[str, int] = {}
        for key, names in (
            ("allocated", ("memory_allocated", "current_allocated_memory")),
            ("reserved", ("memory_reserved", "driver_allocated_memory")),
            ("max_allocated", ("max_memory_allocated",)),
        ):
            for fn_name in names:
                fn = getattr(mod, fn_name, None)
                if fn is None:
                    continue
                try:
                    figures[key] = int(fn())
                    break
                except Exception as exc:
                    log.debug("backend %s: %s() failed: %s", self.name, fn_name, exc)
        get_info = getattr(mod, "mem_get_info", None)
        if get_info is not None:
            try:
                free, total = get_info()
                figures["free"], figures["total"] = int(free), int(total)
            except Exception as exc:
                log.debug("backend %s: mem_get_info() failed: %s", self.name, exc)
        return figures or None
