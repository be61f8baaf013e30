"""A dump must never become code (issue 44): `accuracy repro` prints its script from a
validated form, and every path that runs ops named by a dump (replay of eager rows and of
kernel references, the overflow confirmation) runs only allow-listed ATen/prims compute ops.

Before: `repro` copied the dump's graph text into the script after a check that a crafted
text passed (attribute assignment on `torch.ops`, `load_library`, `torch.os`, decorators,
annotations, a walk to builtins or `__main__`); replay and the overflow confirmation resolved
any dotted name by walking attributes from `torch.ops` (`load_library.__call__.__call__`
loaded a library, `import_module...` imported a module) and ran `aten.from_file`, collectives
and custom namespaces. Each payload here creates a marker file when it runs.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accuracy import load_dump
from accuracy.errors import UsageError
from tests._support import crafted as C
from tests._support import hostile_kernels as K
from tests._support.hostile_kernels import BENIGN, T, form, node, reference

MARK = "PWNED"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return C.good_dump(tmp_path_factory.mktemp("good") / "good.h5")


@pytest.fixture(scope="module")
def benign_script(good, tmp_path_factory) -> str:
    """The script of the benign kernel, as `repro` writes it."""
    from accuracy.repro.script import write_repro

    folder = tmp_path_factory.mktemp("benign")
    write_repro(K.kernel_dump(good, folder / "k.h5", fused_graph=BENIGN), K.KERNEL,
                folder / "repro.py")
    return (folder / "repro.py").read_text()


def _cli(args: list[str], capsys) -> tuple[int, str]:
    from accuracy.cli import main

    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out + out.err


def _run_script(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=script.parent,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "TORCHINDUCTOR_CACHE_DIR": str(script.parent / "cache")})


def _chain(n: ast.AST) -> list[str]:
    out = []
    while isinstance(n, ast.Attribute):
        out.append(n.attr)
        n = n.value
    return [n.id, *out[::-1]] if isinstance(n, ast.Name) else ["?"]


def _ours(chain: list[str]) -> bool:
    """`torch.ops.<aten|prims>.<op>.<overload>`, or `torch.<dtype, memory format, layout>`
    or `torch.device`."""
    if chain[:1] != ["torch"]:
        return False
    if len(chain) == 5:
        return chain[1] == "ops" and chain[2] in ("aten", "prims")
    return len(chain) == 2 and (chain[1] == "device" or isinstance(
        getattr(torch, chain[1], None), torch.dtype | torch.memory_format | torch.layout))


def forward_is_ours(text: str) -> None:
    """The script's `forward` holds only what graphform prints: assignments of `vN` to a
    call of `torch.ops.<aten|prims>.<op>.<overload>` or an index into a value, and a return
    of a tuple of values; literals are numbers, words, dtypes, devices."""
    tree = ast.parse(text)
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    assert not fn.decorator_list and not fn.args.defaults and not fn.args.kw_defaults
    assert all(a.annotation is None for a in fn.args.args) and fn.returns is None
    *body, ret = fn.body
    assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple)
    for st in body:
        assert isinstance(st, ast.Assign) and len(st.targets) == 1
        assert isinstance(st.targets[0], ast.Name) and st.targets[0].id[1:].isdigit()
        v = st.value
        assert isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Constant) or \
            isinstance(v, ast.Call) and len(_chain(v.func)) == 5 and _ours(_chain(v.func)), \
            ast.dump(v)
    allowed = (ast.Assign, ast.Return, ast.Tuple, ast.List, ast.Call, ast.Attribute,
               ast.Name, ast.Constant, ast.Subscript, ast.UnaryOp, ast.USub, ast.keyword,
               ast.Dict, ast.Load, ast.Store, ast.arguments, ast.arg, ast.FunctionDef)
    for n in ast.walk(fn):
        assert isinstance(n, allowed), ast.dump(n)
        if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
            raise AssertionError(ast.dump(n))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            assert n.func.id in ("float", "complex") and all(
                isinstance(a, ast.Constant | ast.UnaryOp) for a in n.args), ast.dump(n)
        elif isinstance(n, ast.Call):
            assert _ours(_chain(n.func)), ast.dump(n)
        if isinstance(n, ast.Name):
            assert n.id in ("torch", "float", "complex") or n.id[1:].isdigit(), n.id


# -- the script is printed from the validated form -----------------------------------------


def test_repro_prints_the_benign_kernel_and_the_script_runs_clean(good, tmp_path):
    from accuracy.repro.script import write_repro

    dump = K.kernel_dump(good, tmp_path / "k.h5", fused_graph=BENIGN)
    r = write_repro(dump, K.KERNEL, tmp_path / "repro.py")
    text = (tmp_path / "repro.py").read_text()
    assert r.outputs == 1 and "    v2 = torch.ops.aten.mm.default(v0, v1)\n" in text
    forward_is_ours(text)
    run = _run_script(tmp_path / "repro.py")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "recorded vs graph run eagerly 0" in run.stdout and "no divergence" in run.stdout
    assert not list(tmp_path.glob(".repro.py.*"))  # no temporary left beside it


def test_literals_are_printed_by_our_own_spelling(good, tmp_path):
    """Numbers, words, dtypes, devices, memory formats and non-finite floats of a real form
    come out as our spelling of the validated values."""
    from accuracy.repro import graphform

    nodes = [node("aten.div.Tensor_mode", [T(0), T(1)], {"rounding_mode": "floor"}),
             node("aten._to_copy.default", [T(2)],
                  {"dtype": {"__dtype__": "bfloat16"}, "device": {"__device__": "cpu"},
                   "memory_format": {"__memory_format__": "torch.contiguous_format"}}),
             node("aten.clamp.default", [T(3), {"__float__": "-inf"}, {"__float__": "nan"}]),
             node("aten.einsum.default", ["ij,jk->ik", [T(0), T(1)]]),
             node("aten.var_mean.correction", [T(0), [1]], {"correction": 0, "keepdim": True}),
             node("getitem", [T(6), 1])]
    g = graphform.validate(form(nodes), 1)
    text = graphform.python(g)
    assert "rounding_mode='floor'" in text and "dtype=torch.bfloat16" in text
    assert "device=torch.device('cpu')" in text
    assert "memory_format=torch.contiguous_format" in text
    assert "(v3, -float('inf'), float('nan'))" in text and "'ij,jk->ik', [v0, v1]" in text
    assert "    v7 = v6[1]\n" in text and "correction=0, keepdim=True" in text
    forward_is_ours(text)
    compile(text, "forward", "exec")


# -- graph text of older dumps: refused, never run -----------------------------------------


def _payload(name: str, folder: Path) -> str:
    mark = folder / MARK
    lib = K.evil_library(folder, mark) if "{lib}" in K.GRAPH_CODE[name] else ""
    module = f"evil_{name}"
    K.evil_module(folder, module, mark)
    return K.GRAPH_CODE[name].format(mark=mark, lib=lib, module=module)


def _repro_or_run(dump: Path, out: Path) -> str | None:
    """`repro`'s refusal, or None when it wrote a script (which is then run)."""
    from accuracy.repro.script import write_repro

    try:
        write_repro(dump, K.KERNEL, out)
    except UsageError as e:
        assert not out.exists()
        return str(e)
    _run_script(out)
    return None


