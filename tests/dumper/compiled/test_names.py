"""Rows of compiled programs carry the eager dump's module paths, so they pair with eager rows
and a culprit is named by the module it is in (issue #26, a stranger's trial):

- `backend="aot_eager"`: forward rows read `OptimizedModule.blocks.0.ln` (the eager dump says
  `Net.blocks.0.ln`), and the whole backward graph took the module of the last forward op
  (`blocks.2`): a wrong backward op of `blocks.1` was blamed on `blocks.2`.
- A compiled function that takes or closes over the model (`step(model, x)`, `G['net']`):
  kernel rows were named relative to the traced variable, with no root class
  (`blocks.0.ln`), and paired with nothing.
- Identical blocks each `.compile()`d share one compiled program: their backward kernels
  were all named after the last block that ran forward.

Each model is compiled once per module, Inductor's cache in the module's temporary folder.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.compare.report import coverage
from accuracy.dumper.compiled.names import RegionCall
from tests.dumper.compiled.test_watch import Block, Net

pytestmark = [pytest.mark.filterwarnings("ignore:Using `torch.compile", "ignore::UserWarning"),
              pytest.mark.timeout(900)]

_BLOCK = re.compile(r"^Net\.blocks\.(\d)")


class MBlock(torch.nn.Module):
    """A residual MLP block: every value a kernel keeps is one eager computes too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class MNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([MBlock() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return torch.tanh(x)


@contextlib.contextmanager
def wrong_mm(nth: int, factor: float = 1.05) -> Iterator[None]:
    """The `nth` CPU `aten.mm` call (from 0) returns its product times `factor`: a wrong
    kernel, seen by the dumper as the op it is (the graph keeps its `mm` node)."""
    calls = [0]
    lib = torch.library.Library("aten", "IMPL")

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = (a[:, :, None] * b[None, :, :]).sum(1)
        calls[0] += 1
        return out * factor if calls[0] - 1 == nth else out

    lib.impl("mm", mm, "CPU")
    try:
        yield
    finally:
        lib._destroy()


def _eager(folder, model, step) -> object:
    path = folder / "eager.h5"
    with dumper(path, mode="tensor"):
        step(model).backward()
    model.zero_grad()
    return path


# -- aot_eager ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def aot(cache):
    """Eager, aot_eager-compiled clean, and compiled with blocks.1.fc1's backward input-grad
    matmul (the third `mm` of the backward: blocks 2, 2, then 1) scaled by 1.05."""
    folder = cache / "aot"
    folder.mkdir()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    eager = _eager(folder, net, lambda m: m(x).sum())
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="aot_eager")
    out = {"eager": eager}
    for name, fault in (("clean", contextlib.nullcontext()), ("fault", wrong_mm(2))):
        out[name] = folder / f"{name}.h5"
        with fault, dumper(out[name], mode="tensor"):
            compiled(x).sum().backward()
        net.zero_grad()
    torch._dynamo.reset()
    return out


def _computed(path) -> list:
    """Rows of ops that compute (not AOTAutograd's detaches and copies)."""
    return [r for r in load_dump(path).records
            if r.op not in ("aten.detach.default", "aten.empty_strided.default",
                            "aten.copy_.default", "aten.expand.default")]


def test_aot_eager_rows_carry_the_eager_dumps_module_paths(aot):
    eager = {(r.phase, r.op, r.module) for r in _computed(aot["eager"])}
    mine = {(r.phase, r.op, r.module) for r in _computed(aot["clean"])}
    assert mine == eager, mine ^ eager
    # gradients accumulate into parameters named as the eager dump names them
    acc = {r.module for r in load_dump(aot["clean"]).records
           if r.phase == "backward" and r.op == "aten.detach.default"}
    assert acc == {f"Net.blocks.{i}.{m}" for i in range(3) for m in ("ln", "fc1")}, acc
    # each backward op is named by the forward node it differentiates, block by block
    back = [r for r in load_dump(aot["clean"]).records if r.phase == "backward"
            and r.op == "aten.gelu_backward.default"]
    assert [r.module for r in back] == ["Net.blocks.2", "Net.blocks.1", "Net.blocks.0"]
    gelu_line = inspect.getsourcelines(Block.forward)[1] + 1  # the line calling gelu
    assert all(r.source.endswith(f"test_watch.py:{gelu_line}") for r in back)


def test_aot_eager_against_eager_has_no_error_and_names_the_wrong_backward_op(aot):
    rep = compare(aot["clean"], aot["eager"])
    assert rep.summary["counts"]["error"] == 0 and rep.culprit is None
    rep = compare(aot["fault"], aot["eager"])
    cul = rep.culprit
    assert cul is not None and cul["op"] == "aten.mm.default"
    assert (cul["module"], cul["phase"]) == ("Net.blocks.1.fc1", "backward")


def test_aot_eager_gradient_sums_take_their_inputs_module(tmp_path):
    """AOTAutograd sums the gradients of a value used twice (a residual) in nodes of its own
    (`is_gradient_acc`: a line, no module): named by their inputs' module, as a pass's
    nodes are, not as the model's root, where they split the backward's module spans."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = MNet(), torch.randn(4, 8)
    try:
        with dumper(tmp_path / "c.h5", mode="statistics"):
            torch.compile(net, backend="aot_eager")(x).sum().backward()
        adds = [r.module for r in load_dump(tmp_path / "c.h5").records
                if r.phase == "backward" and r.op == "aten.add.Tensor"]
        assert adds and all(m.startswith("MNet.blocks.") for m in adds), adds
    finally:
        torch._dynamo.reset()


def test_aot_eager_blocks_sharing_one_program_name_their_own_backward(tmp_path):
    """Per-block `.compile()` with aot_eager: each call's backward ops are named by the
    block whose forward made them (its autograd node), not by the last block."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    try:
        for b in net.blocks:
            b.compile(backend="aot_eager")
        with dumper(tmp_path / "c.h5", mode="statistics"):
            net(x).sum().backward()
        back = [r.module for r in load_dump(tmp_path / "c.h5").records
                if r.phase == "backward" and r.op == "aten.gelu_backward.default"]
        assert back == ["Net.blocks.2", "Net.blocks.1", "Net.blocks.0"], back
    finally:
        for b in net.blocks:
            b._compiled_call_impl = None
        torch._dynamo.reset()


# -- a compiled function that takes or closes over the model --------------------------------

@pytest.mark.parametrize(("call", "spelled", "named"), [
    # the compiled module itself: the region's path
    (RegionCall("Net.blocks.1"), "L['self'].fc1", "Net.blocks.1.fc1"),
    (RegionCall("Llama"), "L['args'][0].model.layers[0]", "Llama.model.layers.0"),
    # a function's argument, global or cell, resolved at the call
    (RegionCall("", "function", {"L['model']": "Net"}), "L['model'].blocks[0]", "Net.blocks.0"),
    (RegionCall("Outer", "function", {"G['net']": "Outer.net"}), "G['net'].fc", "Outer.net.fc"),
    # a module the call could not resolve (a global of an inlined function): its class
    (RegionCall("", "function"), "G['__import_m'].net.fc", "Net.net.fc"),
    # a cached program's variable, unknown at this call: the call's one module of its class
    (RegionCall("", "function", {"L['m']": "Outer.net"}, {"L['m']": "Net"}), "G['n'].fc",
     "Outer.net.fc"),
    # ... and no guess between two
    (RegionCall("", "function", {"L['a']": "A.net", "L['b']": "B.net"},
                {"L['a']": "Net", "L['b']": "Net"}), "G['n'].fc", "Net.fc"),
])
def test_traced_variables_are_named_as_the_eager_dump_names_their_modules(call, spelled, named):
    from accuracy.dumper.compiled.names import split_root

    root, rel = split_root(spelled)
    assert call.module(root, rel, "Net") == named


def test_a_compiled_function_given_a_submodule_names_it_as_the_scope_does(tmp_path):
    """`f(net.blocks[1], x)` after `net` ran in the dumped block: `L['block']` is named as
    the scope named that module object (`Net.blocks.1`), not as a new root `Block`."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)

    @torch.compile(backend="aot_eager")
    def f(block: torch.nn.Module, y: torch.Tensor) -> torch.Tensor:
        return block(y)

    try:
        with dumper(tmp_path / "c.h5", mode="statistics"):
            f(net.blocks[1], net(x))
        mods = [r.module for r in load_dump(tmp_path / "c.h5").records
                if r.op == "aten.addmm.default"]
        assert mods == [f"Net.blocks.{i}.fc1" for i in range(3)] + ["Net.blocks.1.fc1"], mods
    finally:
        torch._dynamo.reset()


_BLOCK1: MBlock | None = None  # the global a compiled function reads (G['_BLOCK1'])


def _global_step(y: torch.Tensor) -> torch.Tensor:
    assert _BLOCK1 is not None
    return _BLOCK1(y)


def _arg_step(block: torch.nn.Module, y: torch.Tensor) -> torch.Tensor:
    return block(y)


def _cache_hits() -> int:
    from torch._dynamo.utils import counters

    return (counters["inductor"]["fxgraph_cache_hit"]
            + counters["aot_autograd"]["autograd_cache_hit"])


@pytest.fixture(scope="module")
def functions(cache):
    """`net(x)` run eagerly, then `net.blocks[1]` called again by a function, eager and
    Inductor-compiled: one function reads the block from a global (compiled first, its rows
    spell the block `G['_BLOCK1']`), the other takes it as an argument and is served the
    first one's program from Inductor's caches (same graph once AOTAutograd renamed its
    inputs), spelled `G['_BLOCK1']`, which this call does not have."""
    global _BLOCK1
    folder = cache / "functions"
    folder.mkdir()
    torch.manual_seed(0)
    net, x = MNet(), torch.randn(4, 8)
    _BLOCK1 = net.blocks[1]
    out = {"eager": _eager(folder, net, lambda m: _arg_step(m.blocks[1], m(x)).sum())}
    hits = {}
    for name, fn in (("global", lambda h: torch.compile(_global_step)(h)),
                     ("arg", lambda h: torch.compile(_arg_step)(net.blocks[1], h))):
        torch._dynamo.reset()
        out[name] = folder / f"{name}.h5"
        before = _cache_hits()
        with dumper(out[name], mode="tensor"):
            fn(net(x)).sum().backward()
        hits[name] = _cache_hits() - before
        net.zero_grad()
    torch._dynamo.reset()
    _BLOCK1 = None
    out["hits"] = hits
    return out


@pytest.mark.parametrize("how", ["global", "arg"])
def test_a_compiled_function_names_kernels_as_the_eager_dump(functions, how):
    """Named `MNet.blocks.1...` as the scope named the block where `net(x)` ran it: by the
    global's variable, and, for the program the caches served, by the call's one argument
    holding a module of the class the program's rows name (not as a new root `MBlock`)."""
    assert (functions["hits"][how] > 0) == (how == "arg"), functions["hits"]
    d = load_dump(functions[how])
    [region] = d.attrs["compiled_regions"]
    assert region["kind"] == "function" and region["status"] == "recorded-compiled"
    eager = {r.module for r in load_dump(functions["eager"]).records}
    kernels = [r for r in d.records if r.op.startswith("inductor.")]
    assert {r.phase for r in kernels} == {"forward", "backward"}
    mods = {o["module"] for r in kernels for o in r.extra["outputs"]}
    assert mods <= eager and any(m.startswith("MNet.blocks.1.") for m in mods), mods
    rep = compare(functions[how], functions["eager"])
    mine, paired = coverage(rep.rows, kernels=True)
    assert paired >= 0.8 * mine, (paired, mine)
    assert rep.summary["counts"]["error"] == 0 and not rep.summary["blind"]


# -- identical blocks compiled in place ----------------------------------------------------

@pytest.fixture(scope="module")
def blocks(cache):
    """Eager, and each of 3 identical blocks `.compile()`d in place (blocks 1 and 2 share a
    compiled program: one compile id)."""
    folder = cache / "blocks"
    folder.mkdir()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    eager = _eager(folder, net, lambda m: m(x).sum())
    torch._dynamo.reset()
    try:
        for b in net.blocks:
            b.compile()
        comp = folder / "compiled.h5"
        with dumper(comp, mode="tensor"):
            net(x).sum().backward()
    finally:
        for b in net.blocks:
            b._compiled_call_impl = None
        torch._dynamo.reset()
    return eager, comp


def test_blocks_sharing_a_compiled_program_name_each_backward_by_its_block(blocks):
    eager, comp = blocks
    back = [r for r in load_dump(comp).records
            if r.op.startswith("inductor.") and r.phase == "backward"]
    kids = {}
    for r in back:
        kids.setdefault(r.extra["kid"], set()).add(_BLOCK.match(r.module).group(1))
    assert any(len(v) > 1 for v in kids.values()), kids  # one launch site, several blocks
    order = [int(_BLOCK.match(r.module).group(1)) for r in back]
    assert order == sorted(order, reverse=True) and set(order) == {0, 1, 2}, order
    rep = compare(comp, eager)
    assert rep.summary["counts"]["error"] == 0
    paired = {_BLOCK.match(r.module).group(1) for r in rep.rows
              if (r.op or "").startswith("inductor.") and r.io == "output"
              and r.phase == "backward" and r.golden_address is not None}
    assert paired == {"0", "1", "2"}, paired
