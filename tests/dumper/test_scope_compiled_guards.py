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
        compiled(x)  # without the dumper: the same program (the hooks it guards on stay)
        assert len(compiles) == 1
        with dumper(tmp_path / "again.h5", mode="statistics"):
            compiled(x)
        assert len(compiles) == 1
    finally:
        torch._dynamo.reset()


def test_an_eager_only_dumper_leaves_no_global_hooks(tmp_path, monkeypatch):
    """The hooks slow every module call: kept only once compiled code ran under a dumper."""
    from torch.nn.modules import module as m

    from accuracy.dumper import scope

    monkeypatch.setattr(scope, "_KEEP", [False])
    scope._remove_hooks()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with dumper(tmp_path / "eager.h5", mode="statistics"):
        net(torch.randn(2, 4))
    assert scope._KEYS["pre"] not in m._global_forward_pre_hooks
    assert scope._KEYS["post"] not in m._global_forward_hooks


def test_dumped_bare_dumped_steps_record_kernels_each_time_without_recompiling(tmp_path):
    """Leaving the dumper removed the global hooks the compiled program is guarded on: the
    bare step after it recompiled (seconds), and the next dumper reused that hookless
    program: its region read BLIND "made before the dumper started", 0 kernels."""
    from torch._inductor.compile_fx import compile_fx

    from accuracy import load_dump
    from tests._support.miscompile import inductor_cache

    compiles = []

    def inductor(gm, example_inputs):
        compiles.append(gm)
        return compile_fx(gm, example_inputs)

    with inductor_cache(tmp_path):
        torch._dynamo.reset()
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))
        compiled = torch.compile(net, backend=inductor)
        x = torch.randn(2, 4)
        for i in range(3):
            with dumper(tmp_path / f"d{i}.h5", mode="statistics"):
                compiled(x).sum().backward()
            compiled(x).sum().backward()  # a bare step between dumped ones
            d = load_dump(tmp_path / f"d{i}.h5")
            [region] = d.attrs["compiled_regions"]
            assert region["status"] == "recorded-compiled", (i, region)
            assert d.attrs["compiled_kernels_recorded"] > 0
        assert len(compiles) == 1  # one forward graph: no step recompiled it
