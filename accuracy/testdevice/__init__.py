"""The npu test device: an accelerator made of the CPU, so this tool is tested as it runs on one.

`load()` builds (once per machine, in `$ACCURACY_CACHE_DIR/torch_extensions`) and registers an
out-of-tree PyTorch device through the `PrivateUse1` dispatch key, the way `torch_npu`,
`torch_mlu` and `torch_musa` plug in, named `npu`, with a `torch.npu` module. Its numerics are
PyTorch's CPU kernels; what makes it an accelerator for testing:

- kernels run asynchronously, in order, on one worker thread per device (2 devices): a read
  that forgets to wait sees stale memory; `.cpu()`, `item()`, `synchronize()` and
  `Event.synchronize()` wait, and a queued kernel's error is raised at the next wait;
- `data_ptr()` is a device address the host cannot read (a raw read faults);
- random ops draw from the device's own generators, not CPU's;
- optimizers default to their foreach kernels, `torch.autocast("npu")` casts like CUDA's,
  `torch.amp.GradScaler("npu")` works, pinned memory and events make non-blocking copies;
- counters of copies, bytes, synchronisations and kernels (`counters()`, `counting()`).

Trying your own device works the same way: build its extension, import it (it registers its
PrivateUse1 backend, e.g. `import torch_npu`), and run the same code with its device name.
docs/testdevice.md says more, including what this device does not emulate.

    import accuracy.testdevice as testdevice
    npu = testdevice.load()                   # torch.npu
    model = model.to("npu")
    with testdevice.counting() as c:
        loss = model(x.to("npu")).sum(); loss.backward()
    print(c["d2h_copies"], c["syncs_implicit"], c["sync_reasons"])
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from accuracy.errors import ExtensionUnavailableError

log = logging.getLogger(__name__)

NAME = "npu"
_CSRC = Path(__file__).with_name("csrc")
_SOURCES = ("memory.cpp", "queue.cpp", "device.cpp", "kernels.cpp", "rnn.cpp", "autocast.cpp",
            "module.cpp")
_lock = threading.Lock()
_unusable: list[str] = []  # why this process's device cannot run a backward, once known
load_seconds: float | None = None  # how long this process's load() took (build included)


def sources() -> list[Path]:
    """The C++ sources of the device, in build order."""
    return [_CSRC / name for name in _SOURCES]


def _refuse_if_taken() -> None:
    """One line naming what holds `npu` or PrivateUse1, before anything is registered."""
    if "torch_npu" in sys.modules:
        raise ExtensionUnavailableError(
            "a real torch_npu is loaded in this process: the npu test device cannot share its "
            "name (run the tests in a process without torch_npu)")
    taken = torch._C._get_privateuse1_backend_name()
    if taken != "privateuseone":
        raise ExtensionUnavailableError(
            f"PrivateUse1 is already taken by the backend {taken!r}: the npu test device needs "
            f"it (run it in a process without that backend)")
    if hasattr(torch, NAME):
        raise ExtensionUnavailableError(
            f"torch.{NAME} already exists in this process: the npu test device cannot replace it")
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "PrivateUse1"):
        raise ExtensionUnavailableError(
            "another extension registered PrivateUse1 kernels in this process: the npu test "
            "device needs the key to itself")


def load() -> ModuleType:
    """Build if needed, register the `npu` device and return `torch.npu`. Idempotent.

    Raises ExtensionUnavailableError (one line: what to do) where it cannot: no C++ compiler or
    ninja, a build cache others can write, `torch_npu` or another PrivateUse1 backend loaded."""
    global load_seconds
    from accuracy.testdevice import npu as module

    with _lock:
        if _unusable:
            raise ExtensionUnavailableError(_unusable[0])
        if module.extension() is not None:
            return module
        started = time.perf_counter()
        _refuse_if_taken()
        from accuracy.native.cppext import load_extension

        ext = load_extension("accuracy_npu", sources())
        if not ext.register_hooks():
            raise ExtensionUnavailableError(
                "another backend registered the PrivateUse1 hooks in this process: the npu test "
                "device cannot register its own")
        torch.utils.rename_privateuse1_backend(NAME)
        torch._register_device_module(NAME, module)
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
        module.default_generators = tuple(ext.default_generator(i)
                                          for i in range(ext.device_count()))
        module.bind(ext)
        atexit.register(_at_exit, ext)
        _check_autograd(ext)
        load_seconds = time.perf_counter() - started
        log.info("npu test device ready in %.2f s", load_seconds)
        return module


def _check_autograd(ext: Any) -> None:
    """The autograd engine sizes its per-device threads once, at the process's first backward:
    a device registered after that cannot run one (torch raises an internal assert). Say so
    plainly instead."""
    try:
        probe = torch.ones(1, device=NAME, requires_grad=True)
        (probe * 2).sum().backward()
        ext.synchronize(0)
    except RuntimeError as e:
        if "device_ready_queues_" not in str(e):
            raise
        _unusable.append(
            "a backward() ran in this process before the npu test device was loaded, so "
            "torch's autograd engine has no thread for it: call accuracy.testdevice.load() "
            "before any backward (tests: the conftest loads it at collection)")
        raise ExtensionUnavailableError(_unusable[0]) from None
    finally:
        ext.reset_counters()


def _at_exit(ext: Any) -> None:
    try:
        if not _unusable:
            _settle_autograd_threads(ext)
    finally:
        ext.shutdown()


def _settle_autograd_threads(ext: Any) -> None:
    """torch's autograd thread of a device may drop a backward's last reference after the
    caller resumed, and what it drops (the contextvars.Context torch stashes for the backward)
    needs the GIL: at interpreter exit that kills the process ("terminate called without an
    active exception"). One more backward per device, through the engine directly (nothing
    stashed), lets each thread finish its previous one while the GIL can still be had."""
    from torch.autograd import Variable

    for i in range(ext.device_count()):
        leaf = torch.zeros((), device=f"{NAME}:{i}", requires_grad=True)
        grad = torch.ones((), device=f"{NAME}:{i}")
        Variable._execution_engine.run_backward((leaf * 1,), (grad,), False, False, (), True, True)
        ext.synchronize(i)


def _ext() -> Any:
    from accuracy.testdevice import npu as module

    ext = module.extension()
    if ext is None:
        raise ExtensionUnavailableError("the npu test device is not loaded: call "
                                        "accuracy.testdevice.load() first")
    return ext


# ---- counters ----

def counters() -> dict[str, Any]:
    """What the device did since the last reset_counters() (all devices together):

    - d2h_copies, d2h_bytes: copies to the host (`.cpu()`, `.to("cpu")`, `item()`...) and the
      bytes they read from the device; d2h_nonblocking: those that did not wait (into pinned
      memory with non_blocking=True);
    - h2d_copies, h2d_bytes, h2d_nonblocking: the same from the host to the device;
    - d2d_copies, d2d_bytes: copies between device tensors;
    - syncs_explicit: synchronize(), Event.synchronize(), Stream.synchronize();
      syncs_implicit: waits an op needed (item(), a blocking copy, nonzero...);
      sync_reasons: {what waited: how many times} for both kinds;
    - kernels_queued: tasks queued (kernels and copies); kernels_sync: ops run on the host
      after draining the queue (data-dependent outputs, no Meta kernel); kernels_failed.
    """
    return dict(_ext().counters())


def reset_counters() -> None:
    _ext().reset_counters()


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            old = before.get(key, {})
            out[key] = {k: v - old.get(k, 0) for k, v in value.items() if v - old.get(k, 0)}
        else:
            out[key] = value - before.get(key, 0)
    return out


@contextlib.contextmanager
def counting() -> Iterator[dict[str, Any]]:
    """The counters' increase over the block, in the dict it yields (filled at its end).
    Nests, and leaves the running totals alone."""
    result: dict[str, Any] = {}
    before = counters()
    try:
        yield result
    finally:
        result.update(_delta(before, counters()))


# ---- test hooks: make the asynchrony visible ----

@contextlib.contextmanager
def paused(device: int = 0) -> Iterator[None]:
    """Hold the device's queue: kernels issued inside stay queued (a wait raises instead of
    hanging) until the block ends."""
    ext = _ext()
    ext.set_paused(device, True)
    try:
        yield
    finally:
        ext.set_paused(device, False)


@contextlib.contextmanager
def slowed(micros: int, device: int = 0) -> Iterator[None]:
    """Make every task of the device's queue start `micros` later."""
    ext = _ext()
    ext.set_delay_us(device, micros)
    try:
        yield
    finally:
        ext.set_delay_us(device, 0)


@contextlib.contextmanager
def launch_blocking() -> Iterator[None]:
    """Wait after every task queued inside the block, so a kernel's error is raised by the op
    that queued it (ASCEND_LAUNCH_BLOCKING=1 does this for the whole process, as
    CUDA_LAUNCH_BLOCKING=1 does on CUDA)."""
    ext = _ext()
    was = ext.blocking()
    ext.set_blocking(True)
    try:
        yield
    finally:
        ext.set_blocking(was)


def peek_unsynchronized(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the device memory of `t` as it is now, without waiting for the queue:
    what a read that forgets to synchronise sees. For tests only."""
    return _ext().peek(t)
