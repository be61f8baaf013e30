"""What the compiled-program tests share: each module compiles its models once, in its own
Inductor cache; a module that defines `make_dumps(folder, fault)` gets its runs without and
with the injected miscompile as the `clean` and `fault` fixtures."""

from __future__ import annotations

import pytest

from tests._support.miscompile import inductor_cache


@pytest.fixture(scope="module")
def cache(request, tmp_path_factory):
    """This module's folder, holding its Inductor cache (tests/_support/miscompile.py)."""
    name = request.module.__name__.rpartition(".")[2]
    with inductor_cache(tmp_path_factory.mktemp(name)) as folder:
        yield folder


@pytest.fixture(scope="module")
def clean(request, cache):
    """The module's `make_dumps` without the miscompile."""
    return request.module.make_dumps(cache / "clean", False)


@pytest.fixture(scope="module")
def fault(request, cache):
    """The module's `make_dumps` with the miscompile."""
    return request.module.make_dumps(cache / "fault", True)
