"""Which compiled regions ran inside a dumper or live check, and how: never silently blind.

While a TorchDispatchMode is on the stack, dynamo declines every frame ("non-infra torch
dispatch mode present"), so an `OptimizedModule`, a `torch.compile`d function or a regionally
compiled block runs its *eager* Python code instead of its compiled program: the dump then
holds numerics the job never computes outside the dumper. This module sees each such entry
and how it ended, through the two places every compiled callable goes through in torch 2.x:

- `torch._dynamo.eval_frame._callback_from_stance(callback)`: called by every compiled
  callable's wrapper (`compile_wrapper`, also behind `OptimizedModule.forward`) as it installs
  its dynamo callback; the wrapper's frame holds the wrapped `fn`, the callback names the
  backend. Looked up as a module global at call time, so patching it sees callables compiled
  before the dumper started too.
- `torch._dynamo.convert_frame.CatchErrorsWrapper._handle_skip(result, frame)`: where dynamo
  declines a frame, with its reason.

A region entered and declined for the dispatch mode ran eager (`ran-eager`); one entered and
not declined ran dynamo's compiled code, which the dumper does not see as kernels
(`not-recorded`). If torch's internals moved and the hooks cannot be installed, the watch says
so (`compiled_watch` root attribute) instead of pretending nothing was compiled.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accuracy.dumper.compiled.names import RegionCall, join_module
from accuracy.dumpfile import schema

if TYPE_CHECKING:
    from accuracy.dumper.identity import TensorStates
    from accuracy.dumper.loop import Loop

log = logging.getLogger(__name__)

RAN_EAGER = "ran-eager"
NOT_RECORDED = "not-recorded"
RECORDED = "recorded-compiled"
NOT_CHECKED = "not-checked"  # the live check: kernels of it ran that it could not judge
DISPATCH_SKIP = "dispatch mode"  # dynamo's skip reason for an active TorchDispatchMode
# Backends whose compiled program runs the graph's ops through the dispatcher, one by one:
# the dumper's mode (which ignores compile internals only while compiling) records each op.
ATEN_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition")
NOT_SEEN = ("dynamo ran compiled code the dumper cannot see into (made before the dumper "
            "started, or by a backend it does not know): only the ATen calls it dispatched "
            "reached the dump; compile inside the dumper (torch._dynamo.reset() first) to "
            "record Inductor's kernels")

_lock = threading.Lock()
_watches: list[CompileWatch] = []
_INDUCTOR_CODEGEN = "torch._inductor.codegen.wrapper"  # loaded: hooking Inductor costs nothing
_saved: dict[str, Any] = {}  # what was patched, to restore when the last watch stops
_install_error: str | None = None
_said: set[str] = set()  # reasons the watch could not start, already logged


@dataclass
class Region:
    """One compiled region as entered in the recorded block (aggregated over its calls)."""

    name: str
    kind: str  # "module" or "function"
    backend: str
    options: dict[str, Any]
    status: str = NOT_RECORDED
    reason: str = ""
    calls: int = 0
    steps: set[int] = field(default_factory=set)
    first_seq: int = -1
    # recompilations inside the recorded block: {"step", "seq", "frame", "reason"}
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    compiled_here: bool = False  # dynamo compiled a frame of it while the watch ran
    # a kernel of it ran whose description is not the running kernel's (compiled/verify.py)
    distrusted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "backend": self.backend,
                "options": self.options, "status": self.status, "reason": self.reason,
                "calls": self.calls, "steps": sorted(self.steps), "first_seq": self.first_seq,
                "recompiles": self.recompiles}


def _backend_of(callback: Any) -> tuple[str, dict[str, Any]]:
    """The backend's name and its options (Inductor's mode shows as config patches)."""
    try:
        from torch._dynamo.eval_frame import innermost_backend
        b = innermost_backend(callback)
    except Exception:  # noqa: BLE001 - a callback shape we do not know: say "unknown"
        return "unknown", {}
    name = getattr(b, "compiler_name", None) or getattr(b, "__name__", None) \
        or type(b).__name__
    opts = getattr(b, "config", None)
    options = {str(k): repr(v) for k, v in opts.items()} if isinstance(opts, dict) else {}
    return str(name), options


def _code_of(fn: Any) -> Any:
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(getattr(fn, "__func__", None), "__code__", None)
    return code


def _describe(fn: Any, module_path: str, name_of: Callable[[Any], str | None] | None = None
              ) -> tuple[str, str, str]:
    """A region's name, kind and module path: the module path (as an eager dump names it:
    no `OptimizedModule` root, no `_orig_mod`) and class of a compiled module, else the
    function's qualified name and the module path it was called from. A module compiled in
    place (`block.compile()`) is entered before its own forward hooks run, where the module
    path is still its parent's: its own name comes from `name_of` where the scope knows it."""
    import torch

    inner = inspect.unwrap(fn) if callable(fn) else fn
    target = getattr(inner, "__self__", inner)
    own = name_of(target) if name_of is not None and isinstance(target, torch.nn.Module) \
        else None
    path = (own or module_path).replace("._orig_mod", "")
    if isinstance(target, torch.nn.Module):
        cls = type(target).__name__
        head, _, rest = path.partition(".")
        if head == "OptimizedModule" or not path:
            path = cls + (f".{rest}" if rest else "")
        return f"{path} ({cls})", "module", join_module(path, _traced_inside(target))
    qual = getattr(inner, "__qualname__", None) or repr(inner)
    mod = getattr(inner, "__module__", "") or ""
    return (f"{mod}.{qual}" if mod else qual), "function", path


