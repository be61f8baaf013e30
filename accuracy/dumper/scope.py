"""Where an op runs: module path (forward and backward) and phase.

Forward: PyTorch's ModuleTracker names modules (`RootClass.encoder.layers.0`, its fully
qualified names) and our hooks around each module's forward keep the stack of active modules
(its own `parents` set has no order). `torch.utils.module_tracker` is the light one: the
distributed ModTracker's package imports DTensor, the FSDP memory tracker and inductor (about
1 s at every dumper start).

Backward: module trackers' gradient hooks cannot tell which module's backward is running when
several are pending, so backward ops are attributed exactly another way: each forward op's
autograd node is tagged with the forward op's module, sequence number and source line, and a
backward op reads the tag of the node the autograd engine is running
(`torch._C._current_autograd_node()`). A parameter's AccumulateGrad node is attributed to the
module owning the parameter.

Optimizer: torch.optim's global step hooks.
"""

from __future__ import annotations

import logging
import re
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.module_tracker import ModuleTracker

from accuracy.dumper.fxnames import GraphNames, root_name

if TYPE_CHECKING:
    from accuracy.aten import OpPlan

log = logging.getLogger(__name__)

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
_ORIG_MOD = re.compile(r"\._orig_mod(?=\.|$)")  # the module a compiled wrapper holds


