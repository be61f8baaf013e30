"""What we know about ops, in one registry the dumper, replay, compare and overflow all read.

Like torch/utils/flop_counter.py's registry, facts are keyed by the op (here its recorded name,
`aten.mm.default`), and users extend them with `register`. The name sets are plain strings, so
`import accuracy.aten` imports no torch (the torch-free compare reads them); what needs a live
op (`plan_of`, `written_ids`, `resolve_op`) imports torch inside the function.

`plan_of(func)` answers every question the dump loop asks about an op once per op overload
(an `OpPlan`), so the per-op hot path does no string work and no schema walks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# -- name facts (plain strings) ------------------------------------------------------------

# Outputs of these are uninitialised memory: never stored, never compared.
UNINITIALISED: set[str] = {
    "aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
    "aten.new_empty.default", "aten.new_empty_strided.default", "aten.empty.out",
}
# The same, by prefix, for names of any overload (what compare matches a recorded op with).
UNINITIALISED_PREFIXES = ("aten.empty", "aten.new_empty")

# These read only their input's shape, dtype and device, never its values (a `*_like`
# factory, autograd's `ones_like(loss)` seed): an inf in the input does not reach them.
READS_NO_VALUES_PREFIXES = ("aten.empty", "aten.new_", "aten.ones_like", "aten.zeros_like",
                            "aten.full_like", "aten.rand_like", "aten.randn_like",
                            "aten.randint_like")

# Views whose output, when it shares the input's memory from the same offset, holds exactly
# the input's elements: same statistics, no new computation. (Memory is checked each time: a
# device or a sim fault may return fresh data from a "view".)
SAME_ELEMENTS: set[str] = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.detach.default", "aten.alias.default", "aten.t.default", "aten.transpose.int",
    "aten.permute.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.unsqueeze.default", "aten.flatten.using_ints", "aten._reshape_alias.default",
    "aten.lift_fresh.default",
}
# ...and of these, a contiguous output also has the input's bytes in the same order.
SAME_BYTES: set[str] = SAME_ELEMENTS - {"aten.t.default", "aten.transpose.int",
                                        "aten.permute.default"}

# Ops that only move or copy values: a reference run is exact by construction (replay skips
# the upcast run). Views are found from the schema.
MOVEMENT: set[str] = {
    "aten.clone.default", "aten.cat.default", "aten.stack.default", "aten._unsafe_view.default",
    "aten.index_select.default", "aten.gather.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.expand_copy.default",
    "aten.t_copy.default", "aten.permute_copy.default", "aten.view_copy.default",
    # zeros plus the input's values, or a choice between existing values: also exact
    "aten.select_backward.default", "aten.slice_backward.default",
    "aten.threshold_backward.default", "aten.relu.default",
}

# Prefixes (any overload) of ops returning an alias of input 0, and of in-place ops whose
# result does not depend on input 0's values (they overwrite it): what compare needs to follow
# uninitialised memory through a dump without torch.
ALIAS_PREFIXES = ("aten.detach.", "aten.alias.", "aten.view.", "aten._reshape_alias.",
                  "aten.as_strided.", "aten.t.", "aten.transpose.")
# Prefixes of ops whose output is a view of part or all of input 0's elements (a compiled
# run's strided view of a kernel output pairs with the eager run's view of the same value).
VIEW_PREFIXES = ALIAS_PREFIXES + (
    "aten.select.", "aten.slice.", "aten.permute.", "aten.expand.", "aten.unsqueeze.",
    "aten.squeeze.", "aten.narrow.", "aten.diagonal.", "aten._unsafe_view.", "aten.reshape.",
    "aten.unfold.", "aten.split.", "aten.split_with_sizes.", "aten.unbind.", "aten.chunk.",
    "aten.flatten.", "aten.movedim.", "aten.swapaxes.", "aten.unflatten.")
OVERWRITE_PREFIXES = tuple(f"aten.{n}_" for n in (
    "zero", "fill", "normal", "uniform", "random", "bernoulli", "exponential", "geometric",
    "log_normal", "cauchy", "copy"))

# GradScaler's deliberate non-finite checks: labelled in overflow reports, never culprits.
AMP_CHECK_OPS = frozenset({
    "aten._amp_foreach_non_finite_check_and_unscale_.default",
    "aten._amp_non_finite_check_and_unscale_.default",
})
AMP_UPDATE_OP = "aten._amp_update_scale_.default"
AMP_OPS = AMP_CHECK_OPS | {AMP_UPDATE_OP}
# The labels overflow reports give them, and the births they make harmless.
HANDLED = "handled by loss scaling"
# A collective whose output holds inf/nan that this rank's inputs did not: another rank's, or
# the reduction's own overflow (an fp16 all-reduce sum); the other ranks' reports tell which.
FROM_COLLECTIVE = ("through a collective: another rank's inf/nan, or the reduction's own "
                   "overflow; look at the other ranks' births first")


def loss_scaled(phase: str, reads_scale: bool) -> bool:
    """Whether an overflow born in a step GradScaler skipped is the loss scaling's own: in
    backward (scaled gradients), or an op reading the scale (the scaled loss). An overflow
    of the forward pass is the model's, skipped step or not."""
    return phase == "backward" or reads_scale
