"""Inductor's FX-graph and AOTAutograd caches under the dumper: a program compiled while a dumper
recorded comes back from the caches in a later process with its hook lines and records the same
kernel rows, and hooked and plain programs are never served for each other (the cache keys carry
the dumper's tag). Each run is a fresh process over one cache folder, as a user's reruns are."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accuracy import load_dump

_SCRIPT = r'''
import json, sys
import torch
import torch.nn as nn
from torch._dynamo.utils import counters
from accuracy import dumper

torch.manual_seed(0)


# a compiled function: a plain run traces the very graph a dumped run traces (a module's
# graph, under the dumper's module hooks, takes its inputs in another order), so only the
# cache key's tag keeps the two programs apart
@torch.compile
def step(x, w):
    return nn.functional.gelu(nn.functional.layer_norm(x, (8,)) @ w).sum()


def hits():
    return {"fx_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot_hit": counters["aot_autograd"]["autograd_cache_hit"]}


torch.compiler.config.cache_key_tag = "users-own-tag"
x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
with dumper(dump_path=sys.argv[1], overwrite=True):
    step(x, w).backward()
dumped = hits()
out = {"dumped": dumped, "tag_after": torch.compiler.config.cache_key_tag,
       "fx_cache_after": torch._inductor.config.fx_graph_cache}
if sys.argv[2:] == ["then-plain"]:  # the same step compiled anew without the dumper
    torch._dynamo.reset()
    step(x, w).backward()
    out["plain"] = {k: v - dumped[k] for k, v in hits().items()}
print(json.dumps(out))
'''


def _run(tmp_path, *args: str) -> dict:
    # Inductor's own generator, as outside the dumper: then only the cache key's tag keeps
    # the hooked and the plain program apart (eager's generator is a config in the key too)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": os.getcwd(),
           "ACCURACY_COMPILED_RANDOM": "inductor"}
    script = tmp_path / "step.py"
    script.write_text(_SCRIPT)
    p = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True,
                       text=True, timeout=280, start_new_session=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _kernel_rows(path) -> tuple[list[tuple[str, str, str]], list[str]]:
    with load_dump(path) as d:
        assert d.attrs["compiled_random"] == "inductor"
        rows = [(r.op, r.module, r.phase) for r in d.records if r.op.startswith("inductor.")]
        return rows, [r["status"] for r in d.attrs["compiled_regions"]]


@pytest.mark.timeout(600)
def test_cached_programs_record_as_fresh_ones_and_never_cross_with_plain_ones(tmp_path):
    first = _run(tmp_path, str(tmp_path / "first.h5"), "then-plain")
    assert first["dumped"]["fx_hit"] == 0 and first["dumped"]["fx_miss"] > 0
    # the user's tag and cache setting come back when the dumper ends
    assert first["tag_after"] == "users-own-tag" and first["fx_cache_after"] is True
    fresh, status = _kernel_rows(tmp_path / "first.h5")
    assert status == ["recorded-compiled"] and fresh
    assert {"forward", "backward"} <= {phase for _, _, phase in fresh}
    # then a plain compile of the same step: never handed the hooked program (nor, below,
    # the dumped rerun the plain one)
    assert first["plain"]["fx_hit"] == 0 and first["plain"]["aot_hit"] == 0
    assert first["plain"]["fx_miss"] > 0

    again = _run(tmp_path, str(tmp_path / "again.h5"))["dumped"]
    assert again["fx_hit"] > 0 or again["aot_hit"] > 0, again  # served from the caches
    assert again["fx_miss"] == 0
    cached, status = _kernel_rows(tmp_path / "again.h5")
    assert status == ["recorded-compiled"]
    assert cached == fresh  # the same kernels, named and phased as the fresh compile's
