"""Which ops a name read from a file may run, and with which arguments: an allow-list.

Replay, the overflow confirmation and `accuracy repro` run ops whose names and arguments come
from a dump, which anyone can craft (its hashes have no key). "Registered in `torch.ops`" is
not enough: `aten.from_file` reads and (with a later `fill_`) writes any file, `c10d.*` opens
sockets, a custom namespace runs whatever its library does, and a walk of attributes from
`torch.ops` (`load_library.__call__.__call__`, `import_module...`) loads libraries and
modules. So a name runs only when all of these hold:

- it is exactly `namespace.op.overload`, three identifiers (`re.fullmatch`: no trailing
  newline, no fourth part to walk further);
- its namespace is `aten` or `prims` (the compute ops Inductor's graphs and eager runs
  call), or it is one of torch's own FSDP2 compute ops (`TORCH_OWN`);
- the dispatcher knows it (`_dispatch_find_schema_or_throw`): TorchScript-only builtins that
  `torch.ops.aten` also resolves (`aten.save`, `aten.manual_seed`, `aten.warn`) are not;
- what `torch.ops` hands back for it is an `OpOverload` with that very schema name;
- it is not in `DENIED` (ops that exist to reach past the tensors: files, the terminal,
  assertions with a message, stream and global-state ops);
- every argument and return type of its schema is a closed type (tensors, numbers, bools,
  dtypes, devices, strings the schema names); an op returning nothing and writing no
  argument exists for its side effect and is refused.

`check_call` then looks at the decoded arguments: a string argument must be one of the words
its parameter takes (`rounding_mode="trunc"`, an einsum equation of index letters), a
Generator argument must be None. Everything else a file holds is data the op's own binding
type-checks.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from accuracy.errors import AccuracyError

OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME = 200
NAMESPACES = frozenset({"aten", "prims"})
# torch's own FSDP2 ops (registered by torch.distributed.fsdp): they copy and concatenate
# the tensors they are given and nothing else; FSDP2 runs record them
TORCH_OWN = frozenset({"fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy",
                       "fsdp.chunk_cat", "fsdp.copy_"})
_WHY = {
    "a file": ("aten.from_file", "aten.save"),
    "the terminal": ("aten._print", "aten.warn"),
    "an assertion's message": ("aten._assert_async", "aten._assert_scalar",
                               "aten._functional_assert_async", "aten._functional_assert_scalar",
                               "aten._assert_tensor_metadata", "aten._linalg_check_errors"),
    "a stream": ("aten.record_stream",),
    "process-wide state": ("aten._cufft_set_plan_cache_max_size", "aten._cufft_clear_plan_cache",
                           "aten.manual_seed", "aten.set_grad_enabled", "aten.backward",
                           "aten._backward", "aten.sym_constrain_range",
                           "aten.sym_constrain_range_for_size", "prims._sink_tokens"),
}
DENIED: dict[str, str] = {op: why for why, ops in _WHY.items() for op in ops}

_ARG_TYPES = frozenset({
    "Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]",
    "Optional[List[Tensor]]", "int", "Optional[int]", "List[int]", "Optional[List[int]]",
    "float", "Optional[float]", "List[float]", "Optional[List[float]]", "bool",
    "Optional[bool]", "List[bool]", "Optional[List[bool]]", "number", "Optional[number]",
    "List[number]", "complex", "Optional[complex]", "Device", "Optional[Device]", "str",
    "Optional[str]", "Generator", "Optional[Generator]"})
_RETURN_TYPES = frozenset({
    "Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]", "int", "float",
    "bool", "number", "complex", "List[int]", "Optional[int]"})
# the words a string parameter of an ATen/prims compute op takes, by parameter name
WORDS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "approximate": ("none", "tanh"),
    "rounding_mode": ("trunc", "floor"),
    "reduce": ("sum", "prod", "mean", "amax", "amin", "add", "multiply", "max", "min"),
    "padding": ("same", "valid"),
    "pad_mode": ("constant", "reflect", "replicate", "circular"),
    "mode": ("constant", "reflect", "replicate", "circular", "reduced", "complete", "r",
             "rand", "randn", "nearest", "nearest-exact", "linear", "bilinear", "bicubic",
             "trilinear", "area"),
    "norm": ("backward", "forward", "ortho"),
    "side": ("left", "right"),
    "padding_side": ("left", "right"),
    "interpolation": ("linear", "lower", "higher", "midpoint", "nearest"),
    "indexing": ("ij", "xy"),
    "UPLO": ("L", "U"),
    "driver": ("gesvd", "gesvdj", "gesvda", "gels", "gelsy", "gelsd", "gelss"),
    "ord": ("fro", "nuc"),
    "p": ("fro", "nuc"),
    "activation": ("relu", "silu"),
}.items()}
_EQUATION = re.compile(r"[A-Za-z.,\- >]{1,256}")  # einsum: index letters, ',', '->', '...'


class RefusedOp(AccuracyError, ValueError):
    """A name or a call read from a file that is not on the allow-list of compute ops."""


class UnknownOp(RefusedOp):
    """A well-formed name this torch does not have."""


def shown(name: Any) -> str:
    """A name from a file, short and printable, for a message."""
    return repr(name)[:80] if not isinstance(name, str) or not OP_NAME.fullmatch(name) \
        else name[:MAX_NAME]


def lookup(name: str) -> Any | None:
    """`aten.addmm.default` -> torch.ops.aten.addmm.default, found without walking any other
    attribute: the dispatcher is asked for the schema first, and only an `OpOverload` of
    that schema is returned. None for anything else (any namespace)."""
    import torch

    if not isinstance(name, str) or len(name) > MAX_NAME or not OP_NAME.fullmatch(name):
        return None
    ns, packet, overload = name.split(".")
    if not _in_dispatcher(ns, packet, overload):
        if ns == "fsdp":  # FSDP2's ops exist once it is imported
            try:
                import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401
            except ImportError:
                return None
        elif ns == "prims":  # Inductor's own prims (fma, low-memory pooling...)
            try:
                import torch._inductor.inductor_prims  # noqa: F401
            except ImportError:
                return None
        if not _in_dispatcher(ns, packet, overload):
            return None
    try:
        op = getattr(getattr(getattr(torch.ops, ns), packet), overload)
    except (AttributeError, RuntimeError):
        return None
    if not isinstance(op, torch._ops.OpOverload) or op._schema.name != f"{ns}::{packet}" \
            or (op._schema.overload_name or "default") != overload:
        return None
    return op


def _in_dispatcher(ns: str, packet: str, overload: str) -> bool:
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"{ns}::{packet}",
                                                "" if overload == "default" else overload)
    except RuntimeError:
        return False
    return True


def compute_op(name: Any) -> Any:
    """The OpOverload a name read from a file stands for, when it is on the allow-list (see
    the module docstring); RefusedOp (UnknownOp for a torch that lacks it) otherwise."""
    if not isinstance(name, str) or len(name) > MAX_NAME:
        raise RefusedOp(f"{shown(name)} is not an op name (namespace.op.overload)")
    op, error, unknown = _compute_op(name)  # replay asks once per row: cached by name
    if op is None:
        raise (UnknownOp if unknown else RefusedOp)(error)
    return op


@functools.lru_cache(maxsize=4096)
def _compute_op(name: str) -> tuple[Any, str, bool]:
    try:
        return _checked_op(name), "", False
    except UnknownOp as e:
        return None, str(e), True
    except RefusedOp as e:
        return None, str(e), False


def _checked_op(name: str) -> Any:
    import torch

    if not isinstance(name, str) or len(name) > MAX_NAME or not OP_NAME.fullmatch(name):
        raise RefusedOp(f"{shown(name)} is not an op name (namespace.op.overload)")
    ns, packet, _ = name.split(".")
    op = lookup(name)  # never walks attributes: safe for any namespace
    if ns not in NAMESPACES and f"{ns}.{packet}" not in TORCH_OWN:
        if op is None:  # a device's own op (npu.npu_rms_norm), or no op at all
            raise UnknownOp(f"{name} is unknown to torch {torch.__version__}")
        raise RefusedOp(f"{name}: only ATen and prims compute ops run from a file (namespace "
                        f"{ns} may open sockets, files or load code)")
    why = DENIED.get(f"{ns}.{packet}")
    if why is not None:
        raise RefusedOp(f"{name} reaches {why}, outside the graph's tensors")
    if op is None:
        raise UnknownOp(f"{name} is unknown to torch {torch.__version__}")
    schema = op._schema
    for a in schema.arguments:
        if str(a.type) not in _ARG_TYPES:
            raise RefusedOp(f"{name} takes {a.name} of type {a.type}, not a tensor, number "
                            "or word")
    for r in schema.returns:
        if str(r.type) not in _RETURN_TYPES:
            raise RefusedOp(f"{name} returns a {r.type}, not tensors or numbers")
    if not schema.returns and not any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments):
        raise RefusedOp(f"{name} returns nothing and writes no tensor: it runs for a side "
                        "effect")
    return op


def check_call(op: Any, args: Any, kwargs: Any) -> None:
    """RefusedOp unless (args, kwargs), decoded from a file, bind to `op`'s schema with every
    string one of the words its parameter takes and every Generator None (tensors and
    numbers are left to the op's own binding)."""
    name = f"{op._schema.name.replace('::', '.')}.{op._schema.overload_name or 'default'}"
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        raise RefusedOp(f"{name}: its arguments are not a list and a table")
    params = op._schema.arguments
    positional = [a for a in params if not a.kwarg_only]
    if len(args) > len(positional):
        raise RefusedOp(f"{name} takes {len(positional)} positional arguments, not {len(args)}")
    by_name = {a.name: a for a in params}
    bound = list(zip(positional, args, strict=False))
    for k, v in kwargs.items():
        if k not in by_name:
            raise RefusedOp(f"{name} has no parameter {shown(k)}")
        bound.append((by_name[k], v))
    for a, v in bound:
        kind = str(a.type)
        if kind in ("str", "Optional[str]"):
            if v is None and kind == "Optional[str]":
                continue
            ok = isinstance(v, str) and (
                v in WORDS.get(a.name, ()) or (a.name == "equation"
                                               and _EQUATION.fullmatch(v) is not None))
            if not ok:
                raise RefusedOp(f"{name}: {a.name}={shown(v)} is not one of the words it takes")
        elif kind in ("Generator", "Optional[Generator]") and v is not None:
            raise RefusedOp(f"{name}: a generator argument runs only as None")
        elif _has_text(v):
            raise RefusedOp(f"{name}: {a.name} is a {kind}, not a text")


def _has_text(v: Any) -> bool:
    """Whether a decoded argument holds a string anywhere (lists are bounded by the reader's
    JSON depth)."""
    if isinstance(v, str):
        return True
    return isinstance(v, list | tuple) and any(_has_text(x) for x in v)
