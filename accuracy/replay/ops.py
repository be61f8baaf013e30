"""Replay one recorded op: run it on the reference in its own dtype and upcast, and measure."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from accuracy import safeops
from accuracy.aten import (
    MOVEMENT,
    is_collective,
    resolve_op,
    returns_nothing,
    workspace_outputs,
    written_tensors,
)
from accuracy.dumpfile import dtypes, schema
from accuracy.dumpfile.argcodec import decode_call
from accuracy.dumpfile.checksum import NO_HASH, content_hash
from accuracy.dumpfile.reader import DamagedDataError, DumpError, OpRecord, TensorRecord
from accuracy.replay import rnn as _rnn  # noqa: F401  (registers the RNN references)
from accuracy.replay.cache import TensorCache
from accuracy.replay.emulate import Emulation, emulated_outputs, residual, to_output
from accuracy.replay.metrics import agreeing_metrics, bit_equal, exact_metrics, output_metrics
from accuracy.replay.rebuild import (
    Unreplayable,
    build_call,
    check_inputs,
    stand_in,
    uninitialised_inputs,
)
from accuracy.replay.refcall import Reference, ReferenceCall
from accuracy.replay.registry import lookup_reference

log = logging.getLogger(__name__)

OK, SKIPPED, FAILED = "ok", "skipped", "failed"
_NO_KERNEL_HINTS = ("could not run", "not implemented for", "no kernel", "notimplemented")


@dataclass
class OpOutcome:
    """What replaying one op produced; `tensors` are the same-dtype reference outputs."""

    seq: int
    status: str
    reason: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    tensors: list[torch.Tensor | None] = field(default_factory=list)
    emulated: str = ""  # "quant": the reference ran on honestly re-quantised fp8/MX operands

    def replay_extra(self) -> dict[str, Any]:
        d = {"status": self.status, "reason": self.reason, "outputs": self.outputs}
        if self.emulated:
            d["emulated"] = self.emulated
        return d


class StoredOutput:
    """A device output still in the dump, read only when its content hash cannot settle
    whether the reference's output has the same bits.

    XXH3-64 of the reference's bytes equal to the hash the writer stored for the device's
    proves them bit-identical (a collision is a 2**-64 chance) without reading them; the
    reference's tensor then serves every later read of those bytes (`TensorCache.adopt`).
    A different hash proves them different: the bytes are read and measured as before.
    """

    __slots__ = ("record", "cache", "shape", "dtype")

    def __init__(self, record: TensorRecord, cache: TensorCache) -> None:
        self.record, self.cache = record, cache
        self.shape = tuple(record.shape)
        try:
            self.dtype: torch.dtype | None = dtypes.torch_dtype(record.dtype)
        except (KeyError, ValueError, TypeError, AttributeError):
            self.dtype = None  # read and measured as before

    def load(self) -> torch.Tensor:
        return self.cache.load(self.record)

    def same_bits(self, ref: torch.Tensor) -> bool | None:
        """Whether `ref` has the stored bytes, by the content hash; None when the hash
        cannot tell (none stored, bytes already in memory, a reference off the host)."""
        t = self.record
        if t.content_hash == NO_HASH or self.dtype is None or self.cache.holds(t) \
                or ref.device.type != "cpu":
            return None
        if ref.dtype != self.dtype or tuple(ref.shape) != self.shape:
            return False
        ref = ref.contiguous()
        raw = (np.empty(0, np.uint8) if ref.numel() == 0
               else ref.reshape(-1).view(torch.uint8).numpy())
        if content_hash(raw) != t.content_hash:
            return False
        self.cache.adopt(t, ref)
        return True


def _dropout_reference(rec: OpRecord) -> Any:
    """native_dropout is checkable from its recorded mask: output = input * mask / (1 - p)."""
    if len(rec.outputs) < 2 or not rec.outputs[1].has_data:
        raise Unreplayable("rng op (dropout) whose mask is not in the dump")
    return dropout_reference(rec.outputs[1].load())


def dropout_reference(mask: torch.Tensor) -> Any:
    """A native_dropout reference that applies the device's own `mask`."""

    def ref(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
        m = mask.to(x.device)
        if not train:
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
        return x.mul(m.to(x.dtype)).mul_(scale), m.clone()

    return ref


def _rng_disabled(rec: OpRecord) -> bool:
    fn = resolve_op(rec.op)
    if fn is None:
        return False
    try:
        args, kwargs = rec.call([None] * len(rec.inputs))
    except ValueError:
        return False
    return rng_disabled(fn, args, kwargs)


def rng_disabled(fn: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """An rng-tagged op whose randomness is off (attention with dropout_p=0, train=False)."""
    for pos, a in enumerate(fn._schema.arguments):
        value = args[pos] if pos < len(args) else kwargs.get(a.name, a.default_value)
        if a.name == "dropout_p" and value == 0:
            return True
        if a.name == "train" and value is False:
            return True
    return False


RNG_REASON = "rng op: its random draws cannot be reproduced on the reference"


def refused_for_sure(rec: OpRecord) -> bool:
    """Whether `replay_op` refuses `rec` before running anything (compiled kernel,
    uninitialised factory, collective, profiler marker, random draws it cannot reproduce),
    decided from the record alone, reading no tensor. An rng-tagged op whose randomness is
    off (attention with dropout_p=0) or that has its own reference (dropout from its mask)
    is re-run: its outputs can be settled by their hash."""
    extra = rec.extra
    if extra.get(schema.EXTRA_COMPILED) or extra.get(schema.EXTRA_UNINITIALIZED) \
            or schema.EXTRA_COLLECTIVE in extra \
            or is_collective(rec.op) or rec.op.startswith("profiler."):
        return True
    if not extra.get(schema.EXTRA_RNG) or lookup_reference(rec.op) is not None \
            or rec.op.startswith("aten._scaled_mm.") or rec.op == "aten.native_dropout.default":
        return False
    try:
        return not _rng_disabled(rec)
    except (TypeError, KeyError, IndexError, AttributeError, RuntimeError):
        return True  # replay_op reports it; here its outputs are just read ahead


def _kernel(rec: OpRecord) -> tuple[Any, str]:
    if is_collective(rec.op) or schema.EXTRA_COLLECTIVE in rec.extra:
        raise Unreplayable("collective: it needs the other ranks; give all ranks' dumps to "
                           "check it against their inputs (accuracy replay 'run_{rank}.h5')")
    fn = lookup_reference(rec.op)
    if fn is not None:
        return fn, "registered reference"
    if rec.op.startswith("aten._scaled_mm."):
        from accuracy.replay.scaled_mm import scaled_mm_reference
        return scaled_mm_reference, "fp8 _scaled_mm: reference accumulates the scaled product"
    if rec.op == "aten.native_dropout.default":
        return _dropout_reference(rec), "rng op checked against its recorded mask"
    if rec.op.startswith("profiler."):  # optimizer.step()'s record_function markers
        raise Unreplayable("profiler marker (record_function enter/exit): no numerics to "
                           "replay")
    if rec.extra.get(schema.EXTRA_RNG) and not _rng_disabled(rec):
        raise Unreplayable(RNG_REASON)
    fn = _allowed(rec)
    if returns_nothing(fn):
        return _returning_writes(fn), ""
    return fn, ""


def _allowed(rec: OpRecord) -> Any:
    """The op a row names, when it is on the allow-list of compute ops and its recorded
    arguments are of the kinds it accepts (accuracy/safeops.py): a crafted row naming
    `aten.from_file` or a walk out of `torch.ops` is refused before anything runs."""
    try:
        return _allowed_call(rec.op, rec.args_json, len(rec.inputs))
    except safeops.UnknownOp:
        raise Unreplayable(f"no kernel on the reference: {rec.op} is unknown to torch "
                           f"{torch.__version__}; register one with register_reference()"
                           ) from None
    except safeops.RefusedOp as e:
        raise Unreplayable(f"not run from a file: {e}; register a reference with "
                           "register_reference() to replay it") from None


@functools.lru_cache(maxsize=4096)
def _allowed_call(op: str, args_json: str, n_inputs: int) -> Any:
    """`_allowed`'s check, once per distinct call text (most ops of a step repeat a few; a
    refusal raises, so it is never kept)."""
    fn = safeops.compute_op(op)
    safeops.check_call(fn, *decode_call(args_json, [None] * n_inputs))
    return fn


def _returning_writes(fn: Any) -> Any:
    """A fused/foreach op returns nothing: run it and return what it wrote, in the order
    the dumper recorded as its outputs (`aten.written_tensors`)."""

    def run(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        fn(*args, **kwargs)
        return written_tensors(fn, args, kwargs)

    return run


def _run(fn: Any, args: list[Any], kwargs: dict[str, Any], on: str) -> list[torch.Tensor]:
    try:
        with torch.no_grad():
            out = fn(*args, **kwargs)
    except (NotImplementedError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, NotImplementedError) or any(h in msg.lower() for h in _NO_KERNEL_HINTS):
            raise Unreplayable(f"no kernel on the reference ({on}): {msg[:200]}") from None
        raise
    flat, _ = tree_flatten(out)
    return [o for o in flat if isinstance(o, torch.Tensor)]


def needs_upcast(inputs: list[torch.Tensor], output_dtypes: list[Any], dtype_arg: bool,
                 upcast: str) -> bool:
    """Whether an upcast run can change anything: low-precision floats in or out, or a dtype
    argument (factories and casts produce low-precision values from nothing)."""
    if upcast == "none":
        return False
    low = (torch.float64, torch.complex128) if upcast == "fp64" else (
        torch.float32, torch.float64, torch.complex64, torch.complex128)
    if any((t.is_floating_point() or t.is_complex()) and t.dtype not in low for t in inputs):
        return True
    names = [str(d).removeprefix("torch.") for d in output_dtypes]
    if any(n.startswith(("float", "bfloat", "complex")) and n not in {"float64", "complex128"}
           for n in names):
        return True
    return dtype_arg


_active_cache: TensorCache | None = None


@contextmanager
def caching(cache: TensorCache) -> Iterator[TensorCache]:
    """Within the block, `replay_op` calls without a cache use `cache`."""
    global _active_cache
    prev, _active_cache = _active_cache, cache
    try:
        yield cache
    finally:
        _active_cache = prev


def replay_op(rec: OpRecord, device: torch.device, upcast: str,
              cache: TensorCache | None = None, keep: bool = True,
              emulation: Emulation | None = None) -> OpOutcome:
    """Replay one record; never raises for a bad op, it reports it (skipped/failed + reason).

    `cache` keeps tensors read from the dump across calls (pass the same one for every op of
    a replay, or set one with `caching`); without either every tensor is read afresh.
    keep: return the same-dtype reference outputs (`OpOutcome.tensors`); False when only
    the figures are wanted (spares a contiguous copy of each).
    `emulation`: the device's rounding rules (`Emulation.from_attrs(dump.attrs)`): an op
    they round also gets its residual against the emulated reference (replay/emulate.py).
    """
    if cache is None:
        cache = _active_cache if _active_cache is not None else TensorCache(0)
    return guarded(rec.seq, rec.op,
                   lambda: _replay(rec, device, upcast, cache, keep, emulation))


def guarded(seq: int, op: str, run: Callable[[], OpOutcome]) -> OpOutcome:
    """`run()`, with an op that cannot be re-run reported (skipped/failed + reason), not raised."""
    try:
        return run()
    except Unreplayable as e:
        return OpOutcome(seq, SKIPPED, str(e))
    except DamagedDataError:
        raise  # a damaged file is not a bad op: stop, naming the tensor
    except (DumpError, ValueError, TypeError, RuntimeError, IndexError, KeyError) as e:
        log.debug("re-run of %s (seq %d) failed", op, seq, exc_info=True)
        return OpOutcome(seq, FAILED, f"{type(e).__name__}: {str(e)[:300]}")


def _replay(rec: OpRecord, device: torch.device, upcast: str, cache: TensorCache,
            keep: bool = True, emulation: Emulation | None = None) -> OpOutcome:
    if rec.extra.get(schema.EXTRA_COMPILED) == "inductor":  # a fused kernel: re-run its ATen ops
        from accuracy.replay.kernels import replay_kernel
        return replay_kernel(rec, device, upcast, cache, rerun)
    check_inputs(rec)
    fn, note = _kernel(rec)
    not_data = uninitialised_inputs(rec)
    inputs = [stand_in(t, device) if t.idx in not_data else cache.input(t, device)
              for t in rec.inputs]
    # cached inputs are shared: anything that may write to them gets private copies
    mutable = bool(note) or bool(rec.extra.get(schema.EXTRA_INPLACE)) or _mutable(rec.op)

    def build(up: str) -> tuple[list[Any], dict[str, Any]]:
        if up == "none":
            return build_call(rec, inputs, device, "none", mutable)

        def convert(i: int, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            return cache.upcast(rec.inputs[i], t, dtype)
        return build_call(rec, inputs, device, up, mutable, convert)

    scratch = workspace_outputs(rec.op)  # workspaces are not data: never measured
    device_outputs: list[tuple[int, Any]] = [
        (t.idx, StoredOutput(t, cache) if t.has_data else None) for t in rec.outputs
        if t.idx not in scratch]
    want_upcast = needs_upcast(inputs, [t.dtype for t in rec.outputs],
                               '"__dtype__"' in rec.args_json, upcast)
    quant = rec.extra.get(schema.EXTRA_QUANT)
    if isinstance(quant, list) and quant and not note:
        return _rerun_quantised(rec, fn, build, device_outputs, device, upcast, quant)
    if schema.EXTRA_DTENSOR in rec.extra and not rec.extra.get(schema.EXTRA_DTENSOR_LOCAL):
        raise Unreplayable(DTENSOR_MOVED)
    rule = emulation.rule_for(rec.op) if emulation is not None and not note else None
    emulate = None
    if rule is not None and upcast != "none":
        def emulate() -> tuple[Any, list[torch.Tensor]]:
            return rule, emulated_outputs(rec, fn, rule, inputs, device, upcast, _run_quiet)
    call = ReferenceCall(rec.seq, rec.op, fn, build, note)
    if schema.EXTRA_DTENSOR not in rec.extra:
        return rerun(call, device_outputs, Reference(device, upcast, keep), want_upcast, emulate)
    # An op on DTensors ran its kernel on the local shards (recorded), unless DTensor moved
    # data between ranks inside the op: then the local call fails or gives other shapes.
    try:
        out = rerun(call, device_outputs, Reference(device, upcast), want_upcast, emulate)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise Unreplayable(f"{DTENSOR_REASON} ({str(e).splitlines()[0][:120]})") from None
    if out.status == FAILED:
        raise Unreplayable(f"{DTENSOR_REASON} ({out.reason[:120]})")
    out.reason = "; ".join([r for r in [out.reason] if r] + ["re-run on the DTensor's local "
                                                             "shards"])
    return out


DTENSOR_MOVED = ("collective: op on DTensor shards that DTensor redistributed inside the op "
                 "(its kernel did not see the recorded local shards)")
DTENSOR_REASON = ("collective: op on DTensor shards whose local call does not re-run "
                  "(DTensor moved data between ranks inside it)")


def _rerun_quantised(rec: OpRecord, fn: Any, build: Any,
                     device_outputs: list[tuple[int, torch.Tensor | None]],
                     device: torch.device, upcast: str, quant: list[Any]) -> OpOutcome:
    """A GEMM the device ran on fp8/MX operands: the references run on the same operands,
    quantised honestly (accuracy.device_backend.quantizer.requantize), so the error ratio
    measures the kernel at the precision it really used, not the quantisation itself."""
    from accuracy.device_backend.quantizer import requantize

    count = [0]

    def qbuild(up: str) -> tuple[list[Any], dict[str, Any]]:
        args, kwargs = build(up)
        args, kwargs, n = requantize(fn, args, kwargs, quant)
        count[0] = n
        return args, kwargs

    out = rerun(ReferenceCall(rec.seq, rec.op, fn, qbuild,
                              "references on honestly re-quantised operands (fp8/MX)"),
                device_outputs, Reference(device, upcast), upcast != "none")
    if count[0]:
        out.emulated = "quant"
    return out


def rerun(call: ReferenceCall, device_outputs: list[tuple[int, Any]], ref: Reference,
          want_upcast: bool,
          emulate: Callable[[], tuple[Any, list[torch.Tensor]]] | None = None) -> OpOutcome:
    """Re-run one op call on the reference and measure the device's outputs against it.

    The part of a replay that replay and the live check (`accuracy.live`) share:
    `device_outputs` are (output index, device value on the host, a `StoredOutput`, or None
    when not available). Runs the same-dtype call, and the upcast one (`want_upcast`: it can
    change anything) unless the op only moves values or the device is bit-exact. Raises
    Unreplayable (and the kernel's errors) like `_run`. `emulate()`: (rule, outputs of the
    emulated reference), run when the device is not bit-exact (replay/emulate.py).
    """
    seq, op, fn, build, note = call.seq, call.op, call.fn, call.build, call.note
    device, upcast, keep = ref.device, ref.upcast, ref.keep
    same = _run(fn, *build("none"), str(device))
    reasons = [note] if note else []
    high = same
    movement = _is_movement(op)
    tensors = [_host(t, keep) for t in same]
    # A device output bit-identical to the same-dtype reference has, by definition, the
    # reference's own error: its ratio is exactly 1 and the fp64 run can't change that.
    agree = _all_bit_exact(device_outputs, tensors)
    if any(isinstance(d, StoredOutput) for _, d in device_outputs) and not agree:
        device_outputs = [(i, d.load() if isinstance(d, StoredOutput) else d)
                          for i, d in device_outputs]
    if not movement and not agree and want_upcast:
        try:
            high = _run(fn, *build(upcast), str(device))
        except (Unreplayable, RuntimeError, TypeError, ValueError) as e:
            reasons.append(f"upcast run failed ({str(e)[:120]}); errors are against the "
                           "same-dtype reference")
    if len(high) != len(same):
        high = same
    if not device_outputs:
        reasons.append("device outputs not in the dump: reference computed, nothing compared"
                       if same else "no tensor outputs: nothing to compare")
        return OpOutcome(seq, OK, "; ".join(reasons), [], tensors)
    status, metrics = OK, []
    for idx, dev in device_outputs:
        if idx >= len(same):
            status = FAILED
            reasons.append(f"reference gave {len(same)} outputs, the device "
                           f"{len(device_outputs)}")
            break
        if dev is None:
            reasons.append(f"output {idx} has no data in the dump: not compared")
            continue
        ref, hi = tensors[idx], high[idx]
        if tuple(dev.shape) != tuple(ref.shape):
            status = FAILED
            reasons.append(f"output {idx}: device shape {list(dev.shape)} vs reference "
                           f"{list(ref.shape)}")
            metrics.append(_mismatch(idx))
            continue
        if ref.dtype != dev.dtype:
            reasons.append(f"output {idx}: reference dtype {ref.dtype} cast to {dev.dtype}")
            ref = ref.to(dev.dtype)
        if movement:
            metrics.append(exact_metrics(idx, dev, ref, equal=agree or None))
        elif agree:
            metrics.append(agreeing_metrics(idx))
        else:
            # `high is same` (no upcast run) tells output_metrics there is one reference
            hi = tensors[idx] if hi is same[idx] else hi.cpu()
            metrics.append(output_metrics(idx, dev, ref, hi))
    if emulate is not None and not movement and not agree and status == OK:
        _add_emulated(emulate, dict(device_outputs), metrics, reasons)
    return OpOutcome(seq, status, "; ".join(reasons), metrics, tensors if keep else [])


def _add_emulated(emulate: Callable[[], tuple[Any, list[torch.Tensor]]],
                  device_outputs: dict[int, torch.Tensor | None],
                  metrics: list[dict[str, Any]], reasons: list[str]) -> None:
    """Each floating output's residual against the emulated reference (`err_emulated`,
    `bias_emulated`, `emulated`: the rounding), beside the usual figures."""
    try:
        rule, high = emulate()
    except (Unreplayable, RuntimeError, TypeError, ValueError, IndexError) as e:
        reasons.append(f"emulated reference failed ({str(e)[:120]})")
        return
    for m in metrics:
        dev = device_outputs.get(m["idx"])
        if dev is None or m["idx"] >= len(high) or not dev.is_floating_point():
            continue
        h = high[m["idx"]]
        if not isinstance(h, torch.Tensor) or tuple(h.shape) != tuple(dev.shape):
            continue
        m.update(residual(dev, to_output(h, dev.dtype, rule)))
        m["emulated"] = rule.rounding


def _run_quiet(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return _run(fn, args, kwargs, "emulated reference")


def _all_bit_exact(device_outputs: list[tuple[int, Any]], same: list[torch.Tensor]) -> bool:
    """Whether every device output equals the same-dtype reference (on the host) bit for
    bit; a stored one is settled by its content hash where it can be, else read."""
    if not device_outputs or len(same) < len(device_outputs):
        return False
    for idx, dev in device_outputs:
        if dev is None or idx >= len(same):
            return False
        ref = same[idx]
        if not isinstance(ref, torch.Tensor) or ref.dtype != dev.dtype:
            return False
        if isinstance(dev, StoredOutput):
            proven = dev.same_bits(ref)
            if proven is not None:
                if not proven:
                    return False
                continue
            dev = dev.load()
        if not bit_equal(dev, ref):
            return False
    return True


def schema_dtype(t: Any) -> torch.dtype:
    return dtypes.torch_dtype(t.dtype)


def is_movement(op: str) -> bool:
    """Whether `op` only moves or picks existing values (its reference is exact)."""
    return _is_movement(op)


def _is_movement(op: str) -> bool:
    if op in MOVEMENT:
        return True
    fn = resolve_op(op)
    return fn is not None and lookup_reference(op) is None and not fn._schema.is_mutable and any(
        r.alias_info is not None for r in fn._schema.returns)


def _mutable(op: str) -> bool:
    fn = resolve_op(op)
    return fn is None or fn._schema.is_mutable


def _mismatch(idx: int) -> dict[str, Any]:
    return {"idx": idx, "err_device": math.inf, "err_reference": 0.0, "error_ratio": math.inf,
            "max_abs": math.inf, "cosine": math.nan, "bit_exact": False}


def _host(t: torch.Tensor, contiguous: bool = True) -> torch.Tensor:
    t = t.detach().to("cpu")
    return t.contiguous() if contiguous else t
