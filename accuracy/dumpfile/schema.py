"""The on-disk layout of a dump: names, table row types and dtype encoding.

One writer and one reader share these definitions, so the format lives in exactly one place.
See docs/dump-format.md for the prose description.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

# Dtype by name lives in dtypes.py (numpy decoding, torch only on request); kept here for callers.
from accuracy.dumpfile.checksum import ATTRS_HASH
from accuracy.dumpfile.dtypes import dtype_name, torch_dtype  # noqa: F401

FORMAT_NAME = "accuracy-dump"
EXTRACT_FORMAT_NAME = "accuracy-extract"  # `accuracy extract` output: plain HDF5 groups
# 2: op rows gained `epoch`; version-1 files read with epoch unknown.
# 3: tensor rows gained `hash` (XXH3-64 of the stored bytes); older files are checked by sum.
# 4: op rows are fixed-size; their text lies in the blob (see optext.py): no HDF5 heap.
# 5: a replay's output row may hold no bytes of its own but the replayed dump's (`IN_SOURCE`);
#    written only by replays that have such rows (schema 4 otherwise).
# 6: tensor rows gained `strided`: a view's row may point into the bytes another row stored
#    (per storage version: a view's elements read through its strides), every file is 6.
SCHEMA_VERSION = 6
SOURCE_ROWS_SCHEMA = 5
STRIDED_SCHEMA = 6
NEWEST_READABLE = STRIDED_SCHEMA
OLDEST_READABLE = 1
# Tensor row offset of a replay output proven bit-identical to the device output it replays:
# its bytes are those the replayed dump (root attribute `replayed_from`, found beside the
# replay) stores at the same address, with the same content hash (see docs/dump-format.md).
IN_SOURCE = -2
# Root attributes that name a file, which some reader opens or stats (`replayed_from`: beside
# the replay; `load_file_path`: shown): checked as path text on open, like any file's data.
PATH_ATTRS = ("replayed_from", "load_file_path")
UNKNOWN_EPOCH = -1  # an op row of a version-1 dump, or one written outside a dumper
# The two-tier flow's selection file (written by `accuracy suspects`, read by dumper(select=))
SELECTION_FORMAT = "accuracy-selection/1"

BLOB = "_data/blob"  # every tensor's bytes, appended (log-structured)
OPS = "_index/ops"  # one row per recorded op
TENSORS = "_index/tensors"  # one row per tensor use (input or output of an op)
BATCHES = "_index/batches"  # schema 3: one row per flush: the rows it made visible, their hash
BATCH_ROW = np.dtype([("ops_end", np.int64), ("tensors_end", np.int64), ("hash", np.uint64)])

INPUT, OUTPUT = 0, 1
IO_NAMES = ("input", "output")

_str = h5py.string_dtype("utf-8")

# The op row since schema 4: numbers only. Its text (op, phase, module, source, stack, call
# arguments, extra: `OP_TEXT_FIELDS`) is one JSON array in the blob at [text, text + text_nbytes).
OP_ROW = np.dtype(
    [
        ("seq", np.int64),
        ("step", np.int32),
        ("n_in", np.int32),
        ("n_out", np.int32),
        ("epoch", np.int32),  # collectives this rank issued before the op (-1 unknown)
        ("text", np.int64),  # blob offset of the op's text
        ("text_nbytes", np.int64),
    ]
)
OP_TEXT_FIELDS = ("op", "phase", "module", "source", "stack", "args", "extra")

# The op row of schema 2-3 files, text in HDF5 variable-length strings; still readable, and the
# shape the reader gives every file's op table once the text is read.
OP_ROW_V3 = np.dtype(
    [
        ("seq", np.int64),
        ("op", _str),
        ("phase", _str),
        ("module", _str),
        ("source", _str),
        ("stack", _str),
        ("args", _str),  # JSON: {"args": [...], "kwargs": {...}} with tensor placeholders
        ("step", np.int32),
        ("n_in", np.int32),
        ("n_out", np.int32),
        ("extra", _str),  # JSON: per-op notes (mutated inputs, injected faults, replay hints)
        ("epoch", np.int32),  # collectives this rank issued before the op (schema 2; -1 unknown)
    ]
)

# The op row of schema-1 files (written before the collective epoch existed): still readable.
OP_ROW_V1 = np.dtype([(n, OP_ROW_V3.fields[n][0]) for n in OP_ROW_V3.names if n != "epoch"])
OP_ROWS = (OP_ROW, OP_ROW_V3, OP_ROW_V1)

MAX_DIMS = 16  # shape and stride are fixed-size: no variable-length strings per tensor row

TENSOR_ROW = np.dtype(
    [
        ("seq", np.int64),
        ("io", np.uint8),
        ("idx", np.int32),
        ("dtype", "S24"),
        ("ndim", np.int8),  # -1: more than MAX_DIMS dims (shape not recorded, no data)
        ("shape", np.int64, (MAX_DIMS,)),
        ("stride", np.int64, (MAX_DIMS,)),
        ("device", "S24"),
        ("offset", np.int64),  # byte offset into BLOB, -1 when the bytes were not stored
        ("nbytes", np.int64),
        ("first", np.int64),  # row holding the bytes: itself, or an earlier row (deduplicated)
        ("min", np.float64),
        ("max", np.float64),
        ("mean", np.float64),
        ("l2", np.float64),
        ("nan_count", np.int64),
        ("inf_count", np.int64),
        ("checksum", np.int64),
        ("hash", np.uint64),  # XXH3-64 of the elements in row-major order (schema 3); 0: none
        # schema 6: 1 when the elements are read through `layout` (element i_0..i_k at
        # offset + itemsize * sum(i_j * layout_j)): each storage version's bytes stored once,
        # a view (or a copy of one) reading them; a link row (first != row) with 1 reads its
        # first row's elements. 0: row-major at [offset, offset + nbytes)
        ("strided", np.int8),
        ("layout", np.int64, (MAX_DIMS,)),  # element strides in the blob (strided rows)
    ]
)
# The tensor row of schema 3-5 files (every row row-major): still readable.
TENSOR_ROW_V5 = np.dtype([(n, TENSOR_ROW.fields[n][0]) for n in TENSOR_ROW.names
                          if n not in ("strided", "layout")])
# The tensor row of schema 1-2 files (no content hash): still readable, checked by the sum.
TENSOR_ROW_V2 = np.dtype([(n, TENSOR_ROW.fields[n][0]) for n in TENSOR_ROW_V5.names
                          if n != "hash"])
TENSOR_ROWS = (TENSOR_ROW, TENSOR_ROW_V5, TENSOR_ROW_V2)

STAT_FIELDS = ("min", "max", "mean", "l2", "nan_count", "inf_count", "checksum")
# Root attribute of a dump whose statistics hold no bit-pattern sum ("omitted"): the dumper's
# tensor dumps, whose stored bytes carry a content hash (the "checksum" column is 0 there and
# the reader leaves it out of each row's statistics).
SUMS_ATTR = "stat_sums"
SUMS_OMITTED = "omitted"


def address(op: str, seq: int, io: int, idx: int) -> str:
    """The Ascend-style address of a tensor: /{op}/{seq}/input/{i}."""
    return f"/{op}/{seq}/{IO_NAMES[io]}/{idx}"


def parse_address(addr: str) -> tuple[str, int, int, int]:
    """Split '/aten.add.Tensor/17/output/0' into (op, seq, io, idx)."""
    parts = addr.strip("/").split("/")
    if len(parts) != 4 or parts[2] not in IO_NAMES:
        raise ValueError(
            f"bad tensor address {addr!r}: expected /<op>/<seq>/input|output/<index>"
        )
    try:
        return parts[0], int(parts[1]), IO_NAMES.index(parts[2]), int(parts[3])
    except ValueError:
        raise ValueError(f"bad tensor address {addr!r}: seq and index must be integers") from None


# -- the names a dump's JSON carries: per-op `extra` keys and root attributes ----------------
#
# Declared here once (name, JSON type, meaning) and read and written through these constants
# by the writer, the recorder and its observers, the reader, compare, replay, overflow and the
# server. The names are what dumps on disk hold: a constant may be renamed, never its value
# (old dumps stay readable); `EXTRA` and `ROOT` list them all (docs/dump-format.md).


@dataclass(frozen=True)
class Field:
    """One name a dump's JSON carries: its JSON type and what it means."""

    name: str
    type: str
    meaning: str


