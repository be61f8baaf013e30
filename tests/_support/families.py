"""The test families `make test-quick` leaves out, recognised by what a test does rather than
by a list of files, so a new test joins its family wherever it is written:

- `compiled`: the test, one of its fixtures, a function of the tests' own code they name (of
  its module, tests/_support, or reached by a shared fixture through `request.module`) or a
  script it runs compiles a model (torch.compile, `module.compile()`, Inductor's
  compile_fx): tens of seconds each;
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


def _followed(fn: Callable, value: object, namespaces: list[dict]) -> bool:
    """A function a test's code names is followed when it is of the test's own code: `fn`'s
    module, the test's module (`namespaces`) or a shared helper in tests/_support."""
    if not inspect.isfunction(value):
        return False
    module = value.__module__
    return module == fn.__module__ or module.startswith("tests._support.") \
        or any(module == space.get("__name__") for space in namespaces)


def compiles(functions: Iterable[Callable], namespaces: Iterable[dict] = ()) -> bool:
    """Whether any of `functions`, or a function of the tests' own code they name (followed
    through), has source text that compiles a model. `namespaces`: where else a name is
    looked up (the test's module, which a shared fixture reaches as
    `request.module.make_dumps`)."""
    namespaces = list(namespaces)
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
            for space in (fn.__globals__, *namespaces):
                value = space.get(name)
                if _followed(fn, value, namespaces):
                    todo.append(value)
                elif isinstance(value, str) and not name.startswith("__") \
                        and COMPILES.search(value):  # not a module's __doc__
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
        # a marker, not a keyword: every test under tests/dumper/compiled/ has the keyword
        # "compiled" (its folder's name), marked or not
        module = getattr(item, "module", None)
        if fn is not None and item.get_closest_marker("compiled") is None and compiles(
                [fn, *_fixture_functions(item)], [vars(module)] if module else []):
            item.add_marker(pytest.mark.compiled)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgresql" in callspec.params.values():
            item.add_marker(pytest.mark.postgres)
