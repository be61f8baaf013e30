"""The one loop every observed call goes through: eager ATen ops and compiled kernel launches.

After torch/utils/_debug_mode, where `__torch_dispatch__` and Inductor's
`record_triton_kernel()` append to one call list: here two sources feed one public path,
`Loop.emit(call)`.

- The eager source is the loop's TorchDispatchMode: each ATen op becomes an `OpCall`.
- The compiled source is the Inductor launch hook (accuracy/dumper/compiled/source.py): each
  kernel launch becomes a `KernelCall`, emitted after the launch.

`emit` numbers the call (`seq`), places it (`Sites`: phase, module, source line, step,
rank), asks the filter whether the observers are shown it, and calls each observer's
`before(call)`, runs an eager op (through the loop's runner), then each observer's
`after(call, outputs)`. Observers registered with `every_call=True` (memory and collective
watchers) are shown every call, also the ones the filter leaves out (`call.shown` False).

Two rules keep the user's step alive. Calls made by compile machinery (under a fake or proxy
mode, or on fake tensors) pass straight through, unnumbered. An error an observer raises (a
bug of ours) leaves that call unobserved and is counted (`failed`); only the errors raised
for the user (`accuracy.errors.RaisedForTheUser`) reach the step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from accuracy import hops
from accuracy.aten import plan_of
from accuracy.dumper.calls import Call, Observer, OpCall
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.sites import Sites
from accuracy.errors import RaisedForTheUser

log = logging.getLogger(__name__)

_INFRA_MODES = tuple(getattr(torch._C._TorchDispatchModeKey, k) for k in ("FAKE", "PROXY")
                     if hasattr(torch._C._TorchDispatchModeKey, k))


def compile_machinery(args: tuple[Any, ...]) -> bool:
    """Whether a call is compile machinery's, not the step's: tracing under a fake or proxy
    mode, or on fake tensors (DDP's graph splitter runs the user's layers on fake parameters
    while our mode is still on the stack). Such calls compute nothing real: not observed."""
    if any(torch._C._get_dispatch_mode(k) is not None for k in _INFRA_MODES):
        return True
    return any(isinstance(a, FakeTensor) for a in args)


def current_rank() -> tuple[int, int]:
    """(rank, world size): torch.distributed's when initialised, else RANK / WORLD_SIZE."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def run_here(call: OpCall) -> Any:
    """The default runner: the op as the caller asked for it (on the observers' args)."""
    return call.func(*call.args, **call.kwargs)


class _LoopMode(TorchDispatchMode):
    """Hands every ATen op to its loop (higher-order ops' ATen ops one by one)."""

    supports_higher_order_operators = True  # FlexAttention, torch.cond...: accuracy/hops.py

    def __init__(self, loop: Loop) -> None:
        super().__init__()
        # torch wraps __torch_dispatch__ with _disable_dynamo, which imports torch._dynamo
        # (about 2 s) at the first op: pay it here, when the loop starts, not inside the step.
        import torch._dynamo  # noqa: F401
        self.loop = loop
        # whom the loop serves ("dumper", "live check"...): what others on the dispatch
        # stack read (sim warns when it is entered inside a dumper)
        self.label = loop.label

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if hops.is_hop(func):  # its ATen ops come back here one by one
            return hops.run(self, func, args, kwargs, self.loop.hop_not_seen)
        return self.loop.on_op(func, args, kwargs)


