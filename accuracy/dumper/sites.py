"""Where a call ran: the one placing step of the loop, for eager ops and kernel launches alike.

Every call the loop shows its observers is placed here first, into one `CallSite` (seq, op,
phase, module, source line, step, rank):

- an eager op by the module scope (accuracy/dumper/scope.py): the innermost module and the
  phase (GradScaler's own ops belong to the optimizer step), in backward the autograd node's
  tag (the forward op's module, seq and line), in the optimizer step the parameter the op
  updates; the source line is the user's innermost frame;
- inside compiled code, by the FX node the work comes from (accuracy/dumper/compiled/
  sites.py): an ATen op an `aot_eager` graph runs, an Inductor extern kernel's ATen call, and
  a compiled kernel's launch, named as the eager rows of the same module are.

After a forward op ran, its outputs' autograd nodes get its tag (`ran`), so the backward ops
that differentiate it find where it ran.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

import torch

from accuracy.dumper.calls import Call, KernelCall
from accuracy.dumper.scope import BACKWARD, FORWARD, OPTIMIZER, Scope
from accuracy.dumper.source import is_internal, user_source
from accuracy.records import CallSite

_graph_task_id = torch._C._current_graph_task_id


class CompiledSites(Protocol):
    """How compiled code names its work (accuracy/dumper/compiled/sites.py), as `Sites`
    asks it while a compiled watch runs."""

    aten_graphs: bool  # a region of an ATen backend (aot_eager...) was entered

    def graph_site(self, backward: bool, frame: Any, internal: Any) -> tuple[str, str] | None:
        """(module, source) of the FX node an `aot_eager` graph runs now, or None."""

    def extern_site(self, backward: bool) -> tuple[str, str] | None:
        """(module, source) of the extern kernel call running now, or None."""

    def kernel_site(self, call: KernelCall, backward: bool) -> tuple[str, str]:
        """(module, source) of a kernel launch, naming each output in `call.extra` too."""


class Sites:
    """Places calls (see the module's docstring). `stack`: also keep each eager op's full
    user stack; `with_source`: look the source line up at all (a tool that never shows it
    saves the frame walk)."""

    def __init__(self, *, stack: bool = False, with_source: bool = True, rank: int = 0,
                 step: int = 0) -> None:
        self.stack = stack
        self.with_source = with_source
        self.rank = rank
        self.step = step
        self.scope: Scope | None = None
        self.compiled: CompiledSites | None = None  # set while a compiled watch runs

    # -- lifetime: the module scope is on while the loop is installed ------------------------

    def enter(self) -> None:
        self.scope = Scope().__enter__()

    def exit(self, *exc: Any) -> None:
        scope, self.scope = self.scope, None
        if scope is not None:
            scope.__exit__(*exc)

    # -- what others ask ---------------------------------------------------------------------

    @property
    def module(self) -> str:
        """The innermost active module now ('' outside any, or with no scope on)."""
        return self.scope.module if self.scope is not None else ""

    @property
    def phase(self) -> str:
        """The phase now (forward, backward or optimizer)."""
        return self.scope.phase if self.scope is not None else FORWARD

    def known_name(self, mod: torch.nn.Module) -> str | None:
        """The name of a module the scope has entered (see `Scope.known_name`)."""
        return self.scope.known_name(mod) if self.scope is not None else None

    def optimizer_tensor_name(self, t: torch.Tensor) -> str:
        """The parameter an optimizer op's tensor belongs to ('' when unknown)."""
        return self.scope.optimizer_tensor_name(t) if self.scope is not None else ""

    def optimizer_state(self, t: torch.Tensor) -> tuple[str, str] | None:
        """(parameter name, role) of an optimizer op's tensor (`Scope.optimizer_state`)."""
        return self.scope.optimizer_state(t) if self.scope is not None else None

    def keep_hooks(self) -> None:
        """Compiled code ran under the scope: its global module hooks stay installed."""
        Scope.keep_hooks()

    # -- placing ----------------------------------------------------------------------------

    def place(self, call: Call, seq: int) -> None:
        """Give `call` its site (and, for an eager op, its stack and forward seq)."""
        if type(call) is KernelCall:
            self._place_kernel(call, seq)
        else:
            self._place_op(call, seq)

    def _place_op(self, call: Call, seq: int) -> None:
        scope = self.scope
        scope.tag_pending()
        plan = call.plan
        fwd_seq = -1
        stack = ""
        if _graph_task_id() != -1:  # backward: the node tells everything
            phase = BACKWARD
            origin = scope.backward_origin()
            if origin is not None:
                module, fwd_seq, source = origin
            else:
                module = ""
                source, stack = self._source()
        else:
            phase, module = scope.op_phase(plan), scope.module
            if phase == OPTIMIZER:  # optimizer rows name the parameter they update
                module = scope.optimizer_param(call.args, call.kwargs) or module
            source, stack = self._source()
        compiled = self.compiled
        if compiled is not None:
            if compiled.aten_graphs:
                # an op of an aot_eager/eager compiled graph: its FX node's module and line
                site = compiled.graph_site(phase == BACKWARD, sys._getframe(1), is_internal)
                if site is not None:
                    module, source = site[0], site[1] or source
                    fwd_seq = -1
            site = compiled.extern_site(phase == BACKWARD)  # an Inductor extern kernel's op
            if site is not None:
                module, source = site[0], site[1] or source
        call.site = CallSite(seq, plan.name, phase, module, source, self.step, self.rank)
        call.stack = stack
        call.fwd_seq = fwd_seq

    def _source(self) -> tuple[str, str]:
        if not self.with_source:
            return "", ""
        return user_source(self.stack)

    def _place_kernel(self, call: KernelCall, seq: int) -> None:
        backward = _graph_task_id() != -1
        phase = BACKWARD if backward else self.phase
        module, source = ("", "") if self.compiled is None else \
            self.compiled.kernel_site(call, backward)
        call.site = CallSite(seq, call.plan.name, phase, module, source, self.step, self.rank)

    def ran(self, call: Call, outputs: list[torch.Tensor]) -> None:
        """A forward op ran: its outputs' autograd nodes will carry its module, seq and line
        (tagged at the next op, once autograd attached them)."""
        site = call.site
        if site.phase == FORWARD and type(call) is not KernelCall:
            self.scope.forward_outputs(outputs, (site.module, site.seq, site.source))
