"""`substitute(...)`: run chosen ops on another device and/or at another dtype, mid-step.

One mechanism for the CPU fallback users know from device stacks (run an op the device gets
wrong on the CPU) and for per-op dtype casts (run an op in float32 inside a float16 model):
matching op calls run on `on` with their floating inputs cast to `dtype`, and their results
come back on the original device, in the original dtype and strides, so the step goes on.
In-place and `out=` ops write their results back into the original tensors.

Not substituted (they run on the device, and `skipped` says why): views (their result must
alias the device tensor), collectives, rng draws and uninitialised factories.
Under `sim`, enter `substitute` inside `sim(...)`: substituted calls then bypass the sim.

It runs on the dumper's loop (accuracy/dumper/loop.py): the same numbering and placing as a
dump and the live check, its runner choosing where each call runs, an observer keeping the
calls it was asked about.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from accuracy.aten import is_view, written_ids
from accuracy.dumper.calls import Call as LoopCall
from accuracy.dumper.calls import OpCall
from accuracy.dumper.flatten import tensors_in
from accuracy.dumper.loop import Loop, run_here
from accuracy.dumper.sites import Sites
from accuracy.dumpfile import dtypes
from accuracy.errors import UsageError
from accuracy.live.check import fill_tensors
from accuracy.live.select import CallSelection, unrunnable
from accuracy.replay.engine import reference_device

log = logging.getLogger(__name__)
VIEW_REASON = "view: its result must alias the device tensor"


@dataclass(frozen=True)
class Call:
    """One op call seen inside a `substitute` block."""

    seq: int
    op: str
    phase: str
    module: str
    substituted: bool
    reason: str = ""  # why it was not (or, recorded and not selected, could not be) moved
    floating: bool = False  # has a floating-point tensor output


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        value = dtypes.torch_dtype(str(dtype).removeprefix("torch."))
    except ValueError:
        value = None
    if value is None or not value.is_floating_point:
        raise UsageError(f"dtype must name a floating dtype (float32, bfloat16...), not {dtype!r}")
    return value




def _written(func: Any, args: tuple, kwargs: dict) -> list[int]:
    """Positions, in `tensors_in(kwargs, tensors_in(args))` order, of tensors the op writes."""
    ids = written_ids(func, args, kwargs)
    return [i for i, t in enumerate(tensors_in(kwargs, tensors_in(args))) if id(t) in ids]


def _map_devices(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.device):
        return device
    if isinstance(obj, list | tuple):
        return type(obj)(_map_devices(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_devices(v, device) for k, v in obj.items()}
    return obj


def _device_arg(obj: Any) -> torch.device | None:
    if isinstance(obj, torch.device):
        return obj
    if isinstance(obj, list | tuple):
        return next((d for d in map(_device_arg, obj) if d is not None), None)
    if isinstance(obj, dict):
        return next((d for d in map(_device_arg, obj.values()) if d is not None), None)
    return None



def _tell_sim(op: str) -> None:
    """The active `sim` never sees a call run elsewhere: it must not call its fault unmatched."""
    from accuracy.device_backend.simulator import active

    device = active()
    if device is not None:
        device.ran_elsewhere(op)


class Substitute:
    """Context manager running selected op calls on `on`, optionally at `dtype`.

    ops / exclude_ops / modules / phases: patterns as in the dumper (no ops and no modules:
    every op). calls: exact call indices within the block (0-based, every op counts), as
    `accuracy.live.prove` uses. record: keep one `Call` per op seen (`calls_seen`).
    After the block: `substituted` (Calls run elsewhere), `skipped` (selected, not moved).
    """

    def __init__(self, ops: str | Iterable[str] | None = None,
                 modules: str | Iterable[str] | None = None, *, on: str = "cpu",
                 dtype: str | torch.dtype | None = None,
                 exclude_ops: str | Iterable[str] | None = None,
                 phases: str | Iterable[str] | None = None, calls: Iterable[int] | None = None,
                 record: bool = False) -> None:
        self.on = on
        self.device = reference_device(on)
        self.dtype = _parse_dtype(dtype)
        self.selection = CallSelection.build(ops, modules, exclude_ops, phases, calls)
        self.record = record
        self.calls_seen: list[Call] = []
        self.substituted: list[Call] = []
        self.skipped: list[Call] = []
        self._loop: Loop | None = None
        # the call the runner ran last: (call, selected, why not moved, moved)
        self._ran: tuple[OpCall, bool, str, bool] | None = None

    @property
    def calls(self) -> int:
        """Calls the block ran."""
        return self._loop.seq if self._loop is not None else 0

    def __enter__(self) -> Substitute:
        self.calls_seen, self.substituted, self.skipped = [], [], []
        self._ran = None
        self._loop = loop = Loop(Sites(with_source=False), label="substitute", runner=self._run)
        loop.observe(self)
        loop.install()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._loop.uninstall(exc_type, exc, tb)
        log.info("substitute: %d calls run on %s%s, %d selected but kept on the device",
                 len(self.substituted), self.device,
                 f" at {self.dtype}" if self.dtype else "", len(self.skipped))
        return False

    def _run(self, call: OpCall) -> Any:
        """The loop's runner: a selected call that can move runs on `on`, the rest here."""
        site = call.site
        func, args, kwargs = call.func, call.args, call.kwargs
        wanted = self.selection.wants(site.seq, site.op, site.module, site.phase)
        reason = ""
        out = None
        if wanted or self.record:  # recorded calls say whether they could be moved
            reason = unrunnable(func, site.op, args, kwargs) or (VIEW_REASON if is_view(func)
                                                                 else "")
        if wanted and not reason:
            try:
                out = self._run_elsewhere(func, args, kwargs)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
                reason = f"failed on {self.device}: {str(e).splitlines()[0][:200]}" \
                    if str(e) else type(e).__name__
                log.warning("substitute: %s (call %d) %s; it runs on the device", site.op,
                            site.seq, reason)
        done = wanted and not reason
        if done:
            _tell_sim(site.op)
        else:
            out = run_here(call)
        self._ran = (call, wanted, reason, done)
        return out

    # -- an observer of the loop: what became of each call ---------------------------------

    def before(self, call: LoopCall) -> None:
        pass

    def after(self, call: LoopCall, outputs: list[torch.Tensor]) -> None:
        ran, self._ran = self._ran, None
        if ran is None or ran[0] is not call:
            return
        _, wanted, reason, done = ran
        if self.record or wanted:
            site = call.site
            seen = Call(site.seq, site.op, site.phase, site.module, done, reason,
                        any(t.is_floating_point() for t in outputs))
            if self.record:
                self.calls_seen.append(seen)
            if wanted:
                (self.substituted if done else self.skipped).append(seen)

    def finish(self) -> dict[str, Any]:
        return {}

    def _cast(self, t: torch.Tensor, copy: bool) -> torch.Tensor:
        dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
        return t.detach().to(self.device, dtype=dtype, copy=copy)

    def _run_elsewhere(self, func: Any, args: tuple, kwargs: dict) -> Any:
        inputs = tensors_in(kwargs, tensors_in(args))
        written = _written(func, args, kwargs)
        with torch._C._DisableTorchDispatch(), torch.no_grad():
            ref = [self._cast(t, copy=i in written) for i, t in enumerate(inputs)]
            r_args, r_kwargs = fill_tensors((list(args), kwargs), ref)
            r_args, r_kwargs = _map_devices((r_args, r_kwargs), self.device)
            meta = _meta_outputs(func, args, kwargs, inputs)
            out = func(*r_args, **r_kwargs)
            # in-place / out=: the results go back into the device's own tensors
            back = {id(ref[i]): inputs[i] for i in written}
            for i in written:
                inputs[i].copy_(ref[i])
            target = _device_arg((args, kwargs)) or next(
                (t.device for t in inputs), torch.device("cpu"))
            outs = tensors_in(out)
            first_float = next((t.dtype for t in inputs if t.is_floating_point()), None)
            converted = []
            for k, t in enumerate(outs):
                if id(t) in back:
                    converted.append(back[id(t)])
                    continue
                m = meta[k] if meta is not None and k < len(meta) else None
                converted.append(_return(t, m, target, self.dtype, first_float))
            return fill_tensors(out, converted)


