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



def test_a_name_matching_nothing_lists_the_closest_names_first():
    """The 'matches nothing' line every command prints shows the right spelling first."""
    from accuracy.patterns import closest, no_op_message, unmatched_ops

    ops = ["aten.gt.Scalar", "aten.addmm.default", "aten.gelu_backward.default",
           "aten.gelu.default", "aten.native_layer_norm.default"]
    assert closest("aten.gleu", ops)[:2] == ["aten.gelu.default", "aten.gelu_backward.default"]
    assert closest("aten::layernorm", ops)[0] == "aten.native_layer_norm.default"
    assert closest("encoder.layer.2", ["M.decoder", "M.encoder.layers.2"])[0] == \
        "M.encoder.layers.2"
    assert unmatched_ops(["aten.gelu", "aten::addmm", "gleu", "aten.*norm*"], ops) == ["gleu"]
    msg = no_op_message("gleu", ops, "run.h5")
    assert "'gleu'" in msg and "run.h5" in msg and "\n" not in msg
    assert msg.index("aten.gelu.default") < msg.index("aten.addmm.default")