@pytest.mark.parametrize("payload", sorted(K.GRAPH_CODE))
def test_graph_text_is_never_copied_into_the_script(payload, good, benign_script, tmp_path):
    """A dump holding only the old graph text is refused with a line saying to record
    again; one holding the text beside a valid form gets the benign form's very script."""
    text = _payload(payload, tmp_path)
    old = K.kernel_dump(good, tmp_path / "old.h5", graph_code=text)
    why = _repro_or_run(old, tmp_path / "repro.py")
    assert not (tmp_path / MARK).exists(), "the dump's graph text ran"
    assert why is not None and "record the step again" in why and "\n" not in why
    from accuracy.repro.script import write_repro

    both = tmp_path / "both"
    both.mkdir()
    K.kernel_dump(good, both / "k.h5", graph_code=text, fused_graph=BENIGN)
    write_repro(both / "k.h5", K.KERNEL, both / "repro.py")
    # the text changed nothing: the very script of the benign form, which runs clean
    # (test_repro_prints_the_benign_kernel_and_the_script_runs_clean)
    assert (both / "repro.py").read_text() == benign_script
    assert not (tmp_path / MARK).exists()


@pytest.mark.parametrize("text", ["(" * 10_000 + ")" * 10_000, ["def forward(self): pass"],
                                  {"code": 1}, 5])
