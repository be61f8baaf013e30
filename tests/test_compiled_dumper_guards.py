"""A new dumper context must not recompile the compiled regions it enters.

dynamo guards compiled code on the global module hooks' keys; the dumper's scope tracker used
to register new global hooks (new handle ids) per dumper, so every dumped compiled step paid a
full recompile (minutes for a real model with Inductor; the recompile limit ends it).
"""

from __future__ import annotations

import torch

from accuracy import dumper


def test_consecutive_dumper_contexts_reuse_the_compiled_program(tmp_path):
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    torch._dynamo.reset()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = torch.compile(net, backend=backend)
    x = torch.randn(2, 4)
    try:
        for i in range(3):
            with dumper(tmp_path / f"d{i}.h5", mode="statistics"):
                compiled(x)
        assert len(compiles) == 1
        compiled(x)  # without the dumper: its own program, then back under a dumper
        n = len(compiles)
        with dumper(tmp_path / "again.h5", mode="statistics"):
            compiled(x)
        assert len(compiles) == n
        from torch.nn.modules import module as m
        assert not m._global_forward_hooks and not m._global_forward_pre_hooks  # none left
    finally:
        torch._dynamo.reset()
