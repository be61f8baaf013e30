"""Find the user's source line: the first frame outside torch, accuracy and the stdlib."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from types import CodeType, FrameType

import torch

import accuracy

_ACCURACY = os.path.dirname(accuracy.__file__)
# The tool's own machinery is skipped; its built-in example models count as user code, so
# the demo's reports point at the model's lines like a user's would.
_INTERNAL_PREFIXES = (
    os.path.dirname(torch.__file__) + os.sep,
    *(os.path.join(_ACCURACY, part) + os.sep for part in (
        "dumper", "dumpfile", "device_backend", "overflow", "replay", "compare", "server",
        "live")),
    os.path.join(_ACCURACY, "cli.py"),
    os.path.join(_ACCURACY, "__init__.py"),
    sysconfig.get_paths()["stdlib"] + os.sep,
    "<",
)
# torch itself installed elsewhere (another venv): its package folder exactly, so torchvision,
# torchaudio and other torch* packages count as user code (their layers are what a user calls).
_TORCH_SITE = os.sep + "site-packages" + os.sep + "torch" + os.sep
_cache: dict[str, bool] = {}


def is_internal(filename: str) -> bool:
    """Whether a frame of `filename` is torch's, ours (but the example models), the
    standard library's or generated code: never the user's line."""
    hit = _cache.get(filename)
    if hit is None:
        hit = _cache[filename] = filename.startswith(_INTERNAL_PREFIXES) or (
            _TORCH_SITE in filename)
    return hit


# code object -> whether its frames are internal: one dict lookup per frame of the walk below.
# Bounded: code made at run time (FX graph modules, exec) would otherwise be kept forever.
_internal_code: dict[CodeType, bool] = {}
_MAX_CODES = 4096


def _first_user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame at or above `frame` that is the user's. Per op this walks 10 to
    30 frames (ours, torch's module calls and dispatch), so it is one plain loop with one
    dict lookup a frame: the generator and call a frame it replaced cost ~24 µs an op."""
    internal = _internal_code
    while frame is not None:
        code = frame.f_code
        hit = internal.get(code)
        if hit is None:
            if len(internal) >= _MAX_CODES:
                internal.clear()
            hit = internal[code] = is_internal(code.co_filename)
        if not hit:
            return frame
        frame = frame.f_back
    return None


def _user_frames(frame: FrameType | None):
    while (frame := _first_user_frame(frame)) is not None:
        yield frame
        frame = frame.f_back


def user_source(with_stack: bool = False) -> tuple[str, str]:
    """(file:line of the innermost user frame, JSON list of user frames or "")."""
    first = _first_user_frame(sys._getframe(1))
    if first is None:
        return "", ""
    line = f"{first.f_code.co_filename}:{first.f_lineno}"
    if not with_stack:
        return line, ""
    stack = [line] + [
        f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
        for f in _user_frames(first.f_back)
    ]
    stack[0] = f"{line} in {first.f_code.co_name}"
    return line, json.dumps(stack)