def _traced_inside(module: Any) -> str:
    """The path of the submodule whose frame dynamo traces when `module` is compiled ('' for
    the module itself): DDP's own forward is skipped by dynamo, which traces the wrapped
    module's (its `nn_module_stack` says `L['self'].ln` for `DistributedDataParallel.module.ln`)."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(module, "_orig_mod", module)
    return "module" if isinstance(inner, DistributedDataParallel) else ""


def _eager_name(name: str, mod: Any) -> str:
    """A scope name as the eager dump spells it: no `_orig_mod`, no `OptimizedModule`
    root (a root compiled module is named by the class it wraps)."""
    name = name.replace("._orig_mod", "")
    head, _, rest = name.partition(".")
    if head == "OptimizedModule":
        inner = getattr(mod, "_orig_mod", mod)
        name = type(inner).__name__ + (f".{rest}" if rest else "")
    return name


def _roots(fn: Any, args: tuple, kwargs: dict,
           name_of: Callable[[Any], str | None] | None
           ) -> tuple[dict[str, str], dict[str, str]]:
    """The modules a compiled function's frame can reach by a variable of its own, by the
    name dynamo gives that variable (`L['model']`, `L['args'][0]`, `G['net']`, a closed-over
    `L['n2']`) -> the eager dump's name of the module: the scope's name where the dumper saw
    it, else its class (the name ModuleTracker gives a module it enters as a root); and the
    same variables -> the module's class."""
    import torch

    out: dict[str, str] = {}
    classes: dict[str, str] = {}

    def add(key: str, obj: Any) -> None:
        if isinstance(obj, torch.nn.Module):
            inner = getattr(obj, "_orig_mod", obj)
            known = name_of(obj) if name_of is not None else None
            out[key] = _eager_name(known, obj) if known else type(inner).__name__
            classes[key] = type(inner).__name__

    inner = inspect.unwrap(fn) if callable(fn) else fn
    code = _code_of(inner)
    if code is None:
        return out, classes
    try:
        bound = inspect.signature(inner).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {}
    for name, value in bound.items():
        add(f"L['{name}']", value)
        if isinstance(value, tuple | list):
            for i, v in enumerate(value[:16]):
                add(f"L['{name}'][{i}]", v)
        elif isinstance(value, dict):
            for k, v in list(value.items())[:16]:
                add(f"L['{name}']['{k}']", v)
    closure = getattr(getattr(inner, "__func__", inner), "__closure__", None) or ()
    for name, cell in zip(code.co_freevars, closure, strict=False):
        try:
            add(f"L['{name}']", cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    glob = getattr(getattr(inner, "__func__", inner), "__globals__", {})
    for name in code.co_names:
        if name in glob:
            add(f"G['{name}']", glob[name])
    return out, classes


class CompileWatch:
    """Regions entered while `active()` is true, with how each ran.

    active: whether the caller's recording is on right now (its dispatch mode on the stack).
    step / seq / module: the owner's step number, next op seq and module path at entry.
    """

    def __init__(self, active: Callable[[], bool], *, step: Callable[[], int] = lambda: 0,
                 seq: Callable[[], int] = lambda: -1,
                 module: Callable[[], str] = lambda: "",
                 name_of: Callable[[Any], str | None] | None = None) -> None:
        self.active, self._step, self._seq, self._module = active, step, seq, module
        self._name_of = name_of  # a module's own path, where the caller's scope knows it
        self.regions: dict[tuple[str, str], Region] = {}
        self._pending: list[tuple[Any, Region]] = []  # (code dynamo will be asked about, region)
        self._last: tuple[Region, str] | None = None  # latest region entered, its module path
        self._current: Region | None = None  # the region the running call entered, if recorded
        self._call: RegionCall | None = None  # names for the rows of the latest call entered
        self.aten_graphs = False  # a region of an ATen backend was entered: ops name nodes
        self.error: str | None = None
        self.running = False

    # -- lifetime ---------------------------------------------------------------------

    def start(self) -> CompileWatch:
        with _lock:
            err = _install()
            if err is not None:
                self.error = err  # each dump says it (compare's BLIND line); the log once
                say = log.warning if err not in _said else log.debug
                _said.add(err)
                say("cannot watch for compiled regions (%s): a torch.compile'd region inside "
                    "a dumped block would go unreported (said once per process)", err)
            else:
                _watches.append(self)
                self.running = True
        return self

    def stop(self) -> None:
        with _lock:
            if self in _watches:
                _watches.remove(self)
            self.running = False
            if not _watches:
                _uninstall()

    def finish(self) -> dict[str, Any]:
        """Stop, and give the root attributes: `compiled_watch` and `compiled_regions`."""
        self.stop()
        return {schema.ROOT_COMPILED_WATCH: "on" if self.error is None
                else f"unavailable: {self.error}",
                schema.ROOT_COMPILED_REGIONS: [r.as_dict() for r in self.regions.values()]}

    # -- events (called from the patched torch functions; never raise) ----------------------

    def _entered(self, fn: Any, callback: Any, args: tuple = (), kwargs: dict | None = None
                 ) -> None:
        self._current = None
        if not self.active():
            return
        name, kind, path = _describe(fn, self._module(), self._name_of)
        backend, options = _backend_of(callback)
        roots, classes = _roots(fn, args, kwargs or {}, self._name_of) \
            if kind == "function" else ({}, {})
        self._call = RegionCall(path, kind, roots, classes)
        if backend in ATEN_BACKENDS:
            self.aten_graphs = True
        region = self.regions.get((name, backend))
        if region is None:
            region = self.regions[(name, backend)] = Region(name, kind, backend, options,
                                                            first_seq=self._seq())
            region.reason = NOT_SEEN
        region.calls += 1
        region.steps.add(self._step())
        self._current = region
        self._last = (region, path)
        if options.get("triton.cudagraphs") == "True":
            region.reason = ("CUDA graphs (mode='reduce-overhead'): kernels are replayed from "
                             "a captured graph, which no hook sees")
        code = _code_of(fn)
        if code is not None:
            self._pending.append((code, region))
            del self._pending[:-64]  # bounded: entries dynamo never asked about age out

    def latest_region(self) -> Region | None:
        """The region entered latest (whose program a kernel launched now belongs to, as
        `recorded()` files it), or None."""
        return self._last[0] if self._last is not None else None

    def region_module(self) -> str:
        """The module path where the latest region was entered ('' if none)."""
        return self._last[1] if self._last is not None else ""

    def region_call(self) -> RegionCall:
        """How to name the rows of the latest region call entered (module paths relative
        to the module the dumper is in, when none was)."""
        return self._call if self._call is not None else RegionCall(self._module())

    def _dynamo_on(self) -> None:
        """Dynamo is about to run a compiled callable (and may compile it): nothing here."""

    def recorded(self) -> None:
        """A compiled source wrote a kernel of the latest region."""
        if self._last is not None and self._last[0].status != RECORDED \
                and not self._last[0].distrusted:
            region = self._last[0]
            region.status = RECORDED
            region.reason = "its kernels' materialised buffers were recorded as they ran"

    def distrusted(self, kernel: str, why: str) -> None:
        """A kernel of the latest region ran whose recorded description is not of the kernel
        that ran: the region is not recorded (its other kernels' rows stay, said as partial)."""
        if self._last is None or self._last[0].distrusted:
            return
        region = self._last[0]
        region.distrusted = True
        region.status = NOT_RECORDED
        region.reason = (f"kernel {kernel} ran, but the description its hook line registered "
                         f"is not of the kernel that ran: {why}; none of its launches is in "
                         "the dump (the region's other kernels may be): compile inside the "
                         "dumper (torch._dynamo.reset() first) to record this program")

    def _recompiled(self, code: Any, reasons: list[str]) -> None:
        """Dynamo compiles `code` again because a guard failed: filed under the region whose
        call is running (entered while recorded; dynamo compiles with the dispatch modes off,
        so `active()` cannot tell), with dynamo's guard-failure reason."""
        region = self._current
        if region is None:
            return
        where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        region.recompiles.append({
            "step": self._step(), "seq": self._seq(), "frame": where,
            "reason": "; ".join(str(r) for r in reasons) or "dynamo gave no reason"})
        del region.recompiles[:-16]  # bounded: a recompiling loop keeps its latest

    def _decided(self, code: Any, reason: str | None) -> None:
        """Dynamo decided about a frame: declined it (`reason`) or ran it compiled (None).

        A region whose own frame is in dynamo's skip files (a compiled module's
        `_wrapped_call_impl`) is decided by the next frame dynamo is asked about that is not
        (its `forward`)."""
        skipfile = reason is not None and "skipfiles" in reason
        for i in range(len(self._pending) - 1, -1, -1):
            c, region = self._pending[i]
            if c is code or c is None:
                if skipfile:
                    self._pending[i] = (None, region)  # decided by the next frame inside
                    return
                del self._pending[i]
                if reason is None:  # compiled
                    region.compiled_here = True
                    if region.backend in ATEN_BACKENDS and region.status != RECORDED:
                        region.status = RECORDED
                        region.reason = ("its backend runs the graph's ATen ops through the "
                                         "dispatcher: recorded op by op, under the region's "
                                         "module path")
                    return
                region.status = RAN_EAGER
                if DISPATCH_SKIP in reason:
                    region.reason = ("dynamo does not run while a TorchDispatchMode is active: "
                                     "the region ran its eager code, so the recorded ops are "
                                     "not the compiled kernels the job runs without the dumper")
                else:
                    region.reason = f"dynamo skipped it: {reason}"
                return


def _notify_enter(fn: Any, callback: Any, args: tuple, kwargs: dict) -> None:
    for w in list(_watches):
        try:
            w._entered(fn, callback, args, kwargs)
        except Exception:  # noqa: BLE001 - the user's step must never die because of us
            log.exception("compiled-region watch failed at a region entry")


def _install() -> str | None:
    """Patch the two dynamo functions once (refcounted by `_watches`); a reason if we cannot."""
    global _install_error
    if _saved:
        return None
    try:
        from torch._dynamo import convert_frame, eval_frame
        orig_stance = eval_frame._callback_from_stance
        orig_skip = convert_frame.CatchErrorsWrapper._handle_skip
    except Exception as e:  # noqa: BLE001 - torch moved its internals
        _install_error = f"torch._dynamo internals not found ({type(e).__name__}: {e})"
        return _install_error

    def callback_from_stance(callback: Any) -> Any:
        if callback not in (None, False) and _watches:
            try:
                for w in list(_watches):
                    w._dynamo_on()
                caller = sys._getframe(1)
                local = caller.f_locals if caller.f_code.co_name == "compile_wrapper" else {}
                fn = local.get("fn")
                if fn is not None:
                    args, kwargs = local.get("args"), local.get("kwargs")
                    _notify_enter(fn, callback, args if isinstance(args, tuple) else (),
                                  kwargs if isinstance(kwargs, dict) else {})
            except Exception:  # noqa: BLE001
                log.exception("compiled-region watch failed")
        return orig_stance(callback)

    def handle_skip(self: Any, result: Any, frame: Any) -> Any:
        if _watches:
            try:
                reason = getattr(result, "skip_reason", None)
                if getattr(result, "guarded_code", None) is not None:
                    reason = None
                elif reason is not None and DISPATCH_SKIP in str(reason):
                    # dynamo marks a code it declined as skipped for good: one call under the
                    # dumper would leave the region eager for the rest of the job
                    result.apply_to_code = False
                for w in list(_watches):
                    w._decided(frame.f_code, None if reason is None else str(reason))
            except Exception:  # noqa: BLE001
                log.exception("compiled-region watch failed")
        return orig_skip(self, result, frame)

    orig_reasons = getattr(convert_frame, "get_and_maybe_log_recompilation_reasons", None)

    def recompilation_reasons(cache_entries: Any, frame: Any, *args: Any,
                              **kwargs: Any) -> Any:
        reasons = orig_reasons(cache_entries, frame, *args, **kwargs)
        if _watches:
            try:
                for w in list(_watches):
                    w._recompiled(frame.f_code, list(reasons or []))
            except Exception:  # noqa: BLE001
                log.exception("compiled-region watch failed at a recompilation")
        return reasons

    _saved.update(stance=(eval_frame, orig_stance),
                  skip=(convert_frame.CatchErrorsWrapper, orig_skip))
    eval_frame._callback_from_stance = callback_from_stance
    convert_frame.CatchErrorsWrapper._handle_skip = handle_skip
    if orig_reasons is not None:  # where dynamo finds why it compiles a frame again
        _saved["reasons"] = (convert_frame, orig_reasons)
        convert_frame.get_and_maybe_log_recompilation_reasons = recompilation_reasons
    else:
        log.warning("torch._dynamo.convert_frame has no get_and_maybe_log_recompilation_"
                    "reasons: recompilations inside a dumped block are not recorded")
    _install_error = None
    return None


def _uninstall() -> None:
    if not _saved:
        return
    mod, f = _saved.pop("stance")
    mod._callback_from_stance = f
    cls, g = _saved.pop("skip")
    cls._handle_skip = g
    if "reasons" in _saved:
        cf, h = _saved.pop("reasons")
        cf.get_and_maybe_log_recompilation_reasons = h


class DumperWatch(CompileWatch):
    """A dumper's watch: it also hooks Inductor, and its compiled source emits each kernel
    launch into the dumper's loop, whose placing step names compiled work through it."""

    def __init__(self, loop: Loop, states: TensorStates,
                 recording: Callable[[], bool]) -> None:
        sites = loop.sites
        super().__init__(recording, step=lambda: sites.step, seq=lambda: loop.seq,
                         module=lambda: sites.module, name_of=sites.known_name)
        from accuracy.dumper.compiled import codegen, launches
        from accuracy.dumper.compiled.sites import CompiledSites
        from accuracy.dumper.compiled.source import CompiledSource

        self._sites = sites
        self._label = loop.label
        self._codegen = codegen
        self._launches = launches
        self.source = CompiledSource(loop, states, recording, self.recorded,
                                     lambda info, why: self.distrusted(info.kernel, why))
        sites.compiled = CompiledSites(self, sites)

    def _entered(self, fn: Any, callback: Any, args: tuple = (), kwargs: dict | None = None
                 ) -> None:
        super()._entered(fn, callback, args, kwargs)
        if self._current is not None:  # compiled code guards on the scope's global hooks
            self._sites.keep_hooks()

    def start(self) -> DumperWatch:
        """Watch; hook Inductor now if it is loaded, else when dynamo first turns on inside
        the block (importing Inductor costs 1.2-1.5 s: a dumper over eager code paid it at
        every start, and so did every forked or fresh process that opened one)."""
        super().start()
        self._unhooked_from = self._launches.unhooked_serial()
        self._hooked = False
        if self.error is not None or _INDUCTOR_CODEGEN in sys.modules:
            self._hook_inductor()  # not watched: no later moment to hook it at
        return self

    def _dynamo_on(self) -> None:
        if not self._hooked:
            self._hook_inductor()

    def _hook_inductor(self) -> None:
        self._hooked = True
        try:
            self._codegen.install()
            self._launches.SINKS.append(self.source)
        except Exception:  # noqa: BLE001 - recording compiled kernels is extra, never fatal
            log.exception("cannot hook Inductor's code generation")

    def finish(self) -> dict[str, Any]:
        if self.source in self._launches.SINKS:
            self._launches.SINKS.remove(self.source)
            self._codegen.uninstall()
        self._sites.compiled = None
        unhooked = self._launches.unhooked_since(getattr(self, "_unhooked_from", 0))
        for r in self.regions.values():
            if r.status != NOT_RECORDED or not r.compiled_here or r.reason != NOT_SEEN:
                continue
            who = self._label  # "dumper", "live check"
            if r.backend == "inductor":
                r.reason = (f"compiled inside the {who}, yet none of its kernels was recorded"
                            + (f" ({len(unhooked)} kernel launch site(s) got no recording "
                               "hook: see compiled_kernels_not_recorded)" if unhooked else ""))
            else:
                r.reason = (f"compiled inside the {who} by backend {r.backend}, whose program "
                            f"the {who} cannot see into: only the ATen calls it dispatched "
                            f"reached {'the dump' if who == 'dumper' else 'the ' + who}")
        attrs = super().finish()
        attrs[schema.ROOT_COMPILED_KERNELS_RECORDED] = self.source.kernels
        if self.source.kernels:  # whose generator its kernels drew random numbers with
            attrs[schema.ROOT_COMPILED_RANDOM] = self._codegen.random_mode()
        if unhooked:
            attrs[schema.ROOT_COMPILED_KERNELS_NOT_RECORDED] = {
                "count": len(unhooked), "kernels": [k for k, _ in unhooked][:16],
                "why": unhooked[0][1]}
        return attrs


def watch_dumper(loop: Loop, states: TensorStates,
                 recording: Callable[[], bool]) -> DumperWatch:
    """The watch for a dumper's loop, started: `states` are its recorder's tensor states,
    `recording()` whether kernels launched now are recorded."""
    return DumperWatch(loop, states, recording).start()
