"""Per-step figures of a model: module outputs, parameters, gradients, optimizer state.

Cheap by construction: no dispatch mode. Module forward hooks reduce each output as it is made
(norm, min, max; NaN/Inf counts only where the norm is not finite), parameter figures are
batched with `torch._foreach_*` at the step's end, and every figure of a step stays on the
device until `collect()` reads them back once. All reductions run with Python dispatch disabled,
so a dumper or `sim` above never sees (or counts, or rounds) the monitor's own work.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from accuracy.patterns import module_matches

log = logging.getLogger(__name__)

MODULE_FIGURES = ("act_norm", "act_min", "act_max", "act_nan", "act_inf")
PARAM_FIGURES = ("norm", "grad_norm", "grad_min", "grad_max", "grad_nan", "grad_inf",
                 "update_ratio", "state_norm")
NAN = float("nan")


def _float_leaves(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0]


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


def _counts(ts: list[torch.Tensor], norms: list[torch.Tensor]) -> list[tuple[Any, Any]]:
    """(nan, inf) counts per tensor. On CPU they are computed only where the norm is not finite
    (a finite norm proves there is none); elsewhere always, so the step never waits."""
    out: list[tuple[Any, Any]] = []
    for t, n in zip(ts, norms, strict=True):
        if t.device.type == "cpu" and math.isfinite(float(n)):
            out.append((0, 0))
        else:
            out.append((torch.isnan(t).sum(), torch.isinf(t).sum()))
    return out


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
        self.compiled_modules: set[int] = set()  # hooks seen inside torch.compile regions
        self._acts: dict[int, list[torch.Tensor]] = {}
        self._seen: dict[tuple, torch.Tensor] = {}
        self._before: list[torch.Tensor] | None = None
        self._buffers: list[torch.Tensor] | None = None
        self._grads: list[torch.Tensor | None] | None = None
        self._update: list[torch.Tensor] | None = None
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(optimizer.register_step_post_hook(self._post_step))

    # -- hooks ---------------------------------------------------------------------------

    def _forward_hook(self, idx: int) -> Any:
        def hook(_mod: nn.Module, _args: Any, output: Any) -> None:
            if not self.recording:
                return
            if torch.compiler.is_compiling():  # inside torch.compile: said once, not measured
                self.compiled_modules.add(idx)
                return
            self._measure(idx, output)
        return hook

    @torch.compiler.disable  # a frame resumed after a graph break runs this eagerly
    def _measure(self, idx: int, output: Any) -> None:
        try:
            ts = _float_leaves(output)
            if not ts:
                return
            key = tuple((t.data_ptr(), t.shape, t._version) for t in ts)
            seen = self._seen.get(key)
            if seen is not None:  # a container returning its child's output: measured
                self._acts.setdefault(idx, []).append(seen)
                return
            with _NoDispatch():
                norms = torch._foreach_norm(ts)
                mm = [torch.aminmax(t) for t in ts]
                mins = [m[0] for m in mm]
                maxs = [m[1] for m in mm]
                counts = _counts(ts, norms)
                row = torch.stack([
                    torch.stack([n.double() for n in norms]).square().sum().sqrt(),
                    torch.stack([m.double() for m in mins]).min(),
                    torch.stack([m.double() for m in maxs]).max(),
                    sum((torch.as_tensor(c[0], dtype=torch.float64) for c in counts),
                        torch.zeros((), dtype=torch.float64)),
                    sum((torch.as_tensor(c[1], dtype=torch.float64) for c in counts),
                        torch.zeros((), dtype=torch.float64)),
                ])
            self._seen[key] = row
            self._acts.setdefault(idx, []).append(row)
        except Exception:  # never break the user's forward
            log.exception("monitor: activation figures of %s failed",
                          self.module_names[idx])

    def _pre_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if not self.recording:
            return
        try:
            with _NoDispatch():
                self._grads = [p.grad for p in self.params]
                ps = [p.detach() for p in self.params]
                bufs = self._buffers
                if bufs is None or any(b.shape != p.shape or b.dtype != p.dtype
                                       or b.device != p.device for b, p in zip(bufs, ps,
                                                                                strict=True)):
                    bufs = self._buffers = [torch.empty_like(p) for p in ps]
                torch._foreach_copy_(bufs, ps)  # reused buffers: no allocation per step
                self._before = bufs
        except Exception:
            log.exception("monitor: reading gradients before the optimizer step failed")

    def _post_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if not self.recording or self._before is None:
            return
        try:
            with _NoDispatch():
                diff = self._before
                torch._foreach_sub_(diff, [p.detach() for p in self.params])
                self._update = torch._foreach_norm(diff)
            self._before = None
        except Exception:
            log.exception("monitor: update figures failed")

    # -- step ----------------------------------------------------------------------------

    def start(self) -> None:
        self._acts, self._before, self._grads, self._update = {}, None, None, None
        self._seen = {}
        self.recording = True

    def collect(self) -> dict[str, Any]:
        """Stop recording; return this step's figures as Python floats (one read-back)."""
        self.recording = False
        self._seen = {}
        with _NoDispatch():
            pending: list[torch.Tensor] = []
            m = len(self.module_names)
            act_idx = []
            for i in range(m):
                rows = self._acts.get(i)
                if not rows:
                    act_idx.append(None)
                    continue
                if len(rows) == 1:
                    row = rows[0]
                else:  # a module called several times in a step: one figure for all calls
                    r = torch.stack(rows)
                    row = torch.stack([r[:, 0].square().sum().sqrt(), r[:, 1].min(),
                                       r[:, 2].max(), r[:, 3].sum(), r[:, 4].sum()])
                act_idx.append(len(pending))
                pending.append(row.to("cpu", torch.float64))
            grads = self._grads if self._grads is not None else [p.grad for p in self.params]
            have = [i for i, g in enumerate(grads) if g is not None]
            gts = [grads[i].detach() for i in have]  # type: ignore[union-attr]
            p_norms = torch._foreach_norm([p.detach() for p in self.params]) \
                if self.params else []
            g_norms = torch._foreach_norm(gts) if gts else []
            g_mm = [torch.aminmax(g) for g in gts]
            g_min = [m[0] for m in g_mm]
            g_max = [m[1] for m in g_mm]
            g_counts = _counts(gts, g_norms)
            keys, state_rows = self._state_norms()
            cols = [torch.stack([n.double() for n in p_norms]).cpu()] if p_norms else []
            flat = torch.cat(cols + [torch.stack([
                torch.stack([n.double() for n in g_norms]),
                torch.stack([x.double() for x in g_min]),
                torch.stack([x.double() for x in g_max]),
                torch.stack([torch.as_tensor(c[0], dtype=torch.float64) for c in g_counts]),
                torch.stack([torch.as_tensor(c[1], dtype=torch.float64) for c in g_counts]),
            ]).cpu().reshape(-1)] if gts else cols)
            upd = torch.stack([n.double() for n in self._update]).cpu() \
                if self._update is not None else None
            act_flat = torch.stack(pending).reshape(-1) if pending else None
            values = flat.tolist()
            act_values = act_flat.tolist() if act_flat is not None else []
            upd_values = upd.tolist() if upd is not None else None
            state_values = [r.tolist() for r in state_rows]
        return self._assemble(act_idx, act_values, have, values, upd_values, keys,
                              state_values)

    def _state_norms(self) -> tuple[list[str], list[torch.Tensor]]:
        """Norms of each optimizer state tensor shaped like its parameter, by state key."""
        if self.optimizer is None:
            return [], []
        by_key: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for i, p in enumerate(self.params):
            st = self.optimizer.state.get(p)
            if not st:
                continue
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape and v.is_floating_point():
                    by_key.setdefault(k, []).append((i, v.detach()))
        keys = sorted(by_key)
        rows = []
        for k in keys:
            idx = torch.tensor([i for i, _ in by_key[k]])
            norms = torch.stack([n.double() for n in
                                 torch._foreach_norm([v for _, v in by_key[k]])]).cpu()
            row = torch.full((len(self.params),), NAN, dtype=torch.float64)
            row[idx] = norms
            rows.append(row)
        for k in keys:
            if k not in self.state_keys:
                self.state_keys.append(k)
        return keys, rows

    def _assemble(self, act_idx: list[int | None], act_values: list[float], have: list[int],
                  values: list[float], upd: list[float] | None, keys: list[str],
                  state_values: list[list[float]]) -> dict[str, Any]:
        m, p = len(self.module_names), len(self.params)
        mod: dict[str, list[float]] = {f: [NAN] * m for f in MODULE_FIGURES}
        for i, at in enumerate(act_idx):
            if at is None:
                continue
            for j, f in enumerate(MODULE_FIGURES):
                mod[f][i] = act_values[at * 5 + j]
        par: dict[str, list[float]] = {f: [NAN] * p for f in PARAM_FIGURES}
        par["norm"] = values[:p] if p else []
        g = values[p:]
        n = len(have)
        for j, f in enumerate(("grad_norm", "grad_min", "grad_max", "grad_nan", "grad_inf")):
            for k, i in enumerate(have):
                par[f][i] = g[j * n + k]
        if upd is not None:
            par["update_ratio"] = [u / w if w > 0 else NAN for u, w in zip(upd, par["norm"],
                                                                          strict=True)]
        gn = [par["grad_norm"][i] for i in have]
        total = math.sqrt(sum(x * x for x in gn)) if gn else NAN
        states = {k: v for k, v in zip(keys, state_values, strict=True)}
        # the sum of all states' norms per parameter, for the one 'state_norm' figure
        if states:
            par["state_norm"] = [math.sqrt(sum((states[k][i] ** 2) for k in keys
                                               if not math.isnan(states[k][i])))
                                 if any(not math.isnan(states[k][i]) for k in keys) else NAN
                                 for i in range(p)]
        return {"module": mod, "param": par, "state": states, "grad_norm": total}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
