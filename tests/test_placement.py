"""Balanced placement (lowband.engine.placement): a round's unevenly spread actors are
spread evenly over the places, deterministically, moving few nodes; an even round moves
none. The end-to-end checks (visiting nodes give the serial bytes) are in tests/test_pool.py."""

from __future__ import annotations

from lowband.engine.placement import MIN_GAIN, balanced_placement, makespan, node_work
from lowband.engine.rounds import place_of


def _home(n: int) -> int:
    return place_of(n, 100, 2)  # clients 0-49 at place 0, 50-99 at place 1


def test_skewed_cohort_is_balanced() -> None:
    """FedAvg's case: 10 sampled clients of 100, 7 of them (and most samples) in the first
    block. At home the busier place has ~75% of the work; balanced, it has at most the
    optimum plus the smallest node's work, and the result is the same on every call."""
    sizes = {2: 900, 8: 700, 15: 650, 21: 600, 33: 500, 40: 450, 47: 300, 55: 350, 71: 250, 93: 200}
    work = {n: node_work(s) for n, s in sizes.items()}
    total = sum(work.values())
    home = makespan(work, _home, 2)
    assert home > 0.7 * total
    away = balanced_placement(work, _home, 2)
    assert away and all(_home(n) != p for n, p in away.items())
    got = makespan(work, lambda n: away.get(n, _home(n)), 2)
    assert got <= total / 2 + min(work.values()) and got < 0.55 * total
    assert balanced_placement(work, _home, 2) == away  # deterministic


def test_even_cohort_stays_home() -> None:
    """Equal work at both homes: nobody moves (a visit ships a state there and back)."""
    work = {n: node_work(400) for n in (1, 2, 3, 60, 61, 62)}
    assert balanced_placement(work, _home, 2) == {}
    # a gain below MIN_GAIN is not worth the moves
    work = {1: node_work(1000), 60: node_work(1000 * (1 - MIN_GAIN / 2))}
    assert balanced_placement(work, _home, 2) == {}


def test_many_places_and_one() -> None:
    """Four places, every actor at home 0: spread over all four; one place: no moves."""
    work = {n: node_work(300) for n in range(8)}
    away = balanced_placement(work, lambda n: 0, 4)
    loads = [sum(w for n, w in work.items() if away.get(n, 0) == p) for p in range(4)]
    assert loads == [2 * node_work(300)] * 4
    assert balanced_placement(work, lambda n: 0, 1) == {}
