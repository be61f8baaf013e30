"""Every test file is found from the path of the module it tests (tests/README.md).

`tests/<package>/test_<module>.py` tests `accuracy/<package>/<module>.py` (or the subpackage
`<module>/`), `tests/<package>/test_<package>.py` the package's `__init__.py`, and
`tests/test_<module>.py` a top-level `accuracy/<module>.py`; a suffix names an aspect
(`tests/dumpfile/test_validate_fuzz.py` tests `accuracy/dumpfile/validate.py`). tests/tools/
and tests/benchmarks/ mirror the repository's tools/ and benchmarks/ the same way. Flows
through several packages live in tests/scenarios/, checks of the whole code base in
tests/structure/, shared helpers in tests/_support/ (no tests there).

`python tests/structure/test_layout.py` lists the modules that have no tests file of their own.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FREE = {"scenarios", "structure"}  # test files named for what they check, not for a module
HELPERS = "_support"  # imported by tests, holds none
MIRRORED_ROOTS = {"tools", "benchmarks"}  # tests/<these>/ mirror the repository's folders


def mirrored(test_file: Path, repo: Path = REPO) -> Path | None:
    """The module (or package folder) `test_file` tests by the layout rule, None if none."""
    rel = test_file.relative_to(repo / "tests")
    parts, stem = rel.parts[:-1], rel.stem.removeprefix("test_")
    if parts and parts[0] in MIRRORED_ROOTS:
        folder = repo.joinpath(*parts)
    else:
        folder = repo.joinpath("accuracy", *parts)
    if not folder.is_dir():
        return None
    if parts and (stem == parts[-1] or stem.startswith(parts[-1] + "_")) and (
            folder / "__init__.py").is_file():
        own = folder / "__init__.py"
    else:
        own = None
    # the longest module name the stem starts with: test_<module> or test_<module>_<aspect>
    words = stem.split("_")
    for n in range(len(words), 0, -1):
        name = "_".join(words[:n])
        for cand in (folder / f"{name}.py", folder / name):
            if cand.is_file() or (cand / "__init__.py").is_file():
                return cand
    return own


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def test_every_test_file_mirrors_a_module():
    orphans = []
    for p in _test_files():
        top = p.relative_to(TESTS).parts[0]
        if top in FREE:
            continue
        if top == HELPERS:
            orphans.append(f"{p.relative_to(REPO)}: tests/_support/ holds helpers, no tests")
        elif mirrored(p) is None:
            orphans.append(f"{p.relative_to(REPO)}: no module it mirrors (tests/README.md)")
    assert not orphans, "\n".join(orphans)


def test_every_test_folder_is_a_package():
    """Module basenames repeat across folders (test_core.py, test_cli.py): each folder is a
    package, so pytest imports them as tests.<folder>.<name>."""
    missing = [str(d.relative_to(REPO)) for d in [TESTS, *TESTS.rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").is_file()]
    assert not missing, missing


def test_the_rule_names_the_module_and_refuses_a_stranger():
    t = TESTS
    assert mirrored(t / "dumpfile" / "test_validate.py") == REPO / "accuracy/dumpfile/validate.py"
    assert mirrored(t / "dumpfile" / "test_validate_fuzz.py") == (
        REPO / "accuracy/dumpfile/validate.py")
    assert mirrored(t / "compare" / "test_compiled_align.py") == (
        REPO / "accuracy/compare/compiled_align.py")
    assert mirrored(t / "server" / "routers" / "test_ui.py") == (
        REPO / "accuracy/server/routers/ui.py")
    assert mirrored(t / "native" / "test_native.py") == REPO / "accuracy/native/__init__.py"
    assert mirrored(t / "test_aten.py") == REPO / "accuracy/aten.py"
    assert mirrored(t / "test_cli_errors.py") == REPO / "accuracy/cli.py"
    assert mirrored(t / "tools" / "test_mutate.py") == REPO / "tools/mutate.py"
    assert mirrored(t / "dumpfile" / "test_wrong_answers.py") is None
    assert mirrored(t / "nowhere" / "test_x.py") is None
    assert mirrored(t / "test_conventions.py") is None


def untested_modules() -> list[str]:
    """accuracy's modules that no tests file mirrors (information: many are covered through
    the modules that use them)."""
    covered = {m for p in _test_files() if (m := mirrored(p)) is not None}
    covered |= {m.parent for m in covered if m.name == "__init__.py"}
    out = []
    for mod in sorted((REPO / "accuracy").rglob("*.py")):
        if "__pycache__" in mod.parts or (mod.name.startswith("_") and mod.name != "__init__.py"):
            continue
        if mod.name == "__init__.py":
            if mod in covered or mod.parent in covered or len(mod.read_text().splitlines()) < 15:
                continue
        elif mod in covered:
            continue
        out.append(str(mod.relative_to(REPO)))
    return out


if __name__ == "__main__":
    names = untested_modules()
    print(f"{len(names)} modules without a tests file of their own (tests/README.md):")
    for name in names:
        print(f"  {name}")
    sys.exit(0)