def test_graph_text_of_any_shape_is_one_line(text, good, tmp_path, capsys):
    """Graph text nested 10,000 deep was a MemoryError traceback (ast.parse), a list a
    TypeError traceback."""
    dump = K.kernel_dump(good, tmp_path / "k.h5", graph_code=text)
    rc, out = _cli(["repro", str(dump), "--kernel", K.KERNEL, "-o", str(tmp_path / "r.py")],
                   capsys)
    assert rc == 2 and out.startswith("accuracy repro: error:") and out.count("\n") == 1, out
    assert "record the step again" in out and not (tmp_path / "r.py").exists()


# -- hostile forms: refused in one line, nothing written, nothing run ------------------------


@pytest.fixture(scope="module")
def evil_namespace(tmp_path_factory):
    """A custom op registered in this process that creates a marker when it runs."""
    folder = tmp_path_factory.mktemp("evilns")

    @torch.library.custom_op("accuracy_evil::touch", mutates_args=())
    def touch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        (folder / MARK).touch()
        return x @ y

    return folder / MARK


def _hostile_forms(folder: Path) -> dict[str, tuple[object, str]]:
    """name -> (a fused_graph, a fragment of its refusal)."""
    secret = C.outside_file(folder)
    mark = folder / MARK
    lib = K.evil_library(folder, mark)
    K.evil_module(folder, "evil_form", mark)
    mm = node("aten.mm.default", [T(0), T(1)])
    one = {
        "load_library_walk": (node("load_library.__call__.__call__", [str(lib)]),
                              "unknown to torch"),
        "import_module_walk": (node("import_module.__call__.__call__", ["evil_form"]),
                               "unknown to torch"),
        "class_walk": (node("__class__.__init__.__globals__", []), "unknown to torch"),
        "fourth_part": (node("aten.mm.default.__call__", [T(0), T(1)]), "not an op name"),
        "trailing_code": (node("aten.mm.default\nimport os", [T(0), T(1)]),
                          "not an op name"),
        "from_file": (node("aten.from_file.default", [str(secret), False, 16]), "a file"),
        "from_file_creates": (node("aten.from_file.default", [str(mark), True, 16]), "a file"),
        "from_file_out": (node("aten.from_file.out", [str(secret), False, 16], {"out": T(0)}),
                          "a file"),
        "c10d": (node("c10d.allreduce_.default", [[T(0)], None, None, None, 0]),
                 "namespace c10d"),
        "functional_collective": (node("_c10d_functional.all_reduce.default",
                                       [T(0), "sum", "0"]), "namespace _c10d_functional"),
        "custom_namespace": (node("accuracy_evil.touch.default", [T(0), T(1)]),
                             "namespace accuracy_evil"),
        "profiler": (node("profiler._record_function_enter_new.default", ["x", None]),
                     "namespace profiler"),
        "print": (node("aten._print.default", ["hello"]), "the terminal"),
        "jit_builtin_save": (node("aten.save.default", [T(0), str(mark)]), "a file"),
        "assert_message": (node("aten._assert_async.msg", [T(0), "x"]), "assertion"),
        "side_effect_only": (node("aten._propagate_xla_data.default", [T(0), T(1)]),
                             "side effect"),
        "storage_argument": (node("aten.set_.source_Storage", [T(0), T(1)]),
                             "type Storage"),
        "text_for_a_tensor": (node("aten.mul.Tensor", [T(0), f"__import__('os').system("
                                                            f"'touch {mark}')"]),
                              "not a text"),
        "word_not_taken": (node("aten.div.Tensor_mode", [T(0), T(1)],
                                {"rounding_mode": "'); __import__('os'); ('"}),
                           "not one of the words"),
        "einsum_with_code": (node("aten.einsum.default", ["ij);import os;(", [T(0), T(1)]]),
                             "not one of the words"),
        "kwarg_not_a_parameter": (node("aten.mm.default", [T(0)],
                                       {"mat2=__import__('os'),x": T(1)}), "no parameter"),
        "dtype_by_attribute": (node("aten._to_copy.default", [T(0)],
                                    {"dtype": {"__dtype__": "_dynamo"}}), "is not known"),
        "device_text": (node("aten._to_copy.default", [T(0)],
                             {"device": {"__device__": "cpu') or print('x') or ('"}}),
                        "bad recorded argument"),
        "repr_argument": (node("aten.mul.Tensor", [T(0), {"__repr__": "os.system('x')"}]),
                          "recorded only as"),
        "dict_argument": (node("aten.mul.Tensor", [T(0), {"a": 1, "b": 2}]), "holds a dict"),
        "forward_placeholder": (node("aten.mm.default", [T(0), T(7)]), "out of range"),
        "integer_past_64_bits": (node("aten.mul.Tensor", [T(0), 2 ** 70]), "past 64 bits"),
        "huge_list": (node("aten.view.default", [T(0), list(range(5000))]), "4096 items"),
        "nested_list": (node("aten.view.default", [T(0), [[[[1]]]]]), "nested"),
        "getitem_of_text": (node("getitem", [T(0), "__class__"]), "getitem"),
        "sym_expression_code": ({"op": "sym", "expr": "__import__('os').system('x')"},
                                "size"),
        "args_nested_10000": ({"op": "aten.mm.default", "args": "[" * 10_000 + "]" * 10_000},
                              "nested deeper"),
        "args_not_text": ({"op": "aten.mm.default", "args": [T(0), T(1)]}, "not text"),
        "op_not_text": (node(5, [T(0), T(1)]), "not an op name"),
        "node_not_a_table": (7, "not a table"),
    }
    out: dict[str, tuple[object, str]] = {k: (form([mm, v] if k != "forward_placeholder"
                                                    else [v]), why)
                                          for k, (v, why) in one.items()}
    out.update({
        "form_is_a_list": ([1, 2], "not a table"),
        "nodes_is_text": ({"inputs": K.INPUTS, "nodes": "x", "outputs": [2]}, "lacks"),
        "input_name_not_text": (form([mm], inputs=[0, 1]), "input name"),
        "output_not_an_index": (form([mm], outputs=["x"]), "output value"),
        "output_past_the_values": (form([mm], outputs=[9]), "output value"),
        "outputs_count": (form([mm], outputs=[2, 2]), "2 outputs"),
        "input_not_recorded": (form([mm], inputs=["arg0_1", "nope"]), "not recorded"),
        "too_many_nodes": (form([mm] * 2001), "nodes"),
    })
    return out


