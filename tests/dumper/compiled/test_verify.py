"""A launch site's description is trusted only for the kernel its module really defines: the
digest taken at code generation against the definition in the file the running module came
from (read with `ast`, never run)."""

from __future__ import annotations

from accuracy.dumper.compiled import verify

BODY = "async_compile.cpp_pybinding(['const float*', 'float*'], r'''\nvoid kernel() {}\n''')"
OTHER = "async_compile.cpp_pybinding(['const float*', 'float*'], r'''\nvoid kernel() {x;}\n''')"


def _module(tmp_path, body: str) -> dict:
    path = tmp_path / "cabc.py"
    path.write_text(f"import os\n\ncpp_fused_add_0 = {body}\n\n\ndef call(args):\n    pass\n")
    return {"__file__": str(path)}


def test_the_definition_the_module_runs_matches_its_generated_digest(tmp_path):
    assert verify.mismatch("cpp_fused_add_0", verify.digest(BODY), _module(tmp_path, BODY)) \
        is None


def test_another_source_is_named_with_both_digests(tmp_path):
    why = verify.mismatch("cpp_fused_add_0", verify.digest(OTHER), _module(tmp_path, BODY))
    assert why is not None and verify.digest(OTHER) in why and verify.digest(BODY) in why


def test_a_kernel_the_module_does_not_define_is_not_trusted(tmp_path):
    why = verify.mismatch("cpp_fused_mul_1", verify.digest(BODY), _module(tmp_path, BODY))
    assert why is not None and "does not define it" in why


def test_no_digest_or_no_source_file_is_not_trusted(tmp_path):
    assert "no digest" in verify.mismatch("cpp_fused_add_0", "", _module(tmp_path, BODY))
    assert "no source file" in verify.mismatch("cpp_fused_add_0", verify.digest(BODY), {})
    gone = {"__file__": str(tmp_path / "gone.py")}
    assert "cannot be read" in verify.mismatch("cpp_fused_add_0", verify.digest(BODY), gone)


def test_a_rewritten_module_file_is_read_again(tmp_path):
    g = _module(tmp_path, BODY)
    assert verify.mismatch("cpp_fused_add_0", verify.digest(BODY), g) is None
    _module(tmp_path, OTHER + "  ")  # another size: not the cached digests
    assert verify.mismatch("cpp_fused_add_0", verify.digest(BODY), g) is not None
