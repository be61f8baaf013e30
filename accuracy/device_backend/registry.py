"""The backend registry: name or device -> `Backend`, and the `accuracy backends` table."""

from __future__ import annotations

import logging
from typing import Any

import torch

from accuracy.errors import UsageError

from .base import Backend
from .builtin import builtin_backends

log = logging.getLogger(__name__)

_REGISTRY: dict[str, Backend] = {b.name: b for b in builtin_backends()}


def register_backend(backend: Backend) -> None:
    """Add a backend (or replace the one with the same name), e.g. for a new vendor."""
    if not isinstance(backend, Backend):
        raise TypeError(f"expected a Backend, got {type(backend).__name__}")
    if backend.name in _REGISTRY:
        log.info("replacing backend %r", backend.name)
    _REGISTRY[backend.name] = backend


def _device_key(name_or_device: str | torch.device) -> str:
    if isinstance(name_or_device, torch.device):
        key = name_or_device.type
    elif isinstance(name_or_device, str):
        key = name_or_device.strip().lower().split(":", 1)[0]
    else:
        raise TypeError(f"expected a backend name or torch.device, got {name_or_device!r}")
    if key == "privateuseone":
        # Vendors rename PrivateUse1 ("npu", "musa"...): resolve to the name torch knows.
        key = torch._C._get_privateuse1_backend_name()
    return key


def get_backend(name_or_device: str | torch.device) -> Backend:
    """The backend for "cuda", "npu:3", torch.device("mlu", 0), "sim"...

    Names win over device types, so "cpu" is the CPU backend even though `sim` also runs on
    CPU tensors.
    """
    key = _device_key(name_or_device)
    backend = _REGISTRY.get(key)
    if backend is not None:
        return backend
    for candidate in _REGISTRY.values():
        if candidate.device_type == key:
            return candidate
    raise UsageError(f"unknown backend {key!r}; known: {', '.join(sorted(_REGISTRY))}")


def backend_for_tensor(t: torch.Tensor) -> Backend:
    """The backend that produced `t`: `sim` for CPU tensors while a `sim(...)` is active."""
    if t.device.type == "cpu":
        from .simulator import active

        if active() is not None:
            return _REGISTRY["sim"]
    return get_backend(t.device)


def available_backends() -> list[Backend]:
    """Backends usable in this process (imports vendor extensions that are installed)."""
    return [b for b in _REGISTRY.values() if b.is_available()]


def all_backends() -> list[Backend]:
    """Every registered backend, available or not, in registration order."""
    return list(_REGISTRY.values())


def backends_table() -> list[dict[str, Any]]:
    """Rows for `accuracy backends`.

    Keys: name (str), available (bool), device (str), extension (str | None),
    version (str | None), sync_env (dict[str, str]), memory (dict[str, int] bytes | None).
    """
    rows = []
    for backend in _REGISTRY.values():
        try:
            rows.append(backend.table_row())
        except Exception as exc:  # one broken vendor install must not hide the others
            log.warning("backend %s: cannot describe: %s", backend.name, exc)
            rows.append(
                {
                    "name": backend.name,
                    "available": False,
                    "device": backend.device_type,
                    "extension": backend.extension,
                    "version": None,
                    "sync_env": dict(backend.sync_env),
                    "memory": None,
                }
            )
    return rows


def format_backends_table(rows: list[dict[str, Any]]) -> str:
    """`backends_table()` as the aligned text `accuracy backends` prints."""
    return "\n".join(
        f"{r['name']:6s} {'yes' if r.get('available') else 'no '}  "
        f"{r.get('version') or '-':20s} {r.get('extension') or '':12s} sync: "
        + " ".join(f"{k}={v}" for k, v in (r.get("sync_env") or {}).items())
        for r in rows)