def test_every_hostile_form_is_refused_in_one_line(good, tmp_path, capsys, evil_namespace):
    cases = _hostile_forms(tmp_path)
    for name, (bad, why) in cases.items():
        dump = K.kernel_dump(good, tmp_path / f"{name}.h5", fused_graph=bad)
        out = tmp_path / f"{name}.py"
        rc, text = _cli(["repro", str(dump), "--kernel", K.KERNEL, "-o", str(out)], capsys)
        assert rc == 2 and text.startswith("accuracy repro: error:"), (name, text)
        assert text.count("\n") == 1, (name, text)
        assert why in text, (name, text)
        assert "TOP-SECRET" not in text and not out.exists(), name
    assert not (tmp_path / MARK).exists() and not evil_namespace.exists()
    assert not list(tmp_path.glob(".*.partial"))


# -- replay and the overflow confirmation run allow-listed compute ops only ------------------


def _replayed(dump: Path, out: Path, seq: int = 0) -> dict:
    from accuracy.replay import replay

    replay(dump, out)
    with load_dump(out) as r:
        return r.record(seq).extra["replay"]


@pytest.mark.parametrize("case", ["load_library_walk", "import_module_walk", "from_file",
                                  "from_file_creates", "custom_namespace", "c10d", "print",
                                  "word_not_taken", "text_for_a_tensor"])
def test_replay_refuses_a_hostile_kernel_reference(case, good, tmp_path, monkeypatch,
                                                   evil_namespace):
    """Replay of a kernel row re-runs its reference: a crafted one loaded a library
    (`load_library.__call__.__call__`), imported a module, read a file (`aten.from_file`)
    and ran a custom op; now it is refused before anything runs."""
    monkeypatch.syspath_prepend(str(tmp_path))  # where the module `import_module` finds
    bad, why = _hostile_forms(tmp_path)[case]
    dump = K.kernel_dump(good, tmp_path / "k.h5", reference={**bad, "graph": ["given"]})
    rp = _replayed(dump, tmp_path / "r.h5")
    assert rp["status"] == "skipped" and why in rp["reason"], rp
    assert not (tmp_path / MARK).exists() and not evil_namespace.exists()
    assert "TOP-SECRET" not in json.dumps(rp)