AMP_CHECK = "GradScaler non-finite check (deliberate, not a culprit)"
AMP_UPDATE = "GradScaler scale update (deliberate, not a culprit)"


def amp_label(op: str) -> str:
    """The label for one of GradScaler's own ops ('' for any other op)."""
    if op in AMP_CHECK_OPS:
        return AMP_CHECK
    if op == AMP_UPDATE_OP:
        return AMP_UPDATE
    return ""

# Collectives: the namespaces that communicate, their ops that only synchronise or re-wrap,
# and base op name (no namespace, no overload) -> what the collective computes.
COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd",
                                   "c10d_functional"})
COLLECTIVE_WAITS = frozenset({"wait_tensor", "_wrap_tensor_autograd"})
COLLECTIVE_KINDS: dict[str, str] = {
    **dict.fromkeys(("allreduce_", "allreduce_coalesced_", "all_reduce", "all_reduce_",
                     "all_reduce_coalesced", "all_reduce_coalesced_"), "all_reduce"),
    **dict.fromkeys(("allgather_", "_allgather_base_", "allgather_coalesced_",
                     "allgather_into_tensor_coalesced_", "all_gather_into_tensor",
                     "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced"),
                    "all_gather"),
    **dict.fromkeys(("reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor",
                     "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_out"),
                    "reduce_scatter"),
    **dict.fromkeys(("broadcast_", "broadcast"), "broadcast"),
    **dict.fromkeys(("barrier", "monitored_barrier_"), "barrier"),
    # point-to-point: a send's data is its input; a receive writes its input buffers when the
    # user's wait returns (accuracy/dumper/p2p.py records it then)
    "send": "send",
    **dict.fromkeys(("recv_", "recv_any_source_"), "recv"),
}
P2P_KINDS = frozenset({"send", "recv"})

_FACT_SETS = {"uninitialised": UNINITIALISED, "same_elements": SAME_ELEMENTS,
              "same_bytes": SAME_BYTES, "movement": MOVEMENT}

# -- memory filled later (FSDP2, collectives) ------------------------------------------------
# Uninitialised memory stays "not data" (never stored, never judged) until an op fills it
# (accuracy/dumper/uninit.py). Ops that return a buffer they fill only in part: these output
# indices keep whatever the buffer's other bytes held (FSDP2's all_gather_copy_in copies this
# rank's shard into the all-gather buffer; the all-gather fills the rest). Extend with
# `register(name, partly_filled=(i, ...))`.
PARTLY_FILLED_OUTPUTS: dict[str, tuple[int, ...]] = {
    "fsdp.all_gather_copy_in.default": (1,),
}


