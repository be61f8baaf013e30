"""Find the user's source line: the first frame outside torch, accuracy and the stdlib."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from types import FrameType

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


def _user_frames(frame: FrameType | None):
    while frame is not None:
        if not is_internal(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back


def user_source(with_stack: bool = False) -> tuple[str, str]:
    """(file:line of the innermost user frame, JSON list of user frames or "")."""
    frames = _user_frames(sys._getframe(1))
    first = next(frames, None)
    if first is None:
        return "", ""
    line = f"{first.f_code.co_filename}:{first.f_lineno}"
    if not with_stack:
        return line, ""
    stack = [line] + [
        f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in frames
    ]
    stack[0] = f"{line} in {first.f_code.co_name}"
    return line, json.dumps(stack)