def test_replay_of_a_benign_kernel_reference_still_runs(good, tmp_path):
    dump = K.kernel_dump(good, tmp_path / "k.h5", reference=reference(BENIGN["nodes"]))
    rp = _replayed(dump, tmp_path / "r.h5")
    assert rp["status"] == "ok" and rp["outputs"][0]["reference"] == "given", rp


@pytest.mark.parametrize("op,args,kwargs,why", [
    ("aten.from_file.default", ["{secret}", False, 16], {}, "reaches a file"),
    ("accuracy_evil.touch.default", [T(0), T(1)], {}, "namespace accuracy_evil"),
    ("import_module.__call__.__call__", ["evil_eager"], {}, "unknown to torch"),
    ("aten.div.Tensor_mode", [T(0), T(1)], {"rounding_mode": "'); import os; ('"},
     "not one of the words"),
])
def test_replay_refuses_an_eager_row_naming_a_hostile_op(op, args, kwargs, why, good,
                                                         tmp_path, monkeypatch,
                                                         evil_namespace):
    """An eager row is re-run by its name: `aten.from_file` read any file into the replay,
    a custom namespace ran its op (a walk out of torch.ops crashed replay)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    K.evil_module(tmp_path, "evil_eager", tmp_path / MARK)
    secret = C.outside_file(tmp_path)
    args = [str(secret) if a == "{secret}" else a for a in args]
    pad = 2 - json.dumps(args).count("__tensor__")  # the row's two inputs
    dump = K.op_dump(good, tmp_path / "e.h5", op, args, kwargs, pad=pad)
    rp = _replayed(dump, tmp_path / "r.h5")
    assert rp["status"] == "skipped" and why in rp["reason"], rp
    assert "not run from a file" in rp["reason"] or "unknown" in rp["reason"], rp
    assert not (tmp_path / MARK).exists() and not evil_namespace.exists()


def test_the_overflow_confirmation_runs_no_hostile_op(tmp_path, capsys):
    """`accuracy overflow --confirm-on cpu` re-runs each birth op by its name: a birth row
    renamed `load_library.__call__.__call__` loaded the attacker's library."""
    from accuracy import dumper

    path = tmp_path / "o.h5"
    with dumper(path, mode="tensor"):
        torch.full((4,), 1e38) * 10  # the birth of inf: a mul
    mark = tmp_path / MARK
    lib = K.evil_library(tmp_path, mark)
    with load_dump(path) as d:
        birth = next(r.seq for r in d.records if r.op == "aten.mul.Tensor")
    crafted = K.op_dump(path, tmp_path / "c.h5", "load_library.__call__.__call__", [str(lib)],
                        row=birth)
    rc, out = _cli(["overflow", str(crafted), "--confirm-on", "cpu"], capsys)
    assert not mark.exists(), "the crafted op ran"
    assert rc in (0, 1) and "unknown to torch" in out, out


# -- the allow-list itself -------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "aten.mm.default", "aten.mul.Tensor", "prims.convert_element_type.default", "prims.fma.default",
    "aten.native_layer_norm.default", "aten._fused_adamw_.default", "aten.__and__.Scalar",
    "aten.scatter_reduce.two", "aten.einsum.default", "fsdp.chunk_cat.default",
])
def test_compute_ops_are_allowed(name):
    from accuracy import safeops

    assert safeops.compute_op(name)._schema.name.replace("::", ".") == name.rsplit(".", 1)[0]


