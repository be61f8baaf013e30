"""msprobe's config.json read into the dumper's options (`accuracy/debugger/config.py`): how
a `list` name becomes op patterns and, at L0, a module path."""

from __future__ import annotations

import pytest

from accuracy.debugger.config import build, split_list
from accuracy.errors import UsageError
from accuracy.patterns import op_matches


def test_list_takes_op_names_as_every_other_option_does():
    """`aten.gelu` / `aten::gelu` in an L1 list name that op (as `--op`, `ops=` and
    `sim.fault` take them), not `aten.*aten.gelu*`, which matches nothing; msprobe's API
    names keep their meaning (every ATen op whose name holds the API's)."""
    ops, modules = split_list(["aten.gelu", "aten::native_layer_norm", "Functional.linear",
                               "addmm"], "L1")
    assert modules == ()
    for op in ("aten.gelu.default", "aten.native_layer_norm.default", "aten.linear.default",
               "aten.addmm.default"):
        assert any(op_matches(p, op) for p in ops), (op, ops)
    assert not any(op_matches(p, "aten.gelu_backward.default") for p in ops[:1])


@pytest.mark.parametrize("name,module", [
    ("Module.layers.0.Linear.forward.0", "layers.0"),
    ("Module.encoder.layers.1.linear1.Linear.backward.3", "encoder.layers.1.linear1"),
    ("Module.TinyTransformerLM.forward.0", "TinyTransformerLM"),  # the root module
    ("Module.encoder.layers.1.linear1", "encoder.layers.1.linear1"),  # a path alone
])
def test_l0_list_names_become_their_module_path(name, module):
    assert split_list([name], "L0") == ((), (module,))


@pytest.mark.parametrize("name,alone", [
    ("Module.layers.0.forward.0", "layers.0"),  # once read as its parent, `layers`
    ("Module.encoder.layers.1.linear1.forward.0", "encoder.layers.1.linear1"),
])
def test_an_l0_name_without_its_class_segment_is_refused(name, alone):
    with pytest.raises(UsageError) as e:
        build({"task": "statistics", "level": "L0", "statistics": {"list": [name]}},
              "config c.json")
    msg = str(e.value)
    assert msg.startswith(f"config c.json: list entry {name!r}: ") and "\n" not in msg
    assert "is not a class name" in msg and f"module path alone ({alone!r})" in msg
