"""Builders of hostile compiled-kernel dumps (issue 44): an Inductor kernel row whose graph
fields (`fused_graph`, `reference`, the old `graph_code` text) say what an attacker wants.

Each takes the good dump of `_crafted.good_dump` (matmul, relu, sum of an 8x8 tensor) and
turns its matmul row into a kernel row `inductor.cpp_fused_mm_0` over buffers `arg0_1` and
`arg1_1`, with the hashes recomputed as anyone can (XXH3 has no key).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests._support import crafted as C

KERNEL = "inductor.cpp_fused_mm_0"
INPUTS = ["arg0_1", "arg1_1"]


def T(i: int) -> dict[str, int]:  # noqa: N802 - the codec's tensor placeholder
    return {"__tensor__": i}


def node(op: Any, args: Any = (), kwargs: Any = None) -> dict[str, Any]:
    """One node of the form, its arguments in the dump's argument encoding."""
    return {"op": op, "args": json.dumps({"args": list(args), "kwargs": kwargs or {}})}


def form(nodes: list[Any], outputs: list[Any] | None = None,
         inputs: list[Any] | None = None) -> dict[str, Any]:
    """A `fused_graph` (or, with `graph`, a replay `reference`) over the two inputs; its
    output is the last node's value unless said."""
    inputs = INPUTS if inputs is None else inputs
    return {"inputs": inputs, "nodes": nodes,
            "outputs": [len(inputs) + len(nodes) - 1] if outputs is None else outputs}


def reference(nodes: list[Any], outputs: list[Any] | None = None) -> dict[str, Any]:
    return {**form(nodes, outputs), "graph": ["given"]}


BENIGN = form([node("aten.mm.default", [T(0), T(1)])])


def kernel_dump(good: Path, dst: Path, **fields: Any) -> Path:
    """`good` with its matmul row made a kernel row whose `extra` also holds `fields`
    (fused_graph, reference, graph_code) as given."""
    extra = {"compiled": "inductor", "kernel": KERNEL.removeprefix("inductor."),
             "graph": "forward", "kid": 1, "inputs": INPUTS,
             "outputs": [{"buffer": "buf0", "node": "mm", "op": "aten.mm.default", "module": "",
                          "source": "", "multi": False, "fused": ["aten.mm.default"]}],
             "fused_ops": ["aten.mm.default"], **fields}

    def edit(f: Any) -> None:
        C.edit_op_texts(f, lambda ops: ops[0].update(op=KERNEL, extra=json.dumps(extra)))
    return C._copy_and_edit(good, dst, edit)


def op_dump(good: Path, dst: Path, op: str, args: list[Any], kwargs: dict | None = None,
            extra: dict | None = None, row: int = 0, pad: int = 0) -> Path:
    """`good` with op row `row` renamed `op` and its recorded arguments `args` (an eager
    row naming what an attacker wants run); `pad` tensor placeholders in a key nobody reads
    make the text's placeholder count match the row's inputs (replay counts them)."""
    call = {"args": args, "kwargs": kwargs or {}, "pad": [T(i) for i in range(pad)]}

    def edit(f: Any) -> None:
        def change(ops: list[dict[str, str]]) -> None:
            ops[row].update(op=op, args=json.dumps(call))
            if extra is not None:
                ops[row]["extra"] = json.dumps(extra)
        C.edit_op_texts(f, change)
    return C._copy_and_edit(good, dst, edit)


def evil_library(folder: Path, mark: Path) -> Path:
    """A shared library whose constructor creates `mark` when it is loaded."""
    src = folder / "evil.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {\n'
                   f'    FILE *f = fopen("{mark}", "w"); if (f) fclose(f);\n}}\n')
    lib = folder / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                   capture_output=True, timeout=60)
    return lib


def evil_module(folder: Path, name: str, mark: Path) -> Path:
    """A module `name` in `folder` that creates `mark` when imported."""
    p = folder / f"{name}.py"
    p.write_text(f"open({str(mark)!r}, 'w').close()\n")
    return p


_HEAD = "def forward(self, arg0_1, arg1_1):\n"
_TAIL = "    mm = torch.ops.aten.mm.default(arg0_1, arg1_1)\n    return (mm,)\n"
# graph text the check before issue 44 (`check_graph_code`) accepted, each running its
# payload when the script it was copied into ran: {mark} a file it creates, {lib} a
# library, {module} a module name
GRAPH_CODE = {
    "attribute_on_torch_ops": _HEAD + "    torch.ops.evil = torch.os\n"
                              "    x = torch.ops.evil.system('touch {mark}')\n" + _TAIL,
    "load_library": _HEAD + "    x = torch.ops.load_library('{lib}')\n" + _TAIL,
    "environ": _HEAD + "    torch.os.environ['TORCHINDUCTOR_CACHE_DIR'] = '{mark}'\n" + _TAIL,
    "decorator": "@torch.os.system\n" + _HEAD + _TAIL,
    "annotation": "def forward(self, arg0_1: torch.ops.import_module('{module}'), arg1_1):\n"
                  + _TAIL,
    "builtins_walk": _HEAD + "    torch.ops.b = torch.os.sys.modules['builtins']\n"
                     "    x = torch.ops.b.exec(\"open('{mark}', 'w').close()\")\n" + _TAIL,
    "globals_walk": _HEAD + "    torch.ops.g = torch.os.sys.modules['__main__']\n"
                    "    x = torch.ops.g.io.open('{mark}', 'w')\n" + _TAIL,
    # registered ops that reach outside the graph: from_file(shared=True) creates the file and
    # a fill_ of its tensor writes it; c10d opens sockets; a custom namespace runs its library
    "from_file": _HEAD + "    x = torch.ops.aten.from_file.default('{mark}', True, 16)\n"
                 "    y = torch.ops.aten.fill_.Scalar(x, 0)\n" + _TAIL,
    "c10d": _HEAD + "    x = torch.ops.c10d.allreduce_.default([arg0_1], None, None, None, "
            "False, -1)\n" + _TAIL,
    "custom_namespace": _HEAD + "    x = torch.ops.accuracy_evil.touch.default(arg0_1, "
                        "arg1_1)\n" + _TAIL,
}
