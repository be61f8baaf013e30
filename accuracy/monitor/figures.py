"""Per-step figures of a model: module outputs, parameters, gradients, optimizer state.

Cheap by construction: no dispatch mode. Module forward hooks reduce each output as it is made
(norm, min, max; NaN/Inf counts only where the norm is not finite), parameter figures are
batched with `torch._foreach_*` at the step's end, and every figure of a step stays on the
device until `collect()` reads them back once. All reductions run with Python dispatch disabled,
so a dumper or `sim` above never sees (or counts, or rounds) the monitor's own work.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from accuracy.dumper.collectives import local_tensor
from accuracy.dumpfile.stats import freed
from accuracy.monitor.reductions import (
    NAN,
    Columns,
    Value,
    _columns,
    _combine,
    _native_ok,
    _norm_values,
    _read_back,
    _Reductions,
)
from accuracy.patterns import module_matches

log = logging.getLogger(__name__)

MODULE_FIGURES = ("act_norm", "act_min", "act_max", "act_nan", "act_inf")
PARAM_FIGURES = ("norm", "grad_norm", "grad_min", "grad_max", "grad_nan", "grad_inf",
                 "update_ratio", "state_norm")


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's own tensor of `t`: a DTensor's local shard (FSDP2, tensor parallel), `t`
    itself when plain. A wrapper subclass has no bytes to read with dispatch off (reading
    one crashes the process), so figures of sharded tensors are this rank's shard's. An
    unknown wrapper gives an empty tensor: no figures for it. Unwrap before `detach()`:
    detached with dispatch off, a DTensor becomes a plain tensor without bytes."""
    if type(t) is torch.Tensor or type(t) is nn.Parameter:  # a Parameter of a subclass
        return t                                 # has the subclass's type, not Parameter
    lt = local_tensor(t)
    return lt if lt is not None else torch.empty(0)


def _float_leaves(value: Any) -> list[torch.Tensor]:
    """The non-empty floating-point tensors of an output, each as `_local` gives it."""
    out: list[torch.Tensor] = []
    _leaves_into(value, out)
    return out


def _leaves_into(value: Any, out: list[torch.Tensor]) -> None:
    """Tuples, lists and dicts (a `transformers` ModelOutput is one) walked here: a pytree
    walk of a ModelOutput costs tens of microseconds, a module's whole figure budget. Other
    containers (dataclasses, registered pytree nodes) take `tree_leaves`."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:  # its components are plain tensors: the module's figures theirs
            for part in value.unbind():
                _leaves_into(part, out)
        elif value.is_floating_point() and (lt := _local(value)).numel() > 0:
            out.append(lt)
    elif isinstance(value, tuple | list):
        for v in value:
            _leaves_into(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _leaves_into(v, out)
    elif value is not None and not isinstance(value, int | float | str | bytes):
        out.extend(lt for t in tree_leaves(value)
                   if isinstance(t, torch.Tensor) and t.is_floating_point()
                   and (lt := _local(t)).numel() > 0)


class _NoDispatch:
    """Python dispatch off and autograd off: the monitor's reductions are invisible."""

    def __enter__(self) -> None:
        self._a = torch._C._DisableTorchDispatch()
        self._b = torch.no_grad()
        self._a.__enter__()
        self._b.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._b.__exit__(*exc)
        self._a.__exit__(*exc)


_UNGUARDED = contextlib.nullcontext()


def _guards() -> contextlib.AbstractContextManager[Any]:
    """`_NoDispatch` where a Python dispatch mode is active (a dumper, `sim`); with none, no
    context at all: nothing reaches a mode, and every reduction reads a detached tensor (or
    its memory), so none records a graph (a context costs the step's end microseconds)."""
    return _NoDispatch() if _len_dispatch_stack() else _UNGUARDED


def _len_dispatch_stack() -> int:
    """How many Python dispatch modes are active (a dumper, `sim`): with none, reductions of
    detached plain tensors reach no mode and record no graph, so the guards are skipped."""
    return torch._C._len_torch_dispatch_stack()