EXTRA: dict[str, Field] = {}  # per-op `extra` keys
ROOT: dict[str, Field] = {}  # root attributes


def _extra(name: str, type_: str, meaning: str) -> str:
    EXTRA[name] = Field(name, type_, meaning)
    return name


def _root(name: str, type_: str, meaning: str) -> str:
    ROOT[name] = Field(name, type_, meaning)
    return name


# what the recorder writes of an eager op
EXTRA_INPLACE = _extra("inplace", "bool", "the op wrote an argument (in-place or out=)")
EXTRA_RNG = _extra("rng", "bool", "the op draws random numbers: not replayed bit-exactly")
EXTRA_UNINITIALIZED = _extra(
    "uninitialized", "bool", "an empty* factory: its outputs are whatever memory held")
EXTRA_UNINITIALIZED_IO = _extra(
    "uninitialized_io", "{input: [int], output: [int]}",
    "tensor uses touching bytes no op has filled since an empty* (dumper/uninit.py): stored "
    "as metadata only, never judged")
EXTRA_WORKSPACE = _extra(
    "workspace", "[int]", "outputs that are a kernel's scratch memory: stored, never judged")
EXTRA_VIEW_OF = _extra(
    "view_of", "{'i<idx>' | 'o<idx>': int}",
    "tensor uses that are strided views of part of a remembered write: the row of that write")
