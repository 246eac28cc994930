"""Who shares secrets with whom in a SecAgg+ round, and whether a round's survivors can be unmasked.

SecAgg+ (Bell, Bengtson, Ito, Raykova and Wichs, CCS 2020) replaces SecAgg's complete graph with a sparse one: each
client agrees masks with, and secret-shares its seeds among, its ``k`` neighbours only, so a round costs
``O(k)`` rather than ``O(n)`` per client. The graph is the Harary graph ``H(k, n)`` (``k/2`` neighbours on each side
of a ring) on a uniformly random ordering of the clients, drawn by the server from its own randomness each round
(the operating system's entropy in deployment). ``k >= n - 1`` is the complete graph: SecAgg itself.

A client's *share holders* are its neighbours and itself; share ``i`` of its secrets goes to the ``i``-th holder in
client-id order (:func:`holders`), which both sides compute from the graph alone. The server can remove a
survivor's self mask only with ``t`` shares of its seed, and a dropped client's pairwise masks only with ``t``
shares of its key (:func:`unrecoverable`): the same rule decides a deployed round's abort and a simulated one's.

This module imports nothing of fedsim's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

Graph = dict[int, tuple[int, ...]]


def harary(clients: Iterable[int], k: int, rng: Any) -> Graph:
    """client -> its neighbours (sorted), the Harary graph ``H(k, n)`` on a random ordering of ``clients`` drawn with
    ``rng`` (anything with ``permutation``, or with ``random`` as :class:`fedsim.round.randomness.OsEntropyGenerator`).
    ``k >= n - 1`` (or 0) gives the complete graph; otherwise ``k`` must be even."""
    ids = sorted(int(c) for c in clients)
    n = len(ids)
    if k <= 0 or k >= n - 1:
        return {c: tuple(x for x in ids if x != c) for c in ids}
    if k % 2:
        raise ValueError(f"neighbours={k}: a Harary graph H(k, n) with k < n - 1 needs an even k")
    order = _permutation(ids, rng)
    pos = {c: i for i, c in enumerate(order)}
    half = k // 2
    return {
        c: tuple(sorted({order[(pos[c] + d) % n] for d in range(-half, half + 1) if d != 0})) for c in ids
    }


def _permutation(ids: list[int], rng: Any) -> list[int]:
    if hasattr(rng, "permutation"):
        return [ids[i] for i in rng.permutation(len(ids))]
    # the operating system's generator: sort by independent uniform keys
    keys = np.asarray(rng.random(len(ids)))
    return [ids[i] for i in np.argsort(keys, kind="stable")]


def holders(graph: Mapping[int, Iterable[int]], client: int) -> tuple[int, ...]:
    """The clients that hold shares of ``client``'s secrets, in share order: its neighbours and itself, by id."""
    return tuple(sorted({int(client), *(int(v) for v in graph[client])}))


def unrecoverable(
    graph: Mapping[int, Iterable[int]],
    survivors: Iterable[int],
    dropped: Iterable[int],
    answered: Iterable[int],
    threshold: int,
) -> str | None:
    """Why the sum of ``survivors``' masked inputs cannot be unmasked, or must not be, or None.

    ``survivors``: the clients whose masked input the server holds; ``dropped``: those that shared their keys but sent
    no masked input (their pairwise masks are in their neighbours' inputs); ``answered``: the clients that returned
    their shares in the unmasking stage; ``threshold``: ``t``. Each survivor's self-mask seed needs ``t`` shares from
    answering holders (itself included), each dropped client's key ``t`` shares from answering neighbours.

    The survivors must also be at least 2 and *connected* in the graph: the pairwise masks cancel within each
    connected group of survivors, so with a sparse graph that dropouts split, unmasking would give the server each
    group's own sum, a sum of a few clients with a few clients' noise, not the round's (Bell et al. choose ``k`` so
    that this happens with negligible probability; here it is checked, and such a round is aborted)."""
    alive = sorted({int(c) for c in survivors})
    if len(alive) < 2:
        return f"{len(alive)} client(s) survived: a sum needs at least 2"
    answered_set = {int(c) for c in answered}
    for u in alive:
        got = len(answered_set.intersection(holders(graph, u)))
        if got < threshold:
            return f"a surviving client's self mask has {got} of the {threshold} shares it needs"
    for v in sorted(int(c) for c in dropped):
        got = len(answered_set.intersection(int(x) for x in graph[v]))
        if got < threshold:
            return f"a dropped client's masks have {got} of the {threshold} shares they need"
    groups = _components(graph, alive)
    if groups > 1:
        return f"the survivors fall into {groups} groups with no neighbour in common: each group's sum would show"
    return None


def _components(graph: Mapping[int, Iterable[int]], nodes: list[int]) -> int:
    """How many connected components the subgraph of ``graph`` on ``nodes`` has."""
    inside = set(nodes)
    seen: set[int] = set()
    count = 0
    for start in nodes:
        if start in seen:
            continue
        count += 1
        stack = [start]
        seen.add(start)
        while stack:
            u = stack.pop()
            for v in graph[u]:
                v = int(v)
                if v in inside and v not in seen:
                    seen.add(v)
                    stack.append(v)
    return count
