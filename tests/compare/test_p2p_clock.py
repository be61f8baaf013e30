"""Ranks that talk point to point on one logical clock (accuracy/compare/p2p_clock.py): a
receive after the send it pairs with, a collective at one time on every rank."""

from __future__ import annotations

from accuracy.compare.p2p_clock import logical_epochs


def _p2p(kind: str, src: int, dst: int, index: int = 0) -> dict:
    return {"kind": kind, "group": "0", "src": src, "dst": dst, "tag": 0, "p2p_index": index}


def test_without_point_to_point_the_epochs_are_unchanged():
    ar = {"kind": "all_reduce", "group": "0", "group_index": 0}
    epochs = {0: {0: 0, 1: 0, 2: 1}, 1: {0: 0, 1: 1}}
    comm = {0: {0: (1, ar)}, 1: {0: (0, ar)}}
    assert logical_epochs(comm, epochs) is epochs


def test_a_receive_comes_after_the_send_and_the_ops_before_it():
    """Stage 0 computes (seq 0, epoch 0, where a fault would be), sends (seq 1), computes on;
    stage 1 receives first thing (its epoch 0 too) and computes on it. On the shared clock
    the fault comes first, then the send, the receive, what reads it."""
    epochs = {0: {0: 0, 1: 0, 2: 1}, 1: {0: 0, 1: 1}}
    comm = {0: {0: (1, _p2p("send", 0, 1))}, 1: {0: (0, _p2p("recv", 0, 1))}}
    at = logical_epochs(comm, epochs)
    fault, send, recv, reader = at[0][0], at[0][1], at[1][0], at[1][1]
    assert fault < send < recv < reader


def test_later_sends_push_later_receives_and_a_collective_lines_ranks_up():
    """Rank 0 sends twice (micro-batches 0 and 1) with work between; rank 1 receives both,
    then both all-reduce: the second receive is after the second send, and the all-reduce
    has one time on both ranks, after everything before it on either."""
    ar = {"kind": "all_reduce", "group": "0", "group_index": 0}
    epochs = {0: {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 3},
              1: {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3}}
    comm = {0: {0: (1, _p2p("send", 0, 1, 0)), 1: (3, _p2p("send", 0, 1, 1)), 2: (4, ar)},
            1: {0: (0, _p2p("recv", 0, 1, 0)), 1: (2, _p2p("recv", 0, 1, 1)), 2: (4, ar)}}
    at = logical_epochs(comm, epochs)
    assert at[0][3] < at[1][2]  # second send, then its receive
    assert at[0][2] < at[1][2]  # rank 0's work between the sends, before that receive
    assert at[0][4] == at[1][4]  # the all-reduce: one time
    assert at[0][4] > max(at[0][3], at[1][2])
    assert at[0][5] == at[1][5]  # after it, the ranks agree again