@pytest.mark.parametrize("name,why", [
    ("load_library.__call__.__call__", "unknown to torch"),
    ("aten.from_file.default", "a file"), ("aten.save.default", "a file"),
    ("aten.manual_seed.default", "process-wide state"),
    ("c10d.allreduce_.default", "namespace c10d"),
    ("_c10d_functional.all_reduce.default", "namespace _c10d_functional"),
    ("profiler._record_function_enter_new.default", "namespace profiler"),
    ("aten._propagate_xla_data.default", "side effect"),
    ("aten._validate_compressed_sparse_indices.default", "side effect"),
    ("aten.set_.source_Storage", "Storage"), ("aten.qscheme.default", "returns a QScheme"),
    ("aten.len.str", "unknown"),  # a TorchScript builtin, not a dispatcher op
    ("aten.mm.default\n", "not an op name"), ("aten.mm", "not an op name"),
    ("aten.no_such_op.default", "unknown"),
])
def test_other_ops_are_refused(name, why):
    from accuracy import safeops

    with pytest.raises(safeops.RefusedOp, match=why):
        safeops.compute_op(name)


def test_string_and_generator_arguments_are_closed():
    from accuracy import safeops

    x = torch.ones(2)
    safeops.check_call(torch.ops.aten.gelu.default, [x], {"approximate": "tanh"})
    safeops.check_call(torch.ops.aten.div.Tensor_mode, [x, x], {"rounding_mode": None})
    safeops.check_call(torch.ops.aten.einsum.default, ["i,i->", [x, x]], {})
    safeops.check_call(torch.ops.aten.bernoulli.p, [x, 0.5], {"generator": None})
    for op, args, kwargs, why in [
            (torch.ops.aten.gelu.default, [x], {"approximate": "/etc/passwd"}, "words"),
            (torch.ops.aten.bernoulli.p, [x, 0.5], {"generator": torch.Generator()},
             "generator"),
            (torch.ops.aten.mul.Tensor, [x, ["a"]], {}, "not a text"),
            (torch.ops.aten.mul.Tensor, [x, x, x], {}, "positional"),
            (torch.ops.aten.mul.Tensor, [x], {"nope": x}, "no parameter")]:
        with pytest.raises(safeops.RefusedOp, match=why):
            safeops.check_call(op, args, kwargs)


def test_resolve_op_never_walks_attributes():
    """`resolve_op` handed back whatever `getattr` found: a bound method of `torch.ops`,
    a module's globals."""
    from accuracy.aten import resolve_op

    for name in ("load_library.__call__.__call__", "import_module.__call__.__call__",
                 "__class__.__init__.__globals__", "aten.mm.default.__call__"):
        assert resolve_op(name) is None, name
    assert resolve_op("aten.mm.default") is torch.ops.aten.mm.default


def test_a_dtype_name_is_looked_up_not_reached_as_an_attribute(monkeypatch):
    """A dtype name from a file was an attribute of the `torch` module, whose `__getattr__`
    imports submodules by name (`_dynamo`, `onnx`)."""
    from accuracy.dumpfile.dtypes import torch_dtype

    assert torch_dtype("bfloat16") is torch.bfloat16 and torch_dtype("half") is torch.half
    asked: list[str] = []
    monkeypatch.setattr(torch, "__getattr__", lambda name: asked.append(name), raising=False)
    for name in ("_dynamo", "__builtins__", "ops", "float32.__class__", "_no_such_module", 5):
        with pytest.raises(ValueError, match="dtype"):
            torch_dtype(name)
    assert asked == []


def test_a_failed_write_leaves_no_partial_script(good, tmp_path, monkeypatch):
    from accuracy.repro import script as repro

    dump = K.kernel_dump(good, tmp_path / "k.h5", fused_graph=BENIGN)

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(repro.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        repro.write_repro(dump, K.KERNEL, tmp_path / "repro.py")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.h5"]


@pytest.mark.parametrize("expr", [
    "__import__('os').system('x')", "s0.__class__", "(" * 60 + "s0" + ")" * 60,
    "Abs(1, 2)", "FloatTrueDiv(1, 0)", "OpaqueUnaryFn_sqrt(-1)", "9**64**64", "s0" * 400,
    "lambda: 1", "[s0 for s0 in s1]", "s0 if s1 else s2", "Mod(s0, 0)", "CeilDiv(s0, 0)",
])
def test_symbolic_size_text_is_arithmetic_or_a_value_error(expr):
    """A kernel reference's size expressions are evaluated by symsizes' own walk: anything
    but integer arithmetic over sizes is a ValueError, never another exception."""
    from accuracy.dumpfile import symsizes

    with pytest.raises(ValueError):
        symsizes.evaluate(expr, {"s0": 3, "s1": 0, "s2": 2})