class _ForwardTracker(ModuleTracker):
    """ModuleTracker's module names, with `enter`/`exit` called around each forward instead of
    its unordered `parents` set and gradient hooks (backward is attributed by node tags).
    The exit hook runs even when the forward raises (`always_call`)."""

    def __init__(self, enter: Any, exit: Any) -> None:
        super().__init__()
        self._enter, self._exit = enter, exit
        self._unwrapped: dict[str, str] = {}  # `X._orig_mod` prefix -> the eager run's name

    def name(self, mod: torch.nn.Module) -> str:
        return self.plain(self._get_mod_name(mod), mod)

    def plain(self, name: str, mod: Any = None) -> str:
        """`name` as the eager run of the same model names it: a `torch.compile`d module
        (`OptimizedModule`) is transparent, so `OptimizedModule._orig_mod.layers.0` is
        `Net.layers.0` (parameters, optimizer rows and eager parts of a compiled run pair
        with the eager run's)."""
        orig = getattr(mod, "_orig_mod", None)
        if isinstance(orig, torch.nn.Module) and type(mod).__name__ == "OptimizedModule" \
                and "." not in name:  # the root: named by the module it wraps
            self._unwrapped.setdefault(f"{name}._orig_mod", type(orig).__name__)
            return type(orig).__name__
        for prefix, plain in self._unwrapped.items():
            if name == prefix or name.startswith(prefix + "."):
                name = plain + name[len(prefix):]
                break
        # inside (regional `torch.compile(block)`): `Net.blocks.1._orig_mod.fc1` -> `…1.fc1`
        return _ORIG_MOD.sub("", name) if "._orig_mod" in name else name

    def _fw_pre_hook(self, mod: torch.nn.Module, input: Any) -> None:
        if torch.compiler.is_compiling():  # dynamo traces global hooks: none in its graph
            return
        self._enter(mod, input)

    def _fw_post_hook(self, mod: torch.nn.Module, input: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._exit(mod, input, output)

    def __enter__(self) -> _ForwardTracker:
        _ACTIVE.append(self)
        _install_hooks()
        self._fw_pre_handle = self._fw_post_handle = _Handle(self)
        return self


# The global module hooks are two module-level functions under fixed keys, installed while a
# tracker is active: dynamo guards compiled regions on the global hook dicts' keys, so hooks
# registered anew per dumper (new handle ids) made every dumper context recompile every
# compiled region it entered (benchmarks/HISTORY.md, "Compiled step, fair compile time").
# Once a dumper entered a compiled region, the hooks stay installed (no-ops with no tracker
# active): removing them failed those guards, so the first bare step after the dumper
# recompiled, and the next dumper reused that hookless program and recorded none of its
# kernels. Eager-only jobs still get the hooks removed (they slow every module call).
_ACTIVE: list[_ForwardTracker] = []
_KEYS: dict[str, int] = {}
_KEEP: list[bool] = [False]


def keep_hooks() -> None:
    """Leave the global hooks installed after the last tracker exits (compiled code was
    guarded on them)."""
    _KEEP[0] = True


def install_kept_hooks() -> None:
    """Install the global hooks now and for good (no-ops while no tracker is active): programs
    compiled from now on are guarded on them, so a later dumper runs those programs as they
    are (accuracy/dumper/compiled/standing.py)."""
    keep_hooks()
    _install_hooks()


def _global_pre(mod: torch.nn.Module, input: Any) -> None:
    if torch.compiler.is_compiling():  # dynamo traces global hooks: none in its graph
        return
    for t in list(_ACTIVE):
        t._enter(mod, input)


def _global_post(mod: torch.nn.Module, input: Any, output: Any) -> None:
    if torch.compiler.is_compiling():
        return
    for t in list(_ACTIVE):
        t._exit(mod, input, output)


def _install_hooks() -> None:
    from torch.nn.modules import module as m

    if not _KEYS:
        _KEYS["pre"] = register_module_forward_pre_hook(_global_pre).id
        _KEYS["post"] = register_module_forward_hook(_global_post, always_call=True).id
        _not_frames_to_compile(_global_pre, _global_post)
        return
    m._global_forward_pre_hooks[_KEYS["pre"]] = _global_pre
    m._global_forward_hooks[_KEYS["post"]] = _global_post
    m._global_forward_hooks_always_called[_KEYS["post"]] = True


def _not_frames_to_compile(*fns: Any) -> None:
    """A compiled module's wrapper (`OptimizedModule`) calls the global hooks from inside
    dynamo's frame callback, which compiled each as a frame of its own (an empty graph, 0.1 s
    of every compile under the dumper). Skipped as frames; still inlined where dynamo traces a
    module call."""
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        for fn in fns:  # neither the hook nor what it calls
            set_code_exec_strategy(fn.__code__,
                                   FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    except Exception:  # noqa: BLE001 - torch moved it: the hooks compile as before
        log.debug("cannot mark the global hooks as no frames to compile", exc_info=True)


def _remove_hooks() -> None:
    from torch.nn.modules import module as m

    if _KEYS:
        m._global_forward_pre_hooks.pop(_KEYS["pre"], None)
        m._global_forward_hooks.pop(_KEYS["post"], None)
        m._global_forward_hooks_always_called.pop(_KEYS["post"], None)


class _Handle:
    """What ModuleTracker.__exit__ removes: this tracker from the active ones (the hooks go
    when none is left)."""

    def __init__(self, tracker: _ForwardTracker) -> None:
        self.tracker = tracker

    def remove(self) -> None:
        if self.tracker in _ACTIVE:
            _ACTIVE.remove(self.tracker)
        if not _ACTIVE and not _KEEP[0]:
            _remove_hooks()


class Scope:
    """Tracks the innermost module and the phase while active (`with Scope(): ...`)."""

    def __init__(self) -> None:
        self._tracker = _ForwardTracker(self._fw_enter, self._fw_exit)
        self._stack: list[str] = []
        self._owned: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._owners: dict[int, str] = {}  # id(parameter) -> owning module's name
        self._param_names: dict[int, str] = {}  # id(parameter) -> its full name
        # id(param, grad or state) -> (parameter name, role: "param", "grad" or the state's key)
        self._opt_names: dict[int, tuple[str, str]] = {}
        self._optimizers: list[Any] = []  # the optimizers whose step() runs now
        self._opt_states: tuple[tuple[int, int], ...] = ()  # _state_shape() at the last scan
        self._in_optimizer = 0
        self._handles: list[Any] = []
        self._untagged: list[torch.Tensor] = []
        self._tag: tuple[str, int, str] = ("", -1, "")
        self._graphs: list[tuple[int, GraphNames]] = []  # FX graphs on the stack (fxnames)

    def __enter__(self) -> Scope:
        self._tracker.__enter__()
        self._handles = [
            register_optimizer_step_pre_hook(self._opt_enter),
            register_optimizer_step_post_hook(self._opt_exit),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        self.tag_pending()
        for h in self._handles:
            h.remove()
        self._handles = []
        self._tracker.__exit__(*exc)

    @staticmethod
    def keep_hooks() -> None:
        """Compiled code ran under this scope: leave the global hooks installed after it."""
        keep_hooks()

    def known_name(self, mod: torch.nn.Module) -> str | None:
        """The name of a module under one this scope has entered (its path as rows name it),
        or None for a module not seen under any: never a new root named by its class."""
        known = getattr(self._tracker, "_known_modules", None)  # torch's ModuleTracker
        try:
            name = known.get(mod) if known is not None else None
        except TypeError:  # not weak-referenceable
            return None
        return self._tracker.plain(name, mod) if name is not None else None

    # -- forward module stack ------------------------------------------------------------

    def _fw_enter(self, mod: torch.nn.Module, _args: Any) -> None:
        if torch._C._current_graph_task_id() != -1:  # modules re-run in backward don't nest
            return
        name = self._tracker.name(mod)
        if isinstance(mod, torch.fx.GraphModule):  # one forward runs a whole graph
            base = self._stack[-1] if self._stack else root_name(mod)
            self._graphs.append((len(self._stack), GraphNames(mod, base)))
            name = base
        self._stack.append(name)
        if mod not in self._owned:
            # Owner of each parameter: the submodule holding it, named under this module
            # (some are used without their module's forward running, e.g. out_proj).
            self._owned.add(mod)
            raw = self._tracker._get_mod_name(mod)  # its parameters' names, unwrapped too
            for pname, p in mod.named_parameters():
                pname = self._tracker.plain(f"{raw}.{pname}")[len(name) + 1:]
                sub, _, _ = pname.rpartition(".")
                self._owners.setdefault(id(p), f"{name}.{sub}" if sub else name)
                self._param_names.setdefault(id(p), f"{name}.{pname}")

    def _fw_exit(self, mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        if torch._C._current_graph_task_id() != -1 or not self._stack:
            return
        name = self._tracker.name(mod)
        if self._graphs and isinstance(mod, torch.fx.GraphModule) \
                and self._graphs[-1][0] == len(self._stack) - 1:
            self._graphs.pop()
            self._stack.pop()
        elif self._stack[-1] == name:
            self._stack.pop()
        elif name in self._stack:  # an exception skipped inner exits
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(name):]

    def _opt_enter(self, opt: Any = None, *_: Any) -> None:
        self._in_optimizer += 1
        self._optimizers.append(opt)
        self._scan_optimizers()

    def _scan_optimizers(self) -> None:
        names: dict[int, tuple[str, str]] = {}
        for opt in self._optimizers:
            state = getattr(opt, "state", {})
            for group in getattr(opt, "param_groups", ()):
                for p in group.get("params", ()):
                    name = self._param_names.get(id(p))
                    if not name:
                        continue
                    names[id(p)] = (name, "param")
                    if p.grad is not None:
                        names[id(p.grad)] = (name, "grad")
                    for k, v in state.get(p, {}).items():
                        if isinstance(v, torch.Tensor):
                            names[id(v)] = (name, str(k))
        self._opt_names = names
        self._opt_states = self._state_shape()

    def _state_shape(self) -> tuple[tuple[int, int], ...]:
        """Per optimizer: how many parameters have state, and how many entries the newest
        has. An optimizer fills its states parameter by parameter, in order (dicts keep
        insertion order), so this changes whenever a state is added, at O(1) a look."""
        shape = []
        for o in self._optimizers:
            state = getattr(o, "state", None)
            if not isinstance(state, dict) or not state:
                shape.append((0, 0))
                continue
            last = next(reversed(state.values()))
            shape.append((len(state), len(last) if isinstance(last, dict) else 0))
        return tuple(shape)

    def _optimizer_entry(self, t: torch.Tensor) -> tuple[str, str] | None:
        entry = self._opt_names.get(id(t))
        # An optimizer makes its states inside its first step(), after the step's pre-hook:
        # learnt when they have grown since the last scan.
        if entry is None and self._in_optimizer and self._state_shape() != self._opt_states:
            self._scan_optimizers()
            entry = self._opt_names.get(id(t))
        return entry

    def optimizer_param(self, args: Any, kwargs: Any) -> str:
        """The name of the parameter an optimizer op works on (its first input that is a
        parameter, its gradient or its optimizer state), '' when none is known."""
        if not self._optimizers:
            return ""
        for t in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                entry = self._optimizer_entry(t)
                if entry:
                    return entry[0]
        return ""

    def optimizer_tensor_name(self, t: torch.Tensor) -> str:
        """The parameter a tensor of an optimizer op belongs to (the parameter, its gradient
        or one of its states), '' when unknown: names each tensor of a fused/foreach call."""
        entry = self._optimizer_entry(t) if self._optimizers else None
        return entry[0] if entry else ""

    def optimizer_state(self, t: torch.Tensor) -> tuple[str, str] | None:
        """(parameter name, role) of an optimizer op's tensor: role "param", "grad" or the
        optimizer state's key ("exp_avg", "momentum_buffer", "step"...); None when unknown."""
        return self._optimizer_entry(t) if self._optimizers else None

    def _opt_exit(self, opt: Any = None, *_: Any) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        if opt in self._optimizers:
            del self._optimizers[len(self._optimizers) - 1 - self._optimizers[::-1].index(opt)]
        if not self._in_optimizer:
            self._optimizers = []
            self._opt_names = {}
        else:
            self._scan_optimizers()

    # -- forward -> backward attribution ------------------------------------------------------

    def forward_outputs(self, outputs: list[torch.Tensor], tag: tuple[str, int, str]) -> None:
        """Remember a forward op's outputs; their autograd nodes get `tag` on the next op.

        The dispatch mode runs below autograd, so `grad_fn` is attached only after it returns.
        """
        self.tag_pending()
        self._untagged = outputs
        self._tag = tag

    def tag_pending(self) -> None:
        for t in self._untagged:
            node = t.grad_fn
            if node is not None and "accuracy" not in node.metadata:
                node.metadata["accuracy"] = self._tag
        self._untagged = []

    def backward_origin(self) -> tuple[str, int, str] | None:
        """(module, forward seq, forward source) of the autograd node now running, if known."""
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        tag = node.metadata.get("accuracy")
        if tag is None and hasattr(node, "variable"):  # AccumulateGrad of a parameter
            owner = self._param_owner(node.variable)
            if owner:
                tag = node.metadata["accuracy"] = (owner, -1, "")
        return tag

    def _param_owner(self, param: torch.Tensor) -> str:
        return self._owners.get(id(param), "")

    # -- what the dumper asks -----------------------------------------------------------------

    @property
    def phase(self) -> str:
        if torch._C._current_graph_task_id() != -1:
            return BACKWARD
        if self._in_optimizer:
            return OPTIMIZER
        return FORWARD

    def op_phase(self, plan: OpPlan) -> str:
        """The phase of one op: `phase`, except that GradScaler's own ops (`aten.AMP_OPS`:
        unscale and the non-finite check before the step, the scale update after it) belong
        to the optimizer step even though they run outside `optimizer.step()`."""
        phase = self.phase
        return OPTIMIZER if phase == FORWARD and plan.amp else phase

    @property
    def module(self) -> str:
        """Fully qualified name of the innermost active module ('' outside any module)."""
        if torch._C._current_graph_task_id() != -1:
            origin = self.backward_origin()
            return origin[0] if origin is not None else ""
        if self._graphs and self._graphs[-1][0] == len(self._stack) - 1:
            return self._graphs[-1][1].module()
        return self._stack[-1] if self._stack else ""
