"""No module of `accuracy` over MAX_LINES lines (#45): a file that long holds several ideas, and
a reader looking for one has to read them all. Split it along its jobs instead."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "accuracy"
MAX_LINES = 650
# Longer files another branch of #45 splits (the seam helper: compiled/inductor.py); the lead
# empties this list at merge, and a stale entry fails test_known_long_files_are_current.
KNOWN_LONG: list[tuple[str, str]] = []  # (file, why it may stay long); none today


def long_files(limit: int = MAX_LINES) -> dict[str, int]:
    """Every Python file of the package longer than `limit` lines, with its length."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        with path.open("rb") as f:
            n = sum(1 for _ in f)
        if n > limit:
            out[str(path.relative_to(PACKAGE.parent))] = n
    return out


def test_no_module_is_too_long():
    known = {f for f, _ in KNOWN_LONG}
    bad = [f"{f}: {n} lines" for f, n in long_files().items() if f not in known]
    assert not bad, f"modules over {MAX_LINES} lines (split them by job):\n" + "\n".join(bad)


def test_known_long_files_are_current():
    found = long_files()
    for f, why in KNOWN_LONG:
        assert f in found, f"{f} ({why}) is no longer over {MAX_LINES} lines: remove the entry"


def test_the_count_sees_a_long_file():
    assert "accuracy/dumpfile/writer.py" in long_files(100)