def _meta_outputs(func: Any, args: tuple, kwargs: dict, inputs: list[torch.Tensor]
                  ) -> list[torch.Tensor] | None:
    """The op's outputs on the meta device (dtype, shape, strides as the device would give)."""
    try:
        metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                 for t in inputs]
        m_args, m_kwargs = fill_tensors((list(args), kwargs), metas)
        m_args, m_kwargs = _map_devices((m_args, m_kwargs), torch.device("meta"))
        return tensors_in(func(*m_args, **m_kwargs))
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None


def _return(t: torch.Tensor, meta: torch.Tensor | None, device: torch.device,
            cast: torch.dtype | None, first_float: torch.dtype | None) -> torch.Tensor:
    """A reference output back on the device in the dtype and strides the device would give."""
    if meta is not None and tuple(meta.shape) == tuple(t.shape):
        out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=device)
        out.copy_(t)
        return out
    dtype = t.dtype
    if cast is not None and t.dtype == cast and first_float is not None:
        dtype = first_float  # no meta kernel: a cast op's output takes its inputs' dtype
    return t.to(device=device, dtype=dtype)


def substitute(ops: str | Iterable[str] | None = None,
               modules: str | Iterable[str] | None = None, **kwargs: Any) -> Substitute:
    """`with accuracy.substitute(ops="aten.gelu", on="cpu", dtype="float32"): step()`."""
    return Substitute(ops, modules, **kwargs)
