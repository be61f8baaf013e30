"""What CI's mutation run selects (tools/mutate.py --ci): a change's own rules always, the
rest in turns, so CI stays within its time while every mutant still runs every few days."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
sys.modules["mutate_tool"] = mutate
_spec.loader.exec_module(mutate)


def _mutants(n: int) -> list:
    return [mutate.Mutant(f"m{i}", f"accuracy/f{i}.py", "a", "b", (f"tests/test_{i}.py::t",),
                          "") for i in range(n)]


def test_a_changed_rule_always_runs_and_the_rest_rotate_over_the_days():
    ms = _mutants(10)
    changed = {"accuracy/f3.py", "tests/test_7.py"}
    seen: set[str] = set()
    for day in range(4):
        picked, _ = mutate.ci_selection(ms, changed, 4, day)
        names = [m.name for m in picked]
        assert "m3" in names and "m7" in names  # the file, and the tests, changed
        assert len(names) < len(ms)
        seen |= set(names)
    assert seen == {m.name for m in ms}  # four days cover every mutant


def test_without_a_known_baseline_every_mutant_runs():
    ms = _mutants(5)
    picked, why = mutate.ci_selection(ms, None, 4, 0)
    assert picked == ms and "every mutant" in why


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
