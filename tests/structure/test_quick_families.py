"""`make test-quick` leaves out the slow families by what a test does
(tests/_support/families.py), so a test that compiles a model
is left out wherever it is written, and everything else runs."""

from __future__ import annotations

import re
from pathlib import Path

from tests._support.families import QUICK_SKIPS, compiles
from tests._support.families_samples import (
    _block_compile,
    _compile_model,
    _eager,
    _runs_a_script,
    _through_a_helper,
)

REPO = Path(__file__).resolve().parents[2]


def test_compiling_is_recognised_through_helpers_scripts_and_methods():
    assert compiles([_compile_model]) and compiles([_through_a_helper])
    assert compiles([_runs_a_script]) and compiles([_block_compile])
    assert not compiles([_eager])


def test_make_test_quick_leaves_out_exactly_the_registered_families():
    makefile = (REPO / "Makefile").read_text()
    quick = re.search(r"^QUICK := (.+)$", makefile, re.M).group(1)
    assert quick == " and ".join(f"not {f}" for f in QUICK_SKIPS)
    assert re.search(r"^test-quick: .*\n\t.*-m \"\$\(QUICK\)\"", makefile, re.M)
    registered = (REPO / "pyproject.toml").read_text()
    for family in QUICK_SKIPS:
        assert f'"{family}: ' in registered, family