EXTRA_FWD_SEQ = _extra("fwd_seq", "int", "a backward op: the seq of the forward op it "
                       "differentiates")
EXTRA_FAULTS = _extra("faults", "[object]", "sim faults applied while the op ran")
EXTRA_COLLECTIVE = _extra(
    "collective", "object", "a collective's note: kind, reduce op, group, its index in that "
    "group, wait times (dumper/collectives.py)")
EXTRA_RECEIVE_PENDING = _extra(
    "receive_pending", "bool", "a point-to-point receive whose data had not arrived when the "
    "dump closed: its buffers are stored as metadata only (dumper/p2p.py)")
EXTRA_DTENSOR = _extra("dtensor", "[object]", "an op on DTensors: each argument's mesh and "
                       "placements (recorded on the local shards)")
EXTRA_DTENSOR_LOCAL = _extra(
    "dtensor_local", "bool", "DTensor ran the same op on the local shards: replayable on them")
EXTRA_TENSOR_NAMES = _extra(
    "tensor_names", "{input: [str], output: [str]}",
    "a fused/foreach optimizer call: the parameter each tensor belongs to")
EXTRA_OPTIMIZER_STATES = _extra(
    "optimizer_states", "{input: [[str, str] | null], output: [[str, str] | null]}",
    "an optimizer op that writes a state: per input and output, the parameter and the state "
    "('param', 'grad' or the optimizer state's key: 'exp_avg', 'momentum_buffer'...), null "
    "for an intermediate; compare pairs a foreach/fused optimizer with a per-tensor one by them")
EXTRA_QUANT = _extra("quant", "object", "fp8/MX quantisation figures per GEMM operand")
EXTRA_TENSOR_SUBCLASSES = _extra(
    "tensor_subclasses", "[str]", "wrapper tensor subclasses the op took that the dumper "
    "cannot see into")
EXTRA_LOADED = _extra("loaded", "bool", "load mode: the op ran on the golden dump's inputs")
# what the online overflow check writes
EXTRA_OVERFLOW = _extra("overflow", "{kind, born, outputs, contained?}",
                        "check_overflow=True: the birth this row records")
