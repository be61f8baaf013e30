"""The names a dump's JSON carries are declared once, in `dumpfile/schema.py`.

Readers (compare, replay, overflow, the server) find a row's notes and a file's attributes by
these names; one written under a name nobody declared (or spelled two ways, as
`uninitialised_io` and `uninitialized_io` once were) is a note every reader misses. Each test
records a step the way users do and checks that every `extra` key and root attribute the file
holds is declared (`schema.EXTRA`, `schema.ROOT`), and that the declared names are unique.
"""

from __future__ import annotations

import torch
from torch import nn

from accuracy import dumper, load_dump
from accuracy.dumpfile import schema
from accuracy.replay import replay


def undeclared(path) -> tuple[set[str], set[str]]:
    """(extra keys, root attributes) a dump holds that schema.py does not declare."""
    with load_dump(path) as d:
        keys = {k for r in d.records for k in r.extra}
        attrs = set(d.attrs)
    return keys - set(schema.EXTRA), attrs - set(schema.ROOT)


def test_the_declared_names_are_unique_and_each_says_its_type_and_meaning():
    constants = {k: v for k, v in vars(schema).items()
                 if k.startswith(("EXTRA_", "ROOT_")) and isinstance(v, str)}
    extra = [v for k, v in constants.items() if k.startswith("EXTRA_")]
    root = [v for k, v in constants.items() if k.startswith("ROOT_")]
    assert sorted(extra) == sorted(schema.EXTRA) and len(set(extra)) == len(extra)
    assert sorted(root) == sorted(schema.ROOT) and len(set(root)) == len(root)
    assert all(f.type and f.meaning for f in (*schema.EXTRA.values(), *schema.ROOT.values()))
    # what old dumps hold stays the written name
    assert schema.EXTRA_UNINITIALIZED_IO == "uninitialized_io"


def test_every_note_and_attribute_of_eager_dumps_and_a_replay_is_declared(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(4, 8)

    def train_step():
        loss = model(x).float().pow(2).mean() + torch.empty(3).fill_(0.0).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    with dumper(tmp_path / "tensor.h5", mode="tensor"):
        train_step()
    with dumper(tmp_path / "stats.h5", mode="statistics", stack=True):
        train_step()
    with dumper(tmp_path / "overflow.h5", check_overflow=True, overflow_nums=-1):
        (torch.full((4,), 60000.0, dtype=torch.float16) * 4).sum()
        train_step()
    replay(tmp_path / "tensor.h5", tmp_path / "replay.h5")
    for name in ("tensor.h5", "stats.h5", "overflow.h5", "replay.h5"):
        assert undeclared(tmp_path / name) == (set(), set()), name
    with load_dump(tmp_path / "overflow.h5") as d:  # the check's notes were written at all
        assert any(schema.EXTRA_OVERFLOW in r.extra for r in d.records)
    with load_dump(tmp_path / "tensor.h5") as d:
        assert any(schema.EXTRA_TENSOR_NAMES in r.extra for r in d.records)
