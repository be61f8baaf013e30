"""What a compare says before its counts about kernels that drew their own random numbers
(`accuracy/compare/checks.py: own_random`), on dumps as the reader gives them."""

from __future__ import annotations

from types import SimpleNamespace

from accuracy.compare.checks import OWN_RANDOM, own_random


def _kernel(name: str, orig: str, ref_ops: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(op=f"inductor.{name}", module="Net.drop", extra={
        "compiled": "inductor",
        "outputs": [{"op": "aten.mul.Tensor", "orig": orig}],
        "reference": {"nodes": [{"op": o} for o in ref_ops]}})


def _dump(random: str | None, *records: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(path="c.h5", attrs={"compiled_random": random}, records=records)


def test_a_dropout_kernel_drawn_with_inductors_generator_is_named():
    d = _dump("inductor", _kernel("cpp_fused_add_0", "aten.add.Tensor"),
              _kernel("cpp_fused_native_dropout_1", "aten.native_dropout.default"),
              _kernel("cpp_fused_2", "aten.mul.Tensor", ("prims.inductor_random.default",)))
    said = own_random(d, "my")
    assert said is not None and OWN_RANDOM in said
    assert said.startswith("my dump c.h5: 2 compiled kernel(s)")
    assert "first: inductor.cpp_fused_native_dropout_1 in Net.drop" in said


def test_kernels_without_random_ops_or_with_eagers_generator_say_nothing():
    plain = _kernel("cpp_fused_add_0", "aten.add.Tensor",
                    ("aten.native_layer_norm.default", "aten.operand.default"))
    assert own_random(_dump("inductor", plain), "my") is None
    drop = _kernel("cpp_fused_native_dropout_1", "aten.native_dropout.default")
    assert own_random(_dump("eager", drop), "my") is None
    assert own_random(_dump(None, drop), "golden") is None
