"""BoundedLRU (accuracy/lru.py): the caches of replay and the server keep within their bounds
and drop the least recently used entry first."""

from __future__ import annotations

from accuracy.lru import BoundedLRU


def test_eviction_by_count_drops_the_least_recently_used():
    evicted = []
    c = BoundedLRU(2, on_evict=lambda k, v: evicted.append((k, v)))
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # now "b" is the least recently used
    c.put("c", 3)
    assert list(c) == ["a", "c"] and evicted == [("b", 2)]
    assert c.get("b") is None and c.get("b", 0) == 0


def test_eviction_by_cost_keeps_the_total_under_the_budget():
    c = BoundedLRU(max_cost=10, cost=len)
    c.put(1, "xxxx")
    c.put(2, "yyyy")
    c.put(3, "zzzz")  # 12 > 10: the oldest goes
    assert list(c) == [2, 3] and c.total_cost == 8
    c.put(2, "yy")  # replacing re-costs the entry
    assert c.total_cost == 6 and list(c) == [3, 2]
    assert c.put(4, "w" * 11) == "w" * 11 and 4 not in c  # too costly alone: not kept
    assert list(c) == [3, 2] and c.total_cost == 6


def test_an_oversized_value_can_stay_as_the_only_entry():
    c = BoundedLRU(max_cost=10, cost=len, keep_oversized=True)
    c.put("a", "xx")
    c.put("big", "x" * 50)
    assert list(c) == ["big"] and c.total_cost == 50


def test_pop_and_discard_where_release_their_cost_without_on_evict():
    evicted = []
    c = BoundedLRU(max_cost=100, cost=len, on_evict=lambda k, v: evicted.append(k))
    for k in [("r1", 1), ("r1", 2), ("r2", 1)]:
        c.put(k, "abc")
    c.discard_where(lambda k: k[0] == "r1")
    assert list(c) == [("r2", 1)] and c.total_cost == 3
    assert c.pop(("r2", 1)) == "abc" and len(c) == 0 and c.total_cost == 0
    assert evicted == []


def test_replay_tensor_cache_stays_within_its_byte_budget():
    import torch

    from accuracy.replay.cache import TensorCache

    cache = TensorCache(max_bytes=3 * 400)
    for i in range(5):
        cache._put(i, torch.zeros(100))  # 400 bytes each
    assert list(cache._items) == [2, 3, 4] and cache._items.total_cost == 1200
    assert cache._get(0) is None and cache._get(4) is not None
    assert cache.hits == 1 and cache.misses == 1