class _CompiledLoopMode(_LoopMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while dynamo/Inductor compile, on while compiled code runs: compiled regions
        run compiled under the loop (accuracy/dumper/compiled/ emits their kernels)."""
        return True


class Loop:
    """One dispatch loop and its observers (see the module's docstring).

    sites: the placing step. label: whom it serves ("dumper", "live check", "substitute"),
    said in its log lines and read from its mode by others on the dispatch stack.
    compiled: compiled regions run compiled under the loop (the dumper, which records their
    kernels, and the live check, which checks them); otherwise dynamo declines them while the
    loop is on and they run their eager code op by op (`substitute`). wants: which calls the
    observers are shown (None: all).
    runner: runs an eager op (`run_here`; `substitute` runs chosen ones elsewhere).
    """

    def __init__(self, sites: Sites, *, label: str = "dumper", compiled: bool = False,
                 wants: Callable[[Call], bool] | None = None,
                 runner: Callable[[OpCall], Any] = run_here) -> None:
        self.sites = sites
        self.label = label
        self.wants = wants
        self.runner = runner
        self.seq = 0  # calls numbered so far (the next call's seq)
        self.failed: dict[str, Any] = {}  # calls an observer failed on: count, first error
        self.hops_not_seen: dict[str, int] = {}  # higher-order ops run with their ops unseen
        self._registered: list[tuple[Observer, bool]] = []
        self._shown: tuple[Observer, ...] = ()  # every observer, in order
        self._every: tuple[Observer, ...] = ()  # those shown every call
        self._mode = (_CompiledLoopMode if compiled else _LoopMode)(self)
        self.installed = False

    # -- observers ---------------------------------------------------------------------------

    def observe(self, observer: Observer, *, every_call: bool = False) -> Observer:
        """Show `observer` the calls from now on (after those registered before it):
        the calls the filter wants, or every call with `every_call`."""
        self._registered.append((observer, every_call))
        self._shown = tuple(o for o, _ in self._registered)
        self._every = tuple(o for o, every in self._registered if every)
        return observer

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers, in the order they are called."""
        return self._shown

    def finish(self) -> dict[str, Any]:
        """Every observer's `finish()`, merged in order: the dump's root attributes."""
        attrs: dict[str, Any] = {}
        for o in self._shown:
            attrs.update(o.finish())
        return attrs

    # -- installing --------------------------------------------------------------------------

    def install(self) -> None:
        """Push the dispatch mode, inside the module scope."""
        if self.installed:
            return
        self.sites.enter()
        try:
            self._mode.__enter__()
        except BaseException:
            self.sites.exit(None, None, None)
            raise
        self.installed = True

    def uninstall(self, *exc: Any) -> None:
        """Pop the dispatch mode and leave the module scope."""
        if not self.installed:
            return
        self.installed = False
        exc = exc or (None, None, None)
        try:
            self._mode.__exit__(*exc)
        finally:
            self.sites.exit(*exc)

    def is_innermost(self) -> bool:
        """Whether the loop's mode is the innermost one (nothing entered inside it)."""
        stack = _get_current_dispatch_mode_stack()
        return bool(stack) and stack[-1] is self._mode

    def is_on(self) -> bool:
        """Whether the loop's mode is on the dispatch stack now (off inside our own calls
        and while compile internals run)."""
        mode = self._mode
        return any(m is mode for m in _get_current_dispatch_mode_stack())

    @property
    def mode(self) -> TorchDispatchMode:
        """The loop's TorchDispatchMode (what `hops.run` pushes back)."""
        return self._mode

    # -- the one way in ----------------------------------------------------------------------

    def on_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The eager source: one ATen op from the loop's dispatch mode."""
        if compile_machinery(args):
            return func(*args, **kwargs)
        return self.emit(OpCall(plan_of(func), tensors_in(kwargs, tensors_in(args)),
                                func=func, args=args, kwargs=kwargs))

    def emit(self, call: Call, outputs: list[torch.Tensor] | None = None) -> Any:
        """Number, place and show one call to the observers: an eager op runs (through the
        runner) between their `before` and `after`; a kernel launch has run, `outputs` are
        the buffers it wrote. Returns the op's result (None for a launch)."""
        seq = self.seq
        self.seq = seq + 1
        self.sites.place(call, seq)
        wants = self.wants
        if wants is None or wants(call):
            observers = self._shown
        else:
            call.shown = False
            observers = self._every
        observed = bool(observers) and self._observe(observers, call, None)
        out = None
        if type(call) is OpCall:
            out = call.result = self.runner(call)
            outputs = tensors_in(out)
        elif outputs is None:
            outputs = []
        if observed:
            self._observe(observers, call, outputs)
        self.sites.ran(call, outputs)
        if type(call) is OpCall:
            call.result = None  # an observer keeping the call keeps its inputs, not its result
        return out

    def _observe(self, observers: tuple[Observer, ...], call: Call,
                 outputs: list[torch.Tensor] | None) -> bool:
        """Every observer's `before` (outputs None) or `after`. An error of ours is logged
        and counted, the call left unobserved, and the step goes on: the user's training
        never dies because of us (only the errors raised for the user pass)."""
        try:
            if outputs is None:
                for o in observers:
                    o.before(call)
            else:
                for o in observers:
                    o.after(call, outputs)
            return True
        except RaisedForTheUser:
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            failed = self.failed
            if not failed:
                log.warning("the %s failed on %s (seq %d), which is left unrecorded; the "
                            "step goes on (further failures are counted)", self.label,
                            call.name, call.seq, exc_info=True)
                failed.update(count=0, first=f"{call.name} seq {call.seq}: "
                              f"{type(e).__name__}: {str(e)[:200]}")
            failed["count"] += 1
            return False

    def hop_not_seen(self, name: str) -> None:
        """A higher-order op ran with no implementation our mode can run inside: its ATen
        ops were not seen (the dumper says so in the dump: dumpfile/compiled.py)."""
        if name not in self.hops_not_seen:
            log.warning("higher-order op %s has no eager implementation the %s can run "
                        "inside: it runs with its ops unseen", name, self.label)
        self.hops_not_seen[name] = self.hops_not_seen.get(name, 0) + 1
