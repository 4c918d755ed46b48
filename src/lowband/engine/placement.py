"""Balanced placement: which place runs each node's calls in one round.

Nodes have a *home* place (contiguous blocks, :func:`lowband.engine.rounds.place_of`)
where their state, codec states and data live between rounds. A round whose actors are
unevenly spread over the homes (FedAvg samples 10 of 100 clients: the busier of two
workers gets 62-67% of the round's training samples) waits for the busiest place, so a
sharded backend may let some actors *visit* another place for the round
(:meth:`lowband.engine.rounds.ShardedExecutor.begin_round`). This module only decides
where; moving the states is the backend's.

The decision is a pure function of the round's work estimate, the homes and the number
of places, so it is deterministic. It never changes results: a node computes the same
bits wherever it runs (design rule 4; tests/test_pool.py checks serial = pool with nodes
visiting). It keeps the home placement unless balancing shortens the round's busiest
place by at least :data:`MIN_GAIN`, and among equally good placements it prefers the one
that moves fewer nodes (every visit ships a state there and back).
"""

from __future__ import annotations

from typing import Callable

__all__ = ["MIN_GAIN", "balanced_placement", "makespan", "node_work"]

#: keep the home placement unless balancing shortens the busiest place's work by this share
MIN_GAIN = 0.05
#: the fixed cost of one node's step call (model load, messages), in training samples
CALL_OVERHEAD = 32


def node_work(n_train: int) -> float:
    """The estimated cost of one step call of a node with ``n_train`` training samples:
    local training is linear in the samples (epochs and batch size are the run's, the
    same for every node), plus a fixed per-call share."""
    return float(int(n_train) + CALL_OVERHEAD)


def makespan(work: dict[int, float], where: Callable[[int], int], num_places: int) -> float:
    """The busiest place's total work when node ``n`` runs on ``where(n)``."""
    load = [0.0] * num_places
    for n, w in work.items():
        load[where(n)] += w
    return max(load) if load else 0.0


def _lpt(work: dict[int, float], home: Callable[[int], int], num_places: int) -> dict[int, int]:
    """Longest processing time first: the heaviest node to the least loaded place (ties:
    its home, then the lowest index)."""
    load = [0.0] * num_places
    out: dict[int, int] = {}
    for n in sorted(work, key=lambda n: (-work[n], n)):
        h = home(n)
        j = min(range(num_places), key=lambda p: (load[p], p != h, p))
        out[n] = j
        load[j] += work[n]
    return out


def _improve(work: dict[int, float], home: Callable[[int], int], num_places: int) -> dict[int, int]:
    """From the homes, move one node at a time from the busiest place to the idlest, the
    node whose move best evens the two, while a move shortens the busiest place."""
    at = {n: home(n) for n in work}
    load = [0.0] * num_places
    for n, w in work.items():
        load[at[n]] += w
    for _ in range(len(work) * num_places):
        hi = max(range(num_places), key=lambda p: (load[p], -p))
        lo = min(range(num_places), key=lambda p: (load[p], p))
        gap = load[hi] - load[lo]
        cands = [n for n in work if at[n] == hi and 0 < work[n] < gap]
        if not cands:
            break
        n = min(cands, key=lambda m: (abs(gap - 2 * work[m]), m))
        at[n] = lo
        load[hi] -= work[n]
        load[lo] += work[n]
    return at


def balanced_placement(work: dict[int, float], home: Callable[[int], int], num_places: int,
                       min_gain: float = MIN_GAIN) -> dict[int, int]:
    """The nodes to run away from home this round: ``{node: place}`` (empty: all at home).

    ``work``: each acting node's estimated work (:func:`node_work`, summed over the steps
    it acts in). The better of longest-processing-time-first and single moves from the
    homes (busiest place first, then fewer moved nodes), kept only if it shortens the
    busiest place by ``min_gain`` of the home placement's."""
    if num_places <= 1 or len(work) <= 1:
        return {}
    base = makespan(work, home, num_places)
    best: dict[int, int] = {}
    best_key = (base, 0)
    for cand in (_lpt(work, home, num_places), _improve(work, home, num_places)):
        moved = {n: p for n, p in cand.items() if p != home(n)}
        key = (makespan(work, lambda n: cand[n], num_places), len(moved))
        if key < best_key:
            best, best_key = moved, key
    if best_key[0] > (1.0 - min_gain) * base:
        return {}
    return best
