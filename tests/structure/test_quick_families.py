"""`make test-quick` leaves out the slow families by what a test does
(tests/_support/families.py), so a test that compiles a model
is left out wherever it is written, and everything else runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests._support import families_samples as samples
from tests._support.families import QUICK_SKIPS, compiles

REPO = Path(__file__).resolve().parents[2]


def test_compiling_is_recognised_through_helpers_scripts_and_methods():
    assert compiles([samples._compile_model]) and compiles([samples._through_a_helper])
    assert compiles([samples._runs_a_script]) and compiles([samples._block_compile])
    assert not compiles([samples._eager])
    # a shared fixture reaching the test module's `make_dumps` (tests/dumper/compiled)
    assert compiles([samples._through_request_module], [vars(samples)])


def test_the_compiled_program_tests_are_left_out_and_fast_tests_stay():
    """The tests of tests/dumper/compiled/ compile through their folder's shared fixtures:
    left out of the quick run (their folder's name, a keyword of every test in it, once hid
    them from the marking); a test there on crafted records, and a test whose module only
    talks about compiling, stay in."""
    llama = "tests/dumper/compiled/test_source_llama.py"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
         "-m", "compiled", llama, "tests/structure/test_quick_families.py"],
        cwd=REPO, capture_output=True, text=True, timeout=240).stdout
    assert f"{llama}::test_clean_llama_against_eager_has_no_error_and_pairs_its_kernels" in out
    assert "never_paired_by_statistics" not in out  # crafted records: no compile
    assert "test_quick_families" not in out, out


def test_make_test_quick_leaves_out_exactly_the_registered_families():
    makefile = (REPO / "Makefile").read_text()
    quick = re.search(r"^QUICK := (.+)$", makefile, re.M).group(1)
    assert quick == " and ".join(f"not {f}" for f in QUICK_SKIPS)
    assert re.search(r"^test-quick: .*\n\t.*-m \"\$\(QUICK\)\"", makefile, re.M)
    registered = (REPO / "pyproject.toml").read_text()
    for family in QUICK_SKIPS:
        assert f'"{family}: ' in registered, family
