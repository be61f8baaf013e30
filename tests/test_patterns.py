"""Pattern arguments (accuracy/patterns.py): `--op` takes the names users type."""


def test_op_patterns_take_the_names_users_type():
    """`--op addmm` means the aten op, every overload; globs and other namespaces as written."""
    from accuracy.patterns import op_matches

    assert op_matches("addmm", "aten.addmm.default")
    assert op_matches("aten.addmm", "aten.addmm.default")
    assert op_matches("aten.*norm*", "aten.native_layer_norm.default")
    assert not op_matches("mm", "aten.addmm.default")
    # DebugMode's and the profiler's C++ spelling names the same op
    assert op_matches("aten::addmm", "aten.addmm.default")
    assert not op_matches("aten::mm", "aten.addmm.default")
    assert not op_matches("addmm", "c10d.addmm_.default")
    assert op_matches("c10d.allreduce_", "c10d.allreduce_.default")

