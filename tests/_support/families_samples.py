"""Functions tests/structure/test_quick_families.py shows to `families.compiles` (kept apart so that
the test itself, which only names them, is not taken for a compiling test)."""

import re

import torch

SCRIPT = "import torch\nf = torch.compile(lambda x: x + 1)\n"


def _compile_model(net):
    return torch.compile(net)


def _through_a_helper():
    return _compile_model(torch.nn.Linear(2, 2))


def _runs_a_script():
    return SCRIPT


def _block_compile(net):
    net.blocks[0].compile()


def _eager(net):
    """Not `torch.compile(net)`: prose about compiling is not compiling."""
    return re.compile("x").match("x") and net


def make_dumps(folder):
    """What a compiled-program test module defines; its shared fixture reaches it."""
    return torch.compile(torch.nn.Linear(2, 2))


def _through_request_module(request):
    return request.module.make_dumps(None)
