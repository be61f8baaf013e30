"""msprobe's config.json `list` read into the dumper's op and module patterns."""

from accuracy.debugger.config import split_list
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
