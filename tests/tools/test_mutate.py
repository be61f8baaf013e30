"""What CI's mutation run selects (tools/mutate.py --ci): every mutant not killed on what it
covers today always, the rest in turns, so CI stays within its time while every mutant still
runs every few days; and what a run notes as killed."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
sys.modules["mutate_tool"] = mutate
_spec.loader.exec_module(mutate)


def _mutants(root: Path, n: int) -> list:
    ms = []
    for i in range(n):
        (root / f"accuracy/f{i}.py").write_text(f"x = {i}\n")
        (root / f"tests/test_{i}.py").write_text(f"def t():\n    assert {i}\n")
        ms.append(mutate.Mutant(f"m{i}", f"accuracy/f{i}.py", f"x = {i}", "x = -1",
                                (f"tests/test_{i}.py::t",), ""))
    return ms


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "accuracy").mkdir()
    (tmp_path / "tests").mkdir()
    return tmp_path


def test_a_rule_whose_file_or_tests_changed_since_its_kill_always_runs(tmp_path):
    root = _tree(tmp_path)
    ms = _mutants(root, 10)
    record = tmp_path / "killed.json"
    assert mutate.record_kills([(m, "killed") for m in ms], record, root) == 10
    (root / "accuracy/f3.py").write_text("x = 3  # edited\n")
    (root / "tests/test_7.py").write_text("def t():\n    assert 7 == 7\n")
    seen: set[str] = set()
    for day in range(4):
        picked, _ = mutate.ci_selection(ms, mutate.load_record(record), 4, day, root)
        names = [m.name for m in picked]
        assert "m3" in names and "m7" in names  # the file, and the tests, changed
        assert len(names) < len(ms)
        seen |= set(names)
    assert seen == {m.name for m in ms}  # four days cover every mutant


def test_a_survivor_or_a_changed_definition_is_not_counted_as_killed(tmp_path):
    root = _tree(tmp_path)
    ms = _mutants(root, 3)
    record = tmp_path / "killed.json"
    mutate.record_kills([(m, "killed") for m in ms], record, root)
    mutate.record_kills([(ms[0], "SURVIVED")], record, root)  # a later run: it survived
    redefined = mutate.Mutant("m1", ms[1].file, ms[1].original, "x = 0", ms[1].tests, "")
    picked, why = mutate.ci_selection([ms[0], redefined, ms[2]], mutate.load_record(record),
                                      4, 1, root)
    assert [m.name for m in picked][:2] == ["m0", "m1"] and "2 not killed" in why


def test_without_a_record_every_mutant_runs(tmp_path):
    root = _tree(tmp_path)
    ms = _mutants(root, 5)
    (tmp_path / "killed.json").write_text("{not json")
    picked, why = mutate.ci_selection(ms, mutate.load_record(tmp_path / "killed.json"), 4, 0,
                                      root)
    assert picked == ms and why.startswith("5 not killed")


def test_every_mutant_in_the_list_still_applies():
    """The list is in step with the code: CI's partial runs would not notice a stale one."""
    for m in mutate.load_mutants():
        mutate.check_applies(m, ROOT)


def test_every_mutant_names_tests_that_exist():
    """Each test id of the list names a file and a test function in it: a test moved or renamed
    leaves no mutant whose run finds nothing (tools/retarget_tests.py maps old ids)."""
    import ast
    import re

    defined: dict[str, set[str]] = {}
    stale = []
    for m in mutate.load_mutants():
        for node in m.tests:
            path, _, rest = node.partition("::")
            if not (ROOT / path).is_file():
                stale.append(f"{m.name}: {node} (no such file)")
                continue
            if path not in defined:
                tree = ast.parse((ROOT / path).read_text())
                defined[path] = {n.name for n in ast.walk(tree)
                                 if isinstance(n, ast.FunctionDef | ast.ClassDef)}
            name = re.split(r"[\[:]", rest, maxsplit=1)[0]
            if rest and name not in defined[path]:
                stale.append(f"{m.name}: {node} (no such test)")
    assert not stale, "\n".join(stale)