EXTRA_AMP = _extra("amp", "str", "one of GradScaler's own ops: its label")
EXTRA_STEP_SKIPPED = _extra("step_skipped", "bool", "GradScaler's update: it skipped the step")
# what a compiled kernel's row carries (dumper/compiled/source.py)
EXTRA_COMPILED = _extra("compiled", "str", "the row is a compiled kernel's launch: 'inductor'")
EXTRA_KERNEL = _extra("kernel", "str", "the kernel's name in the generated code")
EXTRA_GRAPH = _extra("graph", "str", "the kernel's graph: forward | backward | inference")
EXTRA_FUSED_OPS = _extra("fused_ops", "[str]", "the ATen ops fused into the kernel")
EXTRA_INPUTS = _extra("inputs", "[str]", "the kernel's input buffers ('<buf>_before': the "
                      "value an output buffer held before the launch)")
EXTRA_OUTPUTS = _extra(
    "outputs", "[object]", "per output buffer: its origin node, op, module, source line, "
    "fused ops, orig (the ATen op before decomposition), index, multi, inner")
EXTRA_KID = _extra("kid", "int", "the launch site's id within the recorded process")
EXTRA_FUSED_GRAPH = _extra("fused_graph", "object", "the kernel's fused FX subgraph as data "
                           "(once per launch site): `accuracy repro` prints its script from it")
EXTRA_REFERENCE = _extra("reference", "object", "the kernel's ATen ops for replay (once per "
                         "launch site)")
EXTRA_GRAPH_CODE = _extra("graph_code", "str", "written by older versions for "
                          "`accuracy repro`: never run, refused")
# what a replay writes on each replayed row
EXTRA_REPLAY = _extra("replay", "object", "a replay's row: its status, reason and figures")

# root attributes
ROOT_FORMAT = _root("format", "str", "accuracy-dump (or accuracy-extract)")
ROOT_SCHEMA_VERSION = _root("schema_version", "int", "the layout's version (SCHEMA_VERSION)")
ROOT_COMPLETE = _root("complete", "bool", "closed cleanly: every op up to the end is in")
ROOT_MODE = _root("mode", "str", "tensor | statistics (a replay: tensor | metrics)")
ROOT_STAT_SUMS = _root(SUMS_ATTR, "str", "'omitted': statistics hold no bit-pattern sum")
ROOT_RANK = _root("rank", "int", "the rank that wrote the file")
ROOT_WORLD_SIZE = _root("world_size", "int", "ranks in the job")
ROOT_LOCAL_RANK = _root("local_rank", "int", "LOCAL_RANK, -1 when unset")
ROOT_PROCESS_GROUP = _root("process_group", "object", "the default process group")
ROOT_TORCH_VERSION = _root("torch_version", "str", "torch.__version__")
ROOT_ACCURACY_VERSION = _root("accuracy_version", "str", "accuracy.__version__")
ROOT_PYTHON_VERSION = _root("python_version", "str", "platform.python_version()")
ROOT_CREATED = _root("created", "str", "when the file was started (ISO 8601, UTC)")
ROOT_HOST = _root("host", "str", "the machine's name")
ROOT_RANKS_RECORDED = _root("ranks_recorded", "[int] | 'all'", "dumper(ranks=)")
ROOT_CHECK_OVERFLOW = _root("check_overflow", "bool", "dumper(check_overflow=True)")
ROOT_SELECT = _root("select", "str", "dumper(select=): the selection file, '' for none")
ROOT_FILTER = _root("filter", "object", "the dumper's ops/exclude_ops/modules/io/phases/steps")
ROOT_BACKEND = _root("backend", "str", "the backend the ops ran on (sim, cuda, npu...)")
ROOT_BACKEND_VERSION = _root("backend_version", "str", "its version")
ROOT_DEVICES = _root("devices", "[str]", "the device types the tensors were on")
ROOT_PROFILE = _root("profile", "str", "sim: the numerics profile")
ROOT_SIM = _root("sim", "object", "sim: its description")
ROOT_FAULTS_APPLIED = _root("faults_applied", "[object]", "sim: the faults applied")
ROOT_OPS_RECORDED = _root("ops_recorded", "int", "op rows written")
ROOT_OPS_SEEN = _root("ops_seen", "int", "calls the dumper numbered (recorded or not)")
ROOT_STEPS = _root("steps", "[int]", "the steps recorded")
ROOT_OPS_NOT_RECORDED = _root("ops_not_recorded", "{count, first}",
                              "calls an observer failed on: left unrecorded")
