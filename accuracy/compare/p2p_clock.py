"""The ranks' epochs on one logical clock when they talk point to point (pipeline parallel).

A collective epoch (how many collectives a rank had issued) lines ranks up when they run the
same program: the n-th all-reduce is one moment on every rank. Pipeline stages do not: stage 0
sends an activation at its epoch 3, stage 1 receives it at its epoch 3 as well, and the fault
made on stage 0 before that send has the same epoch as the receive that carries its error to
stage 1, so ordering the ranks' divergences by epoch could name the wrong stage first.

`logical_epochs` puts every rank's communication on one Lamport clock: each rank's
communication ops tick it in order, a receive comes after the send it pairs with (the same
group, source, destination, tag and `p2p_index`, as the offline check pairs them), and every
rank of a collective (the same group and index) reaches it at the same time. A row is then
placed on that clock: a communication op at 2L+1, the ops after it at 2L+2. Dumps with no
point-to-point op keep their epochs unchanged.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

Note = dict[str, Any]


def _sync_key(note: Note) -> tuple | None:
    """What lines this op up with other ranks' ops: ("recv"/"send", pairing) or
    ("coll", group, index); None when the note says nothing of it."""
    kind = note.get("kind")
    try:
        if kind in ("send", "recv"):
            return (kind, str(note.get("group", "")), int(note["src"]), int(note["dst"]),
                    int(note["tag"]), int(note["p2p_index"]))
        if note.get("group") is not None and note.get("group_index") is not None:
            return ("coll", str(note["group"]), int(note["group_index"]))
    except (KeyError, TypeError, ValueError):
        return None
    return None


def logical_epochs(comm: dict[int, dict[int, tuple[int, Note]]],
                   epochs: dict[int, dict[int, int]]) -> dict[int, dict[int, int]]:
    """rank -> seq -> place on the shared clock. `comm`: rank -> epoch -> (seq, note) of the
    communication op that rank recorded at that epoch; `epochs`: rank -> seq -> collective
    epoch of every row. Unchanged without point-to-point ops."""
    if not any(n.get("kind") in ("send", "recv") for ops in comm.values()
               for _, n in ops.values()):
        return epochs
    clock = {r: {k: k for k in ops} for r, ops in comm.items()}
    keys = {r: {k: _sync_key(n) for k, (_, n) in ops.items()} for r, ops in comm.items()}
    where: dict[tuple, list[tuple[int, int]]] = {}
    for r, ks in keys.items():
        for k, key in ks.items():
            if key is not None:
                where.setdefault(key, []).append((r, k))
    rounds = 1 + sum(len(ops) for ops in comm.values())
    for _ in range(rounds):  # to a fixpoint: every bound is met
        changed = False
        for r, ks in keys.items():
            prev = -1
            for k in sorted(ks):
                key, t = ks[k], max(clock[r][k], prev + 1)
                if key is not None and key[0] == "recv":
                    for s, j in where.get(("send", *key[1:]), ()):
                        t = max(t, clock[s][j] + 1)
                elif key is not None and key[0] == "coll":
                    t = max([t] + [clock[s][j] for s, j in where.get(key, ())])
                if t != clock[r][k]:
                    clock[r][k], changed = t, True
                prev = t
        if not changed:
            break
    out: dict[int, dict[int, int]] = {}
    for r, rows in epochs.items():
        ops, ticks = comm.get(r, {}), clock.get(r, {})
        order = sorted(ticks)
        placed: dict[int, int] = {}
        for seq, e in rows.items():
            if e < 0:
                placed[seq] = e
            elif e in ops and ops[e][0] == seq:  # the communication op itself
                placed[seq] = 2 * ticks[e] + 1
            else:  # after the last communication op before it
                i = bisect_left(order, e)
                placed[seq] = 2 * ticks[order[i - 1]] + 2 if i else 2 * e
        out[r] = placed
    return out