# A module's output of at most _HOLD_BYTES is held (a reference, no copy) for a pass over
# many in one native call, where a call per output cost more than its pass; the held outputs
# are passed over once they pass _HELD_BYTES together (while they are still in cache), and
# at the step's end. Larger outputs take their pass at once: the call is then a small part
# of it. So the monitor never holds more than about _HELD_BYTES + _HOLD_BYTES of the step's
# outputs alive.
_HOLD_BYTES = 256 << 10
_LATER = -2  # a held output's entry: made at the pass (-1: a probe, reduced already)
_HELD_BYTES = 1 << 20


def _holdable(ts: list[torch.Tensor]) -> bool:
    return all(_native_ok(t) and t.numel() * t.element_size() <= _HOLD_BYTES for t in ts)


class Collector:
    """Hooks on `model` (and `optimizer`) that gather one step's figures while `recording`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 modules: str | Iterable[str] = "*") -> None:
        pats = [modules] if isinstance(modules, str) else list(modules)
        # a wrapped optimizer (accelerate's AcceleratedOptimizer...): hook the real one
        while optimizer is not None and isinstance(getattr(optimizer, "optimizer", None),
                                                   torch.optim.Optimizer):
            optimizer = optimizer.optimizer
        self.model, self.optimizer = model, optimizer
        self.module_names: list[str] = []
        self._handles: list[Any] = []
        for name, mod in model.named_modules():
            label = name or "(root)"
            if name and not any(module_matches(p, name) for p in pats):
                continue
            if not name and "*" not in pats:
                continue
            idx = len(self.module_names)
            self.module_names.append(label)
            self._handles.append(mod.register_forward_hook(self._forward_hook(idx)))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.state_keys: list[str] = []
        self.recording = False
        self.detail = True  # this step's parameter, update and optimizer-state figures
        self.compiled_modules: set[int] = set()  # hooks seen inside torch.compile regions
        self._act = _Reductions()               # this step's activation reductions
        self._acts: dict[int, list[int]] = {}   # module -> its entries in self._act
        self._seen: dict[tuple[int, int], tuple[Any, int]] = {}  # a tensor reduced: (ref, entry)
        # outputs held for a batched pass: (output, its version then, module, entry;
        # -1: reduced already, held to prove the module's outputs stay unchanged)
        self._held: list[tuple[torch.Tensor, int, int, int]] = []
        self._held_bytes = 0
        self._deferred = [False] * len(self.module_names)  # proven: reduced in batches
        self._in_place: set[int] = set()   # outputs changed in place later: reduced at once
        self.unmeasured: set[int] = set()  # this step's figure lost that way (NaN), said once
        self._before: list[torch.Tensor] | None = None
        self._kept: list[int] = []  # the parameters _before holds (a freed one is not read)
        self._buffers: list[torch.Tensor] | None = None
        self._grads: tuple[list[int], _Reductions] | None = None
        self._update: list[torch.Tensor] | None = None
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(optimizer.register_step_post_hook(self._post_step))

    # -- hooks ---------------------------------------------------------------------------

    def _forward_hook(self, idx: int) -> Any:
        measure = self._measure

        def hook(_mod: nn.Module, _args: Any, output: Any) -> None:
            # inside torch.compile (dynamo tracing this hook): said once, not measured; so
            # `_measure` only ever runs eagerly. Asked before `recording`, which dynamo would
            # otherwise guard the compiled program on: it recompiled whenever recording
            # flipped (every step with freq > 1, and the capture's re-run, whose dump then
            # held a program compiled for the capture, not the one the job runs)
            if torch.compiler.is_compiling():
                self.compiled_modules.add(idx)
                return
            if not self.recording:
                return
            # a batched module's tensor: kept as it is (its values are read at the pass),
            # nothing else here; a hook's every Python call costs about a microsecond
            if (self._deferred[idx] and type(output) is torch.Tensor and not output.is_nested
                    and (nb := output.nbytes) <= _HOLD_BYTES and not _len_dispatch_stack()):
                self._held.append((output, output._version, idx, _LATER))
                self._held_bytes += nb
                if self._held_bytes > _HELD_BYTES:
                    self._flush_or_log()
                return
            measure(idx, output)
        return hook

    def _measure(self, idx: int, output: Any) -> None:
        try:
            if type(output) is torch.Tensor and not output.is_nested:
                # the common case: no unwrapping, no tree walk
                ts = [output] if output.is_floating_point() and output.numel() > 0 else []
            elif isinstance(output, torch.Tensor) and not output.is_nested:
                out = _local(output)
                ts = [out] if out.is_floating_point() and out.numel() > 0 else []
            else:
                ts = _float_leaves(output)
            if not ts:
                return
            # a container returning its child's output (the whole of it, or one tensor of
            # its tuple) gets the child's entry of each such tensor: the same tensor object,
            # unchanged since. Identity is checked through weak references (an address or an
            # id is reused once its tensor is freed, and the next output put there would take
            # the freed one's figure); nothing here keeps a tensor alive
            seen = self._seen
            mine = self._acts.setdefault(idx, [])
            new = []
            for t in ts:
                hit = seen.get((id(t), t._version))
                if hit is not None and hit[0]() is t:
                    mine.append(hit[1])
                else:
                    new.append(t)
            if not new:
                return
            if _len_dispatch_stack() == 0:  # no mode to hide from: reductions record nothing
                if self._deferred[idx] and _holdable(new):
                    entries = self._hold(idx, new)
                else:
                    entries = self._act.add(new)
                    if idx not in self._in_place and _holdable(new):
                        self._hold(idx, new, probe=True)
            else:
                with _NoDispatch():
                    entries = self._act.add(new)
            for t, e in zip(new, entries, strict=True):
                seen[(id(t), t._version)] = (weakref.ref(t), e)
            mine.extend(entries)
        except Exception:  # never break the user's forward
            log.exception("monitor: activation figures of %s failed",
                          self.module_names[idx])

    def _hold(self, idx: int, ds: list[torch.Tensor], probe: bool = False) -> range:
        """Keep module `idx`'s small outputs `ds` (the tensors it returned: the pass knows a
        tensor held twice by its identity) for one batched pass (`_flush`), or, with
        `probe`, to see whether they stay unchanged until it (they were reduced already).
        A module's outputs are batched only once a probe saw them unchanged at the pass."""
        entries = range(0) if probe else self._act.reserve(len(ds))
        for k, t in enumerate(ds):
            self._held.append((t, t._version, idx, -1 if probe else entries[k]))
            self._held_bytes += t.numel() * t.element_size()
        if self._held_bytes > _HELD_BYTES:
            self._flush()
        return entries

    def _flush(self) -> None:
        """The batched pass over the held outputs (one native call), after a check that each
        is as its module returned it: one changed in place since (an in-place activation
        after it, `x += y`) lost its values; its figure stays NaN this step, and its module
        is reduced at once from now on."""
        held, self._held, self._held_bytes = self._held, [], 0
        ts: list[torch.Tensor] = []
        entries: list[int] = []
        # a tensor held twice (a container returning its child's output) is passed over
        # once: (id, version) -> its entry, sound here because every tensor held is alive
        made: dict[tuple[int, int], int] = {}
        same: list[tuple[int, int]] = []  # (entry, the entry of the same tensor) to copy
        acts = self._acts
        red = self._act
        first_new = nxt = red.n  # the hook's tensors' entries, reserved together below
        try:
            for t, version, idx, e in held:
                if t._version != version:
                    self._deferred[idx] = False
                    self._in_place.add(idx)
                    if e == _LATER:  # the call's figure is lost: NaN, never the rest's alone
                        e, nxt = nxt, nxt + 1
                        acts.setdefault(idx, []).append(e)
                    if e >= 0:
                        self.unmeasured.add(idx)
                    continue
                if e == -1:  # a probe, reduced already: its module's outputs stay unchanged
                    if idx not in self._in_place:
                        self._deferred[idx] = True
                    continue
                if e == _LATER:  # a tensor kept by the hook: its entry made here
                    if not t.is_floating_point() or t.numel() == 0:
                        continue
                    e, nxt = nxt, nxt + 1
                    acts.setdefault(idx, []).append(e)
                tensor = (id(t), version)  # every tensor held is alive: its id is its own
                first = made.setdefault(tensor, e)
                if first == e:
                    ts.append(t)
                    entries.append(e)
                else:  # held before: its figures are that entry's
                    same.append((e, first))
        finally:  # every entry a module was given exists (NaN until filled)
            red.reserve(nxt - first_new)
        if ts:
            self._act.fill(entries, ts)
        if same:
            self._act.copy(same)

    def _flush_or_log(self) -> None:
        try:
            self._flush()
        except Exception:  # never break the user's forward
            log.exception("monitor: activation figures failed")

    def _pre_step(self, _opt: Any, args: Any, kwargs: Any) -> Any:
        if not self.recording:
            return None
        closure = kwargs.get("closure") if kwargs else None
        if closure is None and args:
            closure = args[0]
        try:
            if callable(closure):
                # forward and backward run inside step(closure) (Lightning, LBFGS): the
                # gradients exist only once the closure has run; read them then
                if self.detail:
                    self._keep_parameters()
                wrapped = self._after(closure)
                if kwargs and "closure" in kwargs:
                    return tuple(args), {**kwargs, "closure": wrapped}
                return (wrapped, *args[1:]), dict(kwargs or {})
            with _guards():
                self._grad_figures()
            if self.detail:
                self._keep_parameters()
        except Exception:
            log.exception("monitor: reading gradients before the optimizer step failed")
        return None

    def _after(self, closure: Any) -> Any:
        def measured_closure() -> Any:
            out = closure()
            try:
                with _guards():
                    self._grad_figures()  # a closure called again (LBFGS): its last call's
            except Exception:
                log.exception("monitor: reading gradients after the closure failed")
            return out
        return measured_closure

    def _keep_parameters(self) -> None:
        """The parameters before the update, into buffers reused step to step."""
        try:
            with _guards():
                ps = [_local(p).detach() for p in self.params]
                bufs = self._buffers
                if bufs is None or any(b.shape != p.shape or b.dtype != p.dtype
                                       or b.device != p.device for b, p in zip(bufs, ps,
                                                                                strict=True)):
                    bufs = self._buffers = [torch.empty_like(p) for p in ps]
                # reused buffers: no allocation per step; a freed parameter is not read
                kept = [i for i, p in enumerate(ps) if not freed(p)]
                torch._foreach_copy_([bufs[i] for i in kept], [ps[i] for i in kept])
                self._before, self._kept = bufs, kept
        except Exception:
            log.exception("monitor: keeping the parameters before the optimizer step failed")

    def _post_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if not self.recording or self._before is None:
            return
        try:
            with _guards():
                ps = [_local(p).detach() for p in self.params]
                both = [i for i in self._kept if not freed(ps[i])]  # else NaN: not measured
                diff = [self._before[i] for i in both]
                torch._foreach_sub_(diff, [ps[i] for i in both])
                update: list[Value] = [NAN] * len(ps)
                for i, v in zip(both, _norm_values(diff), strict=True):
                    update[i] = v
                self._update = update
            self._before = None
        except Exception:
            log.exception("monitor: update figures failed")

    # -- step ----------------------------------------------------------------------------

    def start(self, detail: bool = True) -> None:
        """Record this step's figures; `detail`: the parameters' norms, the update ratios and
        the optimizer state's norms too (on the other steps they are not measured: NaN)."""
        self._acts, self._before, self._grads, self._update = {}, None, None, None
        self._act, self._seen = _Reductions(), {}
        self._held, self._held_bytes = [], 0  # a step left without collect(): not measured
        self.detail = detail
        self.recording = True

    def _grad_figures(self) -> None:
        """Reduce the gradients now (before the optimizer step, which may zero them)."""
        have: list[int] = []
        ts: list[torch.Tensor] = []
        for i, p in enumerate(self.params):
            g = p.grad
            if g is not None:
                have.append(i)
                ts.append(g if type(g) is torch.Tensor else _local(g))  # read, not changed
        red = _Reductions()
        red.add(ts)
        self._grads = (have, red)

    def collect(self) -> dict[str, Any]:
        """Stop recording; return this step's figures as Python floats (one read-back)."""
        self.recording = False
        self._seen = {}
        with _guards():
            try:
                self._flush()
            except Exception:  # the figures of the held outputs stay NaN
                self._held, self._held_bytes = [], 0
                log.exception("monitor: activation figures failed")
            if self._grads is None:  # no optimizer step seen: the gradients as they are
                self._grad_figures()
            have, grads = self._grads  # type: ignore[misc]
            detail = self.detail
            p_norms = _norm_values([_local(p).detach() for p in self.params]) if detail else []
            update = list(self._update) if self._update is not None else []
            state = self._state_norms(detail)
            act = self._act
            # one read-back: activation and gradient reductions, then parameter, update and
            # optimizer-state norms
            floats = act.floats + grads.floats + p_norms + update + \
                [n for _, _, ns in state for n in ns]
            f, c = _read_back(floats, act.ints + grads.ints)
        acts = _columns(act, f, c)
        g_cols = _columns(grads, f[3 * act.n:], c[len(act.ints):])
        at = 3 * (act.n + grads.n)
        par_norm = f[at:at + len(p_norms)] if detail else [NAN] * len(self.params)
        at += len(p_norms)
        upd, at = (f[at:at + len(update)] if update else None), at + len(update)
        states: dict[str, list[float]] = {}
        for key, idx, ns in state:
            row = [NAN] * len(self.params)
            for i, v in zip(idx, f[at:at + len(ns)], strict=True):
                row[i] = v
            states[key], at = row, at + len(ns)
        return self._assemble(acts, have, g_cols, par_norm, upd, states)

    def _state_norms(self, detail: bool = True
                     ) -> list[tuple[str, list[int], list[Value]]]:
        """Norms of each optimizer state tensor shaped like its parameter, by state key:
        (key, parameter indices, 0-d norms). Without `detail`, the keys alone (no index, no
        norm: a row not measured), once they are known: the file's columns are made from
        the first row's keys, which may be a step without detail (a resumed run's)."""
        if self.optimizer is None:
            return []
        if not detail and self.state_keys:
            return [(k, [], []) for k in sorted(self.state_keys)]
        by_key: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for i, p in enumerate(self.params):
            st = self.optimizer.state.get(p)
            if not st:
                continue
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape and v.is_floating_point():
                    by_key.setdefault(k, []).append((i, _local(v).detach()))
        out = []
        for k in sorted(by_key):
            if k not in self.state_keys:
                self.state_keys.append(k)
            if detail:
                out.append((k, [i for i, _ in by_key[k]],
                            _norm_values([v for _, v in by_key[k]])))
            else:
                out.append((k, [], []))
        return out

    def _assemble(self, acts: Columns, have: list[int], grads: Columns,
                  par_norm: list[float], upd: list[float] | None,
                  states: dict[str, list[float]]) -> dict[str, Any]:
        m, p = len(self.module_names), len(self.params)
        cols = tuple([NAN] * m for _ in MODULE_FIGURES)  # a module that did not run: NaN
        norm, lo, hi, nan, inf = cols
        e_norm, e_lo, e_hi, e_nan, e_inf = acts
        for i, es in self._acts.items():
            if len(es) == 1:
                e = es[0]
                norm[i], lo[i], hi[i], nan[i], inf[i] = (e_norm[e], e_lo[e], e_hi[e],
                                                         e_nan[e], e_inf[e])
            elif es:  # a module called several times: one figure for all its calls
                norm[i], lo[i], hi[i], nan[i], inf[i] = _combine(
                    [(e_norm[e], e_lo[e], e_hi[e], e_nan[e], e_inf[e]) for e in es])
        mod: dict[str, list[float]] = dict(zip(MODULE_FIGURES, cols, strict=True))
        par: dict[str, list[float]] = {f: [NAN] * p for f in PARAM_FIGURES}
        par["norm"] = par_norm
        grad_figures = ("grad_norm", "grad_min", "grad_max", "grad_nan", "grad_inf")
        if len(have) == p:  # every parameter has its gradient: the columns as they are
            par.update(zip(grad_figures, grads, strict=True))
        else:
            for f, src in zip(grad_figures, grads, strict=True):
                col = par[f]
                for k, i in enumerate(have):
                    col[i] = src[k]
        if upd is not None:
            par["update_ratio"] = [u / w if w > 0 else NAN for u, w in zip(upd, par_norm,
                                                                          strict=True)]
        gn = grads[0]  # the gradients' norms, of the parameters that have one
        total = math.sqrt(sum(x * x for x in gn)) if gn else NAN
        # the sum of all states' norms per parameter, for the one 'state_norm' figure
        if states and self.detail:
            keys = list(states)
            par["state_norm"] = [math.sqrt(sum((states[k][i] ** 2) for k in keys
                                               if not math.isnan(states[k][i])))
                                 if any(not math.isnan(states[k][i]) for k in keys) else NAN
                                 for i in range(p)]
        return {"module": mod, "param": par, "state": states, "grad_norm": total,
                "grads": len(have)}

    def close(self) -> None:
        self._held, self._held_bytes = [], 0
        for h in self._handles:
            h.remove()
        self._handles = []
