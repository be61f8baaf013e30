"""Batches grouped into tasks on a cluster: every batch once, results in batch order."""

import pytest

from accuracy.cluster import guided_groups

distributed = pytest.importorskip("distributed")


@pytest.mark.parametrize("n,workers,most", [(89, 2, 16), (89, 1, 16), (35, 2, 8), (3, 4, 8),
                                            (1, 1, 16), (0, 2, 16), (40, 2, 1)])
def test_guided_groups_cover_each_batch_once_large_first(n, workers, most):
    runs = guided_groups(n, workers, most)
    assert [i for r in runs for i in r] == list(range(n))  # consecutive, in order, once each
    sizes = [len(r) for r in runs]
    assert all(1 <= k <= most for k in sizes)
    assert sizes == sorted(sizes, reverse=True)  # the tail is made of the smallest tasks
    if n >= 2 * workers:
        assert sizes[-1] == 1


def _scaled(batch, k):
    return [x * k for x in batch]


@pytest.fixture(scope="module")
def client():
    with distributed.Client(processes=False, n_workers=2, threads_per_worker=1,
                            dashboard_address=None) as c:
        yield c


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("group", [1, 4, 16])
def test_grouped_tasks_yield_each_batch_in_order(client, eager, group):
    """Batches of two placements interleaved, several per task: the results come back per
    batch, in batch order, as `fn(batch)` each."""
    from accuracy.cluster import map_in_order

    batches = [[i, i + 1] for i in range(0, 80, 2)]
    one = sorted(client.nthreads())[0]
    workers = [[one] if i % 3 == 0 else None for i in range(len(batches))]
    got = list(map_in_order(client, _scaled, batches, 3, name="test-groups", workers=workers,
                            eager=eager, group=group))
    assert got == [_scaled(b, 3) for b in batches]
