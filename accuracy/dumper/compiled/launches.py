"""The run-time side of the kernel hooks: the lines generated code calls around each launch.

A hooked program (accuracy/dumper/compiled/codegen.py) registers each launch site's
description when its module is loaded (`register_kernel`, `register_extern`: just generated,
or handed back by Inductor's caches), calls `before_launch(kid, [buffers])` before a kernel
overwrites buffers in place, `after_launch(kid, [buffers])` after each launch, and
`extern_call(eid)` / `extern_call(0)` around an extern kernel's ATen call. Each event goes to
the recording sources listening (`SINKS`: accuracy/dumper/compiled/source.py), never raising
into the user's step. These names are what generated code imports: a program cached by
another version of them is never served (its cache key carries a digest of this folder).
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from typing import Any

from accuracy.dumper.compiled import verify
from accuracy.dumper.compiled.kernels import KernelInfo, Origin, compile_id, kernel_from_text
from accuracy.errors import RaisedForTheUser

log = logging.getLogger(__name__)

_ids = itertools.count(1)
KERNELS: dict[int, KernelInfo] = {}  # kernel id (registered at load) -> what it is
SINKS: list[Any] = []  # recording sources: `.before(info, tensors)`, `.kernel(info, tensors)`
# extern kernel call site id -> (graph, the FX node it computes, compile id)
EXTERNS: dict[int, tuple[str, Origin, str]] = {}
_running_extern: list[int] = [0]  # the extern call site running now (0: none)
# kernel launch sites generated with no recording hook: (serial, kernel name, why); a dumper
# says those compiled while it ran (never silently blind)
UNHOOKED: list[tuple[int, str, str]] = []
_unhooked_ids = itertools.count(1)
# kernel id -> (the digest checked, why its launches are not the described kernel's or None)
_CHECKED: dict[int, tuple[str, str | None]] = {}


def _notify(event: str, kid: int, tensors: list[Any]) -> None:
    """Hand kernel `kid`'s live buffers to each sink's `event` method; never raises into
    the user's step."""
    if not SINKS:
        return
    info = KERNELS.get(kid)
    if info is None:
        return
    for s in list(SINKS):
        try:
            getattr(s, event)(info, tensors)
        except RaisedForTheUser:  # overflow_raise=True, strict=True: what the user asked for
            raise
        except Exception:  # noqa: BLE001 - the user's step must never die because of us
            log.exception("%s of kernel %s failed", event, info.kernel)


def extern_call(eid: int) -> None:
    """Called by generated code around an extern kernel call (`aten.mm.out`...): the ATen
    ops the dumper sees until `extern_call(0)` are that call's."""
    _running_extern[0] = eid


def current_extern() -> tuple[str, Origin, str] | None:
    """(graph, origin node, compile id) of the extern kernel call running now, or None."""
    eid = _running_extern[0]
    return EXTERNS.get(eid) if eid else None


def before_launch(kid: int, tensors: list[Any]) -> None:
    """Called by generated code before kernel `kid` overwrites buffers in place."""
    _notify("before", kid, tensors)


def after_launch(kid: int, tensors: list[Any]) -> None:
    """Called by generated code after kernel `kid` ran: returns at once while nothing
    records (a program compiled with the standing hooks, on an unrecorded step). The first
    recorded launch of a site checks its description against the module running it."""
    if not SINKS:
        return
    info = KERNELS.get(kid)
    if info is not None:
        done = _CHECKED.get(kid)
        if done is None or done[0] != info.src:
            try:
                why = verify.mismatch(info.kernel, info.src, sys._getframe(1).f_globals)
            except Exception as e:  # noqa: BLE001 - unchecked is untrusted, never fatal
                why = f"checking its source failed ({type(e).__name__})"
            _CHECKED[kid] = (info.src, why)
    _notify("kernel", kid, tensors)


def source_mismatch(kid: int) -> str | None:
    """Why kernel `kid`'s launches are not the described kernel's (None: they are)."""
    done = _CHECKED.get(kid)
    return done[1] if done is not None else "its source was not checked"


def unhooked(kernel: str, why: str) -> None:
    """A launch site got no recording hook (said by the dumpers running)."""
    UNHOOKED.append((next(_unhooked_ids), kernel, why))
    del UNHOOKED[:-256]  # bounded: a dumper reads those compiled while it ran


def unhooked_since(serial: int) -> list[tuple[str, str]]:
    """(kernel, why) of the launch sites generated without a hook after `serial`."""
    return [(k, w) for n, k, w in UNHOOKED if n > serial]


def unhooked_serial() -> int:
    """The serial of the latest unhooked launch site (0 if none)."""
    return UNHOOKED[-1][0] if UNHOOKED else 0


def register_kernel(text: str) -> int:
    """Called at the top of a generated module as it is loaded (just generated, or handed
    back by Inductor's caches): file one launch site's description under a fresh id, which
    its hook lines pass. The compile running now is the site's (a cached program's own
    compile ran in another process). Never raises: a description that cannot be read makes
    the site an unhooked one, said as such."""
    try:
        info = kernel_from_text(text)
    except Exception as e:  # noqa: BLE001 - the user's compile must go on
        unhooked("?", f"its recorded description could not be read ({type(e).__name__})")
        return 0
    info.kid = next(_ids)
    info.compile_id = compile_id() or info.compile_id
    KERNELS[info.kid] = info
    return info.kid


def register_extern(text: str) -> int:
    """`register_kernel` for an extern kernel call site (its FX node)."""
    try:
        graph, origin, cid = json.loads(text)
        site = (graph, Origin(**origin), compile_id() or cid)
    except Exception:  # noqa: BLE001 - the call runs unmarked: its ATen rows stand
        log.debug("cannot read an extern call site's description", exc_info=True)
        return 0
    eid = next(_ids)
    EXTERNS[eid] = site
    return eid


def running_extern() -> bool:
    """Whether an extern kernel's ATen call is running now (cheap: asked for every op)."""
    return bool(_running_extern[0])


def clear_extern() -> None:
    """No extern call runs (the hooks are taken off)."""
    _running_extern[0] = 0
