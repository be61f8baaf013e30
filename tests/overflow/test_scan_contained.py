"""Births whose inf/nan later ops drop are contained, not overflows (T5's log(0)): online,
offline, and without hiding a real overflow that follows."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from accuracy.dumper.core import dumper
from accuracy.dumper.overflow_watch import OverflowChecker
from accuracy.dumpfile import load_dump
from accuracy.overflow import OverflowWarning, scan

pytestmark = pytest.mark.filterwarnings("ignore::accuracy.overflow.OverflowWarning")


def _buckets(n: int = 6) -> torch.Tensor:
    """T5's relative position buckets: log(0) is -inf where a position is 0, cast to integers
    and discarded by `where`."""
    pos = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    pos = pos.abs()
    small = pos < 2
    large = 2 + (torch.log(pos.float() / 2) / 1.4 * 4).to(torch.long)
    return torch.where(small, pos, torch.minimum(large, torch.full_like(large, 7)))


def _overflow_after_buckets() -> torch.Tensor:
    _buckets()
    x = torch.full((4, 8), 300.0, dtype=torch.float16)
    return (x @ x.t() @ x).sum()  # 8 * 90000 > 65504: a real overflow


def _births(path) -> list[str]:
    with load_dump(path) as d:
        return [e["op"] for e in d.attrs["overflow"]["events"]]


def _contained(path) -> list[str]:
    with load_dump(path) as d:
        return [e["op"] for e in d.attrs["overflow"]["contained"]]


def test_t5_buckets_log_zero_is_contained_not_an_overflow(tmp_path):
    path = tmp_path / "b.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("error", OverflowWarning)  # no warning at all
        with dumper(path, check_overflow=True):
            b = _buckets()
    assert b.dtype == torch.long and int(b.min()) >= 0
    assert _births(path) == [] and _contained(path) == ["aten.log.default"]
    rep = scan(path)
    assert not rep.births and [f.op for f in rep.contained] == ["aten.log.default"]
    assert "aten._to_copy.default dropped it" in rep.contained[0].label
    assert "dropped by later ops (1 births" in rep.format()


def test_a_real_overflow_after_a_contained_birth_is_still_found(tmp_path):
    """overflow_nums=1 stopped at T5's log(0) before: the real overflow was never seen."""
    path = tmp_path / "r.h5"
    with pytest.warns(OverflowWarning, match="aten.mm.default"):
        with dumper(path, check_overflow=True, overflow_nums=1):
            out = _overflow_after_buckets()
    assert torch.isinf(out)
    assert _births(path) == ["aten.mm.default"]
    assert _contained(path) == ["aten.log.default"]
    with load_dump(path) as d:
        assert [r.op for r in d.records] == ["aten.log.default", "aten.mm.default"]


def test_the_batched_device_path_contains_the_same(tmp_path):
    path = tmp_path / "defer.h5"
    d = dumper(path, check_overflow=True, overflow_nums=-1)
    d._overflow = OverflowChecker(nums=-1, defer=True, interval=3)
    with d:
        _overflow_after_buckets()
    assert _births(path) == ["aten.mm.default"] and _contained(path) == ["aten.log.default"]


def test_a_statistics_dump_scanned_offline_contains_the_same(tmp_path):
    path = tmp_path / "s.h5"
    with dumper(path, mode="statistics"):
        _overflow_after_buckets()
    rep = scan(path)
    assert [f.op for f in rep.births] == ["aten.mm.default"]
    assert [f.op for f in rep.contained] == ["aten.log.default"]
    assert {f.op for f in rep.inherited} >= {"aten.mm.default", "aten.sum.default"}
    assert all(f.seq > rep.births[0].seq for f in rep.inherited)  # log's div, mul: not listed


def _read_and_keep() -> torch.Tensor:
    y = torch.log(torch.zeros(3))
    torch.isinf(y)  # read into booleans, but y itself is returned
    return y


def _read_once_then_carried_unread() -> None:
    y = torch.log(torch.arange(3.0))  # [-inf, 0, 0.69]: y * 2 has other statistics
    torch.isinf(y)  # dropped here...
    y * 2  # ...but carried on here, into a tensor freed before anyone read it


LASTING = {
    "kept": lambda: torch.log(torch.zeros(3)),  # returned: it lasts
    "item": lambda: torch.log(torch.zeros(3)).sum().item(),  # its value reached Python
    "unread": lambda: [torch.log(torch.zeros(3)), None][1],  # freed before anyone read it
    "read_and_kept": _read_and_keep,
    "carried_unread": _read_once_then_carried_unread,
}