def _overwritten_slots(func: Any, name: str) -> tuple[tuple[int, str, bool], ...]:
    """The written arguments an op overwrites without reading them: `out=` arguments
    (keyword-only) and the targets of fill/copy/random ops (OVERWRITE_PREFIXES)."""
    slots = _written_slots(func)
    if name.rsplit(".", 1)[0] in OVERWRITE_PREFIXES:
        return slots
    return tuple(s for s in slots if s[2])


def overwritten_ids(plan: OpPlan, args: tuple, kwargs: dict) -> set[int]:
    """ids of the tensors an op overwrites without reading them (`plan.overwrites`)."""
    return _written(plan.overwrites, args, kwargs) if plan.overwrites else set()


def _aliasing_returns(func: Any) -> bool:
    """Whether any return aliases an argument (a view, or an in-place op's `Tensor(a!)`)."""
    return any(r.alias_info is not None for r in func._schema.returns)


def register(name: str, **facts: Any) -> None:
    """Teach the registry about an op (e.g. a custom op that only moves data):
    `register("mylib.gather_rows.default", movement=True)`. Facts: uninitialised,
    same_elements, same_bytes, movement; True adds the op, False removes it.
    `workspace_outputs=(3,)`: those outputs are scratch memory, never judged (() removes).
    `partly_filled=(1,)`: output 1 is a buffer the op fills only in part (() removes it)."""
    for fact, value in facts.items():
        if fact == "workspace_outputs":
            _register_workspace(name, value)
            continue
        if fact == "partly_filled":
            if value:
                PARTLY_FILLED_OUTPUTS[name] = tuple(int(i) for i in value)  # type: ignore[union-attr]
            else:
                PARTLY_FILLED_OUTPUTS.pop(name, None)
            continue
        names = _FACT_SETS.get(fact)
        if names is None:
            raise ValueError(f"unknown op fact {fact!r}: one of "
                             f"{sorted([*_FACT_SETS, 'workspace_outputs', 'partly_filled'])}")
        if value:
            names.add(name)
        else:
            names.discard(name)
    _PLANS.clear()


def is_collective(name: str) -> bool:
    """Whether a recorded op name (`c10d.allreduce_.default`) is a collective or a wait."""
    return name.split(".", 1)[0] in COLLECTIVE_NAMESPACES


def collective_kind(func: Any) -> str | None:
    """"wait" for a synchronising op, the collective kind ("all_reduce", ..., "other") for
    one that communicates, None for any other op."""
    if getattr(func, "namespace", "") not in COLLECTIVE_NAMESPACES:
        return None
    base = func._schema.name.split("::", 1)[-1]
    if base in COLLECTIVE_WAITS:
        return "wait"
    return COLLECTIVE_KINDS.get(base, "other")


# -- live ops (torch imported inside) ------------------------------------------------------


def resolve_op(name: str) -> Any | None:
    """`aten.addmm.default` -> torch.ops.aten.addmm.default, or None if this torch lacks it.
    Exactly three identifiers, looked up in the dispatcher, never an attribute walk (a name
    may come from a file: accuracy/safeops.py); what runs from a file goes through
    `safeops.compute_op`, the allow-list."""
    from accuracy.safeops import lookup

    return lookup(name)


