"""`BoundedLRU`: the one least-recently-used cache the parts share, bounded by count and cost.

functools.lru_cache bounds a function's results by count only; the caches here hold values
of very different sizes (tensors, page bodies, row orders, open dumps) and must stay under a
memory budget, and some must release what they drop (close a file). Not thread-safe: callers
that share one across threads hold their own lock around each call, as they already do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def _one(_value: object) -> int:
    return 1


class BoundedLRU(Generic[K, V]):
    """At most `max_items` values whose `cost(value)` adds up to at most `max_cost`.

    `put` evicts the least recently used values (`get` and `put` count as use) until both
    bounds hold, calling `on_evict(key, value)` for each. A value costlier than `max_cost` on
    its own is not kept (it is returned unchanged), unless `keep_oversized`, where it stays as
    the only entry rather than none.
    """

    def __init__(self, max_items: int | None = None, max_cost: int | None = None, *,
                 cost: Callable[[V], int] = _one,
                 on_evict: Callable[[K, V], None] | None = None,
                 keep_oversized: bool = False) -> None:
        self.max_items = max_items
        self.max_cost = max_cost
        self._cost = cost
        self._on_evict = on_evict
        self._keep_oversized = keep_oversized
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.total_cost = 0

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value under `key` (now the most recently used), else `default`."""
        entry = self._items.get(key)
        if entry is None:
            return default
        self._items.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V) -> V:
        """Keep `value` under `key` (replacing any), evict to the bounds; returns `value`."""
        c = self._cost(value)
        if self.max_cost is not None and c > self.max_cost and not self._keep_oversized:
            return value
        self.pop(key)
        self._items[key] = (value, c)
        self.total_cost += c
        while len(self._items) > 1 and self._over():
            old_key, (old, old_cost) = self._items.popitem(last=False)
            self.total_cost -= old_cost
            if self._on_evict is not None:
                self._on_evict(old_key, old)
        return value

    def _over(self) -> bool:
        return ((self.max_items is not None and len(self._items) > self.max_items)
                or (self.max_cost is not None and self.total_cost > self.max_cost))

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove `key` without calling `on_evict`; its value, else `default`."""
        entry = self._items.pop(key, None)
        if entry is None:
            return default
        self.total_cost -= entry[1]
        return entry[0]

    def discard_where(self, predicate: Callable[[K], bool]) -> None:
        """Remove every key for which `predicate(key)` holds (without `on_evict`)."""
        for key in [k for k in self._items if predicate(k)]:
            self.pop(key)

    def values(self) -> list[V]:
        return [v for v, _ in self._items.values()]

    def clear(self) -> None:
        self._items.clear()
        self.total_cost = 0

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)
