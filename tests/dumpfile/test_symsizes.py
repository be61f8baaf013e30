"""Symbolic sizes as the dump keeps them (accuracy/dumpfile/symsizes.py): text from a file,
evaluated without `eval`, and bound from recorded shapes."""

from __future__ import annotations

import pytest

from accuracy.dumpfile import symsizes


def test_sizes_bind_from_plain_and_linear_dimensions():
    # s0 from a plain dimension, then s1 from s0*s1 (linear once s0 is bound)
    env = symsizes.bind([("s0*s1", 32), ("s0", 2), (64, 64), ("2*s2 + 1", 7)])
    assert env == {"s0": 2, "s1": 16, "s2": 3}
    assert symsizes.evaluate("FloorDiv(s0*s1, 4) + Max(1, s0) - ModularIndexing(s1, 1, 5)",
                             env) == 8 + 2 - 1


def test_a_symbol_no_shape_binds_is_said():
    with pytest.raises(symsizes.Unbound, match="s3"):
        symsizes.evaluate("s0*s3", symsizes.bind([("s0", 2)]))
    assert symsizes.bind([("s0**2", 9)]) == {}  # not linear: not guessed


def test_shapes_that_contradict_the_sizes_are_refused():
    with pytest.raises(ValueError, match="recorded size 5 is not 2 \\* s0"):
        symsizes.bind([("s0", 2), ("2*s0", 5)])


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "s0.real", "[1][0]",
                                  "(lambda: 1)()", "x", "True + s0", "'a' * 3",
                                  "s0" + " + s0" * 600, "(" * 60 + "1" + ")" * 60,
                                  "s0 if 1 else 2"])
def test_anything_but_size_arithmetic_is_refused(text):
    with pytest.raises(ValueError):
        symsizes.evaluate(text, {"s0": 1})