def _written_slots(func: Any) -> tuple[tuple[int, str, bool], ...]:
    return tuple((pos, a.name, a.kwarg_only) for pos, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def written_ids(func: Any, args: tuple, kwargs: dict) -> set[int]:
    """ids of the tensors an in-place or out= op writes (its `Tensor(a!)` arguments)."""
    plan = _PLANS.get(func)
    slots = plan.writes if plan is not None else _written_slots(func)
    return _written(slots, args, kwargs)


def _written(slots: tuple[tuple[int, str, bool], ...], args: tuple, kwargs: dict) -> set[int]:
    import torch

    ids: set[int] = set()
    for pos, name, kwarg_only in slots:
        value = args[pos] if not kwarg_only and pos < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            ids.add(id(value))
        elif isinstance(value, list | tuple):
            ids.update(id(v) for v in value if isinstance(v, torch.Tensor))
    return ids


def is_view(func: Any) -> bool:
    """True when the op returns a view of an input (an alias it does not write)."""
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


def is_rng(func: Any) -> bool:
    """Whether the op draws random numbers (its output depends on the generator state)."""
    import torch

    return torch.Tag.nondeterministic_seeded in func.tags


@dataclass(frozen=True, slots=True)
class OpPlan:
    """Everything the dump loop asks about one op overload, answered once."""

    name: str
    aten: bool  # namespace "aten": its in-place writes bump version counters
    mutable: bool  # schema writes an argument (in-place or out=)
    writes: tuple[tuple[int, str, bool], ...]  # (position, name, kwarg_only) of written args
    view: bool
    rng: bool
    uninitialised: bool
    same_elements: bool
    same_bytes: bool
    collective: str | None  # collective_kind
    amp: bool  # one of GradScaler's own ops
    # memory filled later (dumper/uninit.py)
    overwrites: tuple[tuple[int, str, bool], ...] = ()  # written args not read first
    partly_filled: tuple[int, ...] = ()  # outputs that are buffers filled only in part
    alias_outputs: bool = False  # a return aliases an argument (view or in-place)


_PLANS: dict[Any, OpPlan] = {}


def plan_of(func: Any) -> OpPlan:
    """The `OpPlan` of an op overload (cached: one schema walk per overload per process)."""
    plan = _PLANS.get(func)
    if plan is None:
        name = str(func)
        plan = _PLANS[func] = OpPlan(
            name=name, aten=func.namespace == "aten", mutable=func._schema.is_mutable,
            writes=_written_slots(func), view=is_view(func), rng=is_rng(func),
            uninitialised=name in UNINITIALISED, same_elements=name in SAME_ELEMENTS,
            same_bytes=name in SAME_BYTES, collective=collective_kind(func),
            amp=name in AMP_OPS, overwrites=_overwritten_slots(func, name),
            partly_filled=PARTLY_FILLED_OUTPUTS.get(name, ()),
            alias_outputs=_aliasing_returns(func))
    return plan


# -- workspaces and reserves (not data) ----------------------------------------------------

# Outputs that are a kernel's private scratch memory (oneDNN/cuDNN/MIOpen RNN workspaces and
# reserves, fused attention's RNG seed/offset and debug mask): op name -> output indices as
# the dump numbers them (tensor outputs in order; SymInt returns and undefined tensors, such as
# dense attention's cum_seq_q/k, take no index). Their bytes are stored (a backward kernel may
# need them to replay) but are never compared, replayed or judged: two honest runs hold
# different bytes there. Extend with `register(name, workspace_outputs=(3,))`.
WORKSPACE_OUTPUTS: dict[str, frozenset[int]] = {
    "aten.mkldnn_rnn_layer.default": frozenset({3}),
    "aten._cudnn_rnn.default": frozenset({3}),
    "aten.miopen_rnn.default": frozenset({3}),
    # (output, logsumexp, [cum_seq_q, cum_seq_k: undefined when dense], rng_state / philox
    # seed, unused / philox offset, debug_attn_mask): never output 0 or 1, whichever layout
    "aten._scaled_dot_product_flash_attention.default": frozenset({2, 3, 4}),
    "aten._scaled_dot_product_cudnn_attention.default": frozenset({2, 3, 4}),
    "aten._scaled_dot_product_fused_attention_overrideable.default": frozenset({2, 3, 4}),
    "aten._scaled_dot_product_efficient_attention.default": frozenset({2, 3}),
    "aten._flash_attention_forward.default": frozenset({2, 3, 4}),
    "aten._efficient_attention_forward.default": frozenset({2, 3}),
}
WORKSPACE_REASON = "kernel workspace (scratch memory, not data): not compared"


def workspace_outputs(name: str) -> frozenset[int]:
    """Output positions of `name` (a recorded op name) that are workspaces, not data."""
    return WORKSPACE_OUTPUTS.get(name, frozenset())


def _register_workspace(name: str, positions: Any) -> None:
    if positions:
        WORKSPACE_OUTPUTS[name] = frozenset(int(p) for p in positions)
    else:
        WORKSPACE_OUTPUTS.pop(name, None)


# -- ops that return nothing and write their arguments (fused/foreach optimizers) ------------

def returns_nothing(func: Any) -> bool:
    """Whether the op returns no value and writes arguments instead (`_fused_adamw_`,
    `_foreach_add_`): the tensors it wrote are its outputs."""
    return not func._schema.returns and bool(_written_slots(func))


def written_tensors(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors an op writes, in schema order, lists flattened (`_fused_adamw_`: every
    parameter, then every gradient, exp_avg, exp_avg_sq...). Output i of such an op is
    item i here, in the dump, in `sim` faults and in replay alike."""
    import torch

    plan = _PLANS.get(func)
    slots = plan.writes if plan is not None else _written_slots(func)
    out: list[Any] = []
    for pos, name, kwarg_only in slots:
        value = args[pos] if not kwarg_only and pos < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


# -- intended non-finite values (attention masks) ------------------------------------------

# Ops that write a constant from an argument: name prefix -> (position, name) of that value.
# A fill of +-inf, or of a value at least half the format's largest (finfo.min masks), makes
# intended values: masks, never an overflow birth.
FILL_VALUE_ARGS: dict[str, tuple[int, str]] = {
    "aten.full.": (1, "fill_value"), "aten.full_like.": (1, "fill_value"),
    "aten.new_full.": (2, "fill_value"), "aten.fill.": (1, "value"),
    "aten.fill_.": (1, "value"), "aten.masked_fill.": (2, "value"),
    "aten.masked_fill_.": (2, "value"), "aten.scalar_tensor.": (0, "s"),
    "aten.where.ScalarOther": (2, "other"), "aten.where.ScalarSelf": (1, "self"),
}
# Ops that only shape, cut, copy or combine a mask: their output is still the mask (a causal
# mask's triu, its expand to the batch, its cast to the model's dtype).
MASK_SHAPING_PREFIXES = (
    "aten.triu", "aten.tril", "aten.expand", "aten._to_copy.", "aten.to.", "aten.clone.",
    "aten.contiguous.", "aten.slice.", "aten.select.", "aten.unsqueeze.", "aten.squeeze.",
    "aten.view.", "aten._unsafe_view.", "aten.reshape.", "aten.detach.", "aten.alias.",
    "aten.permute.", "aten.transpose.", "aten.t.", "aten.repeat.", "aten.cat.",
    "aten.stack.", "aten.copy_.", "aten.masked_fill", "aten.where.", "aten.lift_fresh",
    "aten.index.", "aten.minimum.", "aten.maximum.", "aten.logical_", "aten.bitwise_",
)
INTENDED = "intended (a mask's -inf / finfo.min fill and its propagation), not an overflow"
_FORMAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38, "float32": 3.4028e38,
               "float64": 1.7977e308}


def _extreme(value: Any, dtype: str | None) -> bool:
    if isinstance(value, dict) and "__float__" in value:  # the dump's encoding of inf/nan
        value = value["__float__"]
    if isinstance(value, str):
        return value in ("inf", "-inf")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if value in (float("inf"), float("-inf")):
        return True
    top = _FORMAT_MAX.get((dtype or "").removeprefix("torch."))
    return top is not None and abs(value) >= 0.5 * top


def intended_fill(name: str, args: Any, kwargs: Any, dtype: str | None) -> bool:
    """Whether this call fills with +-inf or a near-limit value (a mask), from its arguments
    (live values or a dump's decoded JSON); `dtype` is the output's dtype name."""
    for prefix, (pos, arg) in FILL_VALUE_ARGS.items():
        if name.startswith(prefix):
            value = args[pos] if pos < len(args) else (kwargs or {}).get(arg)
            return _extreme(value, dtype)
    return False


def shapes_mask(name: str) -> bool:
    """Whether the op's output is still its (intended) mask input, reshaped or combined."""
    return name.startswith(MASK_SHAPING_PREFIXES)
