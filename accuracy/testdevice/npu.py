"""`torch.npu` for the npu test device: the module `accuracy.testdevice.load()` registers.

It offers the part of `torch.cuda`'s API that code written for an accelerator calls (and what
`torch.autocast("npu")`, `torch.amp.GradScaler("npu")`, `torch.manual_seed` and the tool's
`device_backend` look for), over the C++ extension in `csrc/`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_C: Any = None  # the built extension, set by accuracy.testdevice.load() through bind()
default_generators: tuple[torch.Generator, ...] = ()


def bind(ext: Any) -> None:
    """Run this device on `ext`, the built extension (accuracy.testdevice.load() does, once)."""
    global _C
    _C = ext


def extension() -> Any:
    """The built extension this device runs on, or None before it is loaded."""
    return _C

DeviceLike = torch.device | str | int | None


def _index(device: DeviceLike = None) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"expected an npu device, got {device}")
    return _C.current_device() if device.index is None else device.index


# ---- devices ----

def is_available() -> bool:
    return _C is not None and not _C.in_bad_fork()


def is_initialized() -> bool:
    return _C is not None


def init() -> None:
    """Nothing to initialise: the device is ready once loaded."""


def _lazy_init() -> None:
    """Nothing to initialise: the device is ready once loaded."""


def _is_in_bad_fork() -> bool:
    return bool(_C.in_bad_fork())


def device_count() -> int:
    return int(_C.device_count())


def current_device() -> int:
    return int(_C.current_device())


def set_device(device: DeviceLike) -> None:
    _C.set_device(_index(device))


def get_device_name(device: DeviceLike = None) -> str:
    _index(device)
    return "accuracy npu test device (CPU kernels on an asynchronous queue)"


class device:  # noqa: N801 - the name torch.cuda.device has
    """Context manager that makes `device` the current npu device."""

    def __init__(self, device: DeviceLike) -> None:
        self.index = None if device is None else _index(device)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index is not None:
            set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)


class device_of(device):  # noqa: N801
    """Context manager that makes the device of tensor `obj` current (if it is on npu)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.device if obj.device.type == "npu" else None)


def synchronize(device: DeviceLike = None) -> None:
    """Wait for every kernel queued on `device`; raises the error a queued kernel raised."""
    _C.synchronize(_index(device))


# ---- random numbers ----

def _generator(device: DeviceLike) -> torch.Generator:
    return default_generators[_index(device)]


def manual_seed(seed: int) -> None:
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    _generator(None).seed()


def seed_all() -> None:
    value = default_generators[0].seed()
    for g in default_generators[1:]:
        g.manual_seed(value)


def initial_seed() -> int:
    return int(_generator(None).initial_seed())


def get_rng_state(device: DeviceLike = "npu") -> torch.Tensor:
    """The generator's (seed, offset) as 16 bytes; set_rng_state() puts it back exactly."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "npu") -> None:
    _generator(device).set_state(new_state.to("cpu", torch.uint8).contiguous())


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ---- streams and events ----

class Stream(torch.Stream):
    """A stream of an npu device. All streams of a device run on its one in-order queue."""

    def __new__(cls, device: DeviceLike = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # stream_id, device_index, device_type: an existing stream
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("npu", _index(device)), priority=priority)


class Event(torch.Event):
    """An npu event: recorded in a queue, done when the device reaches it. Its instances are
    plain `torch.Event`s: torch's `elapsed_time` and `Stream.record_event` accept no subclass."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> torch.Event:  # type: ignore[misc]
        return torch.Event(device=torch.device("npu", current_device()),
                           enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device: DeviceLike = None) -> Stream:
    s = _C.current_stream(_index(device))
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device: DeviceLike = None) -> Stream:
    current = current_stream(device)
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    """Make `s` the current stream of its device inside the block."""
    if s is None:
        yield
        return
    with s:
        yield


# ---- memory ----

def memory_allocated(device: DeviceLike = None) -> int:
    return int(_C.memory_stats(_index(device))["allocated"])


def max_memory_allocated(device: DeviceLike = None) -> int:
    return int(_C.memory_stats(_index(device))["peak"])


def memory_reserved(device: DeviceLike = None) -> int:
    return int(_C.memory_stats(_index(device))["reserved"])


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    _C.reset_peak(_index(device))


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    stats = _C.memory_stats(_index(device))
    return int(stats["total"] - stats["allocated"]), int(stats["total"])


def empty_cache() -> None:
    """Nothing cached beyond what the allocator's free blocks hold."""


# ---- mixed precision ----

def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ---- counters (also accuracy.testdevice.counters / counting) ----

def counters() -> dict[str, Any]:
    """Copies, bytes, synchronisations and kernels since the last reset_counters()."""
    return dict(_C.counters())


def reset_counters() -> None:
    _C.reset_counters()