@pytest.mark.parametrize("case", sorted(LASTING))
def test_values_that_last_reach_python_or_go_unread_stay_overflows(tmp_path, case):
    """Only a birth every later reader dropped is contained."""
    path = tmp_path / "online.h5"
    with dumper(path, check_overflow=True):
        kept = LASTING[case]()
    assert _births(path) == ["aten.log.default"] and _contained(path) == []
    del kept
    if case in ("kept", "read_and_kept"):
        return  # offline, a value read and kept looks like one read and dropped
    full = tmp_path / "full.h5"
    with dumper(full, mode="statistics"):
        LASTING[case]()
    rep = scan(full)
    assert [b.op for b in rep.births] == ["aten.log.default"] and not rep.contained


def test_a_birth_whose_values_live_on_is_reported_within_the_window(tmp_path):
    """Not only when the block ends: a run that never leaves the block still hears of it."""
    from accuracy.dumper.overflow_watch import LINEAGE_WINDOW

    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OverflowWarning)
        with dumper(tmp_path / "w.h5", check_overflow=True):
            kept = torch.log(torch.zeros(3))
            x = torch.ones(4)
            for _ in range(LINEAGE_WINDOW + 2):
                x = x + 1
            seen = [str(w.message) for w in caught]
    assert len(seen) == 1 and "aten.log.default" in seen[0]
    del kept


def test_an_overflow_that_spreads_is_reported_while_it_spreads(tmp_path):
    """A real overflow is carried op after op: reported once it has spread, not when the
    block ends (nor held with copies of its tensors till then)."""
    from accuracy.dumper.overflow_watch import LINEAGE_WINDOW

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OverflowWarning)
        with dumper(tmp_path / "s.h5", check_overflow=True):
            x = torch.full((4,), 1e38) * 10  # inf
            for _ in range(LINEAGE_WINDOW + 2):
                x = x + 1  # carries it on, and the last one lives
            seen = [str(w.message) for w in caught]
    assert len(seen) == 1 and "aten.mul.Tensor" in seen[0]


def test_a_loss_scale_overflow_is_not_contained_by_autograds_ones_like(tmp_path):
    """Backward seeds the scaled loss's gradient with ones_like(loss): that reads its shape,
    not its inf."""
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**126)
    except (RuntimeError, AssertionError, TypeError) as e:  # pragma: no cover
        pytest.skip(f"no CPU GradScaler here: {e}")
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "amp.h5"
    with dumper(path, check_overflow=True, overflow_nums=-1):
        scaler.scale(model(torch.randn(4, 8) * 100).pow(2).sum()).backward()
        scaler.step(opt)
        scaler.update()
    assert "aten.mul.Tensor" in _births(path) and _contained(path) == []


def test_overflow_raise_still_raises_at_the_birth(tmp_path):
    """Raising cannot wait for later ops: the user's frame at the birth is the point."""
    from accuracy.overflow import OverflowDetected

    with pytest.raises(OverflowDetected, match="aten.log.default"):
        with dumper(tmp_path / "x.h5", check_overflow=True, overflow_raise=True):
            _buckets()


def test_a_transformers_t5_step_with_a_real_overflow(tmp_path):
    """A model we did not write: T5's position buckets hold log(0) in encoder and decoder each
    step; the overflow a forward hook makes after the decoder's feed-forward is the one found."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2,
                                num_heads=4, decoder_start_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(cfg)
    ids, labels = torch.randint(0, 64, (2, 10)), torch.randint(0, 64, (2, 6))
    clean = tmp_path / "clean.h5"
    with dumper(clean, check_overflow=True):
        model(input_ids=ids, labels=labels).loss.backward()
    assert _births(clean) == [] and _contained(clean) == ["aten.log.default"] * 2

    ff = model.decoder.block[1].layer[2]
    ff.register_forward_hook(lambda m, i, out: out * 1e39)  # fp32 overflows to inf
    bad = tmp_path / "bad.h5"
    with pytest.warns(OverflowWarning, match="module T5ForConditionalGeneration.decoder.block.1"):
        with dumper(bad, check_overflow=True, overflow_nums=1):
            model(input_ids=ids, labels=labels).loss.backward()
    rep = scan(bad)
    # a forward hook runs once its module has returned: in the enclosing block's scope
    assert [(b.op, b.module) for b in rep.births] == [
        ("aten.mul.Tensor", "T5ForConditionalGeneration.decoder.block.1")]
    assert [f.op for f in rep.contained] == ["aten.log.default"] * 2