ROOT_HOPS_NOT_RECORDED = _root("higher_order_ops_not_recorded", "{name: int}",
                               "higher-order ops run with their ops unseen")
ROOT_COLLECTIVES = _root("collectives", "int", "collectives this rank issued")
ROOT_RECEIVES_PENDING = _root(
    "receives_pending", "[{seq, peer, tag}]", "point-to-point receives still pending when the "
    "dump closed: what they received is not in the dump")
ROOT_PROCESS_GROUPS = _root("process_groups", "object", "each group's description")
ROOT_DEVICE_MESHES = _root("device_meshes", "[object]", "the DTensor meshes seen")
ROOT_COMPILED_WATCH = _root("compiled_watch", "str", "'on', or why compiled regions could "
                            "not be watched")
ROOT_COMPILED_REGIONS = _root("compiled_regions", "[object]", "each compiled region entered "
                              "and how it ran (dumper/compiled/watch.py)")
ROOT_COMPILED_KERNELS_RECORDED = _root("compiled_kernels_recorded", "int",
                                       "kernel launches recorded")
ROOT_COMPILED_RANDOM = _root("compiled_random", "str", "whose generator compiled kernels "
                             "drew random numbers with: eager | inductor")
ROOT_COMPILED_KERNELS_NOT_RECORDED = _root(
    "compiled_kernels_not_recorded", "{count, kernels, why}",
    "launch sites generated without a recording hook")
ROOT_LOAD_FILE_PATH = _root("load_file_path", "str", "load mode: the golden dump")
ROOT_OPS_LOADED = _root("ops_loaded", "int", "load mode: ops fed golden inputs")
ROOT_QUANT_OPS = _root("quant_ops", "int", "ops with quantisation figures")
ROOT_TENSOR_SUBCLASSES = _root("tensor_subclasses", "{type: int}",
                               "wrapper subclasses the dumper cannot see into, and their ops")
ROOT_OVERFLOW = _root("overflow", "object", "check_overflow=True: the check's summary and "
                      "its events (records.OverflowFinding without confirmation)")
ROOT_BYTES_WRITTEN = _root("bytes_written", "int", "tensor bytes stored")
ROOT_BYTES_LINKED = _root("bytes_linked", "int", "tensor bytes shared with earlier rows")
ROOT_ATTRS_HASH = _root(ATTRS_HASH, "uint64", "XXH3-64 of the other root attributes, written "
                        "at close (checksum.attrs_hash, which leaves this one out): checked on "
                        "open")
# a replay's file
ROOT_REPLAYED_FROM = _root("replayed_from", "str", "a replay: the dump it replayed")
ROOT_REFERENCE = _root("reference", "str", "a replay: the reference device")
ROOT_UPCAST = _root("upcast", "str", "a replay: fp64 | fp32 | none")
ROOT_SOURCE_BACKEND = _root("source_backend", "str", "a replay: the replayed dump's backend")
ROOT_SOURCE_PROFILE = _root("source_profile", "str", "a replay: the replayed dump's profile")
ROOT_OPS_OK = _root("ops_ok", "int", "a replay: ops replayed")
ROOT_OPS_SKIPPED = _root("ops_skipped", "int", "a replay: ops not replayed")
ROOT_OPS_FAILED = _root("ops_failed", "int", "a replay: ops that failed")
# an extract file
ROOT_SOURCE_DUMP = _root("source_dump", "str", "an extract: the dump it was taken from")
