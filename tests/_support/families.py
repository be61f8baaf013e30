"""The test families `make test-quick` leaves out, recognised by what a test does rather than
by a list of files, so a new test joins its family wherever it is written:

- `compiled`: the test, one of its fixtures, a helper of its module or a script it runs
  compiles a model (torch.compile, `module.compile()`, Inductor's compile_fx): tens of
  seconds each;
- `postgres`: a test parametrized on the database, in its PostgreSQL case (a throwaway server
  is started for it);
- `browser`: marked by hand (`pytestmark = pytest.mark.browser`): headless Chromium.

The full suite (`make test`, CI) runs every family.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterable

import pytest

COMPILES = re.compile(r"\btorch\.compile\b|\.compile\(\s*\)|\bcompile_fx\b")
QUICK_SKIPS = ("compiled", "postgres", "browser")  # `make test-quick`: -m "not ..." of these


def _names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def compiles(functions: Iterable[Callable]) -> bool:
    """Whether any of `functions`, or a function of their own module they name (followed
    through), has source text that compiles a model."""
    todo, seen = list(functions), set()
    while todo:
        fn = inspect.unwrap(todo.pop())
        if not inspect.isfunction(fn) or fn in seen:
            continue
        seen.add(fn)
        try:
            source = inspect.getsource(fn).replace(fn.__doc__ or "\0", "")  # code, not prose
        except (OSError, TypeError):
            continue
        if COMPILES.search(source):
            return True
        for name in _names(fn.__code__):
            value = fn.__globals__.get(name)
            if inspect.isfunction(value) and value.__module__ == fn.__module__:
                todo.append(value)
            elif isinstance(value, str) and COMPILES.search(value):
                return True  # a script the test runs in a subprocess
    return False


def _fixture_functions(item: pytest.Item) -> list[Callable]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [d.func for name in item.fixturenames for d in info.name2fixturedefs.get(name, ())]


def mark_families(items: list[pytest.Item]) -> None:
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and "compiled" not in item.keywords and compiles(
                [fn, *_fixture_functions(item)]):
            item.add_marker(pytest.mark.compiled)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgresql" in callspec.params.values():
            item.add_marker(pytest.mark.postgres)
