"""Tests for lowband.topology: graph invariants, addressed seeding, contact plans, errors."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lowband.topology import (
    SERVER,
    TOPOLOGIES,
    Complete,
    ContactPlan,
    ErdosRenyi,
    KRegular,
    Ring,
    RoundPlan,
    Star,
    Topology,
    build_topology,
    mixing_matrix,
)


def check_simple_undirected(plan: RoundPlan, n: int) -> None:
    """Adjacency is symmetric, sorted, in range, with no self loops or repeated entries."""
    assert set(plan.neighbors) == set(range(n))
    for i, nb in plan.neighbors.items():
        assert list(nb) == sorted(set(nb)), f"node {i}: unsorted or repeated neighbours {nb}"
        assert i not in nb, f"self loop at {i}"
        for j in nb:
            assert 0 <= j < n
            assert i in plan.neighbors[j], f"asymmetric edge {i}->{j}"


def edge_set(plan: RoundPlan) -> set[tuple[int, int]]:
    return set(plan.edges)


# --------------------------------------------------------------------------- k-regular


@pytest.mark.parametrize("n,k", [(300, 5), (10, 3), (7, 2), (12, 11), (10, 8), (9, 0), (2, 1)])
def test_kregular_invariants(n: int, k: int) -> None:
    topo = KRegular(n, k, seed=3)
    assert topo.kind == "peer" and topo.num_nodes == n
    for r in range(5):
        plan = topo.plan(r)
        assert plan.round == r
        assert plan.participants == tuple(range(n))
        assert plan.contacts == ()
        check_simple_undirected(plan, n)
        assert all(len(nb) == k for nb in plan.neighbors.values())
        assert len(plan.edges) == n * k // 2


def test_kregular_time_varying_and_static() -> None:
    tv = KRegular(300, 5, time_varying=True, seed=0)
    graphs = [edge_set(tv.plan(r)) for r in range(4)]
    assert all(graphs[i] != graphs[j] for i in range(4) for j in range(i + 1, 4))

    st = KRegular(300, 5, time_varying=False, seed=0)
    first = edge_set(st.plan(0))
    assert all(edge_set(st.plan(r)) == first for r in (1, 7, 100))
    assert st.plan(7).round == 7
    # The static graph is round 0's graph of the time-varying topology with the same seed.
    assert first == graphs[0]


def test_kregular_seeded_and_order_independent() -> None:
    a, b = KRegular(300, 5, seed=11), KRegular(300, 5, seed=11)
    p5_first = a.plan(5)
    p3_second = a.plan(3)
    p3_first = b.plan(3)
    p5_second = b.plan(5)
    assert p5_first == p5_second
    assert p3_first == p3_second
    # A fresh object asked for round 5 only (as after a resume) agrees too.
    assert KRegular(300, 5, seed=11).plan(5) == p5_first
    # A different seed gives a different graph.
    assert edge_set(KRegular(300, 5, seed=12).plan(5)) != edge_set(p5_first)


def test_kregular_small_case_covers_all_graphs() -> None:
    # On 4 labelled nodes there are exactly three 2-regular graphs (4-cycles); by symmetry
    # a uniform sampler hits each about a third of the time.
    topo = KRegular(4, 2, seed=0)
    counts = Counter(tuple(topo.plan(r).edges) for r in range(600))
    assert len(counts) == 3
    assert all(150 <= c <= 250 for c in counts.values()), counts


@pytest.mark.parametrize(
    "args,match",
    [
        ((5, 3), "n \\* k must be even"),
        ((7, 1), "n \\* k must be even"),
        ((5, 5), "k must be an integer in \\[0, 4\\]"),
        ((5, -1), "k must be an integer"),
        ((0, 1), "n must be an integer >= 1"),
        ((6, 2.0), "k must be an integer"),
    ],
)
def test_kregular_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KRegular(*args)


def test_kregular_time_varying_must_be_bool() -> None:
    with pytest.raises(ValueError, match="time_varying must be true or false"):
        KRegular(10, 3, time_varying="no")  # type: ignore[arg-type]


def test_kregular_timing() -> None:
    topo = KRegular(300, 5, seed=0)
    topo.plan(0)  # warm up imports / caches
    times = []
    for r in range(1, 21):
        t0 = time.perf_counter()
        topo.plan(r)
        times.append(time.perf_counter() - t0)
    assert np.median(times) < 0.05, f"median plan time {np.median(times) * 1e3:.1f} ms"


def test_plan_rejects_bad_round() -> None:
    topo = Complete(4)
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="round must be an integer >= 0"):
            topo.plan(bad)  # type: ignore[arg-type]
    assert topo.plan(np.int64(2)).round == 2


# --------------------------------------------------------------------------- star


def test_star_all() -> None:
    topo = Star(20)
    assert topo.kind == "star" and topo.num_nodes == 20
    plan = topo.plan(4)
    assert plan.participants == tuple(range(20))
    assert dict(plan.neighbors) == {} and plan.contacts == () and plan.edges == ()
    assert SERVER == -1


@pytest.mark.parametrize(
    "kwargs,m",
    [
        ({"sampling": "count", "count": 10}, 10),
        ({"sampling": "fraction", "fraction": 0.1}, 10),
        ({"sampling": "fraction", "fraction": 0.29}, 29),
        ({"sampling": "fraction", "fraction": 0.001}, 1),
        ({"sampling": "fraction", "fraction": 1.0}, 100),
    ],
)
def test_star_sample_size(kwargs: dict, m: int) -> None:
    topo = Star(100, seed=5, **kwargs)
    for r in range(20):
        parts = topo.plan(r).participants
        assert len(parts) == m
        assert len(set(parts)) == m
        assert list(parts) == sorted(parts)
        assert all(0 <= c < 100 for c in parts)


def test_star_seeded_varies_and_order_independent() -> None:
    a = Star(100, sampling="count", count=10, seed=1)
    b = Star(100, sampling="count", count=10, seed=1)
    later_first = [a.plan(r).participants for r in (9, 3, 0)]
    in_order = [b.plan(r).participants for r in (0, 3, 9)]
    assert later_first == in_order[::-1]
    assert len({a.plan(r).participants for r in range(10)}) == 10
    assert Star(100, sampling="count", count=10, seed=2).plan(0) != a.plan(0)


def test_star_fraction_is_uniform() -> None:
    n, rounds = 50, 2000
    topo = Star(n, sampling="fraction", fraction=0.2, seed=0)
    freq = np.zeros(n)
    for r in range(rounds):
        freq[list(topo.plan(r).participants)] += 1
    freq /= rounds
    # Each client takes part with probability 0.2; sd of the estimate ~ 0.009.
    assert np.all(np.abs(freq - 0.2) < 0.04), freq


def test_star_list_cycles() -> None:
    topo = Star(6, sampling="list", schedule=[[3, 1], [0], [5, 4, 2]])
    assert [topo.plan(r).participants for r in range(7)] == [
        (1, 3), (0,), (2, 4, 5), (1, 3), (0,), (2, 4, 5), (1, 3)
    ]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"sampling": "some"}, "sampling must be one of all, fraction, count, list"),
        ({"sampling": "fraction", "fraction": 0.0}, "fraction must be a number in \\(0, 1\\]"),
        ({"sampling": "fraction", "fraction": 1.5}, "fraction must be a number in \\(0, 1\\]"),
        ({"sampling": "count", "count": 11}, "count must be an integer in \\[1, 10\\]"),
        ({"sampling": "count", "count": 0}, "count must be an integer in \\[1, 10\\]"),
        ({"sampling": "list"}, "needs schedule"),
        ({"sampling": "list", "schedule": [[0], []]}, "schedule\\[1\\] is empty"),
        ({"sampling": "list", "schedule": [[0, 10]]}, "schedule\\[0\\] has client id 10"),
        ({"sampling": "list", "schedule": [[1, 1]]}, "more than once"),
        ({"sampling": "all", "schedule": [[1]]}, "only used with sampling='list'"),
    ],
)
def test_star_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Star(10, **kwargs)


# --------------------------------------------------------------------------- ring, complete, ER


@pytest.mark.parametrize("n,k", [(3, 1), (10, 1), (10, 3), (11, 5)])
def test_ring_degrees(n: int, k: int) -> None:
    plan = Ring(n, k).plan(2)
    check_simple_undirected(plan, n)
    assert all(len(nb) == 2 * k for nb in plan.neighbors.values())
    assert set(plan.neighbors[0]) == {j % n for d in range(1, k + 1) for j in (d, -d)}
    assert Ring(n, k).plan(9).neighbors == plan.neighbors


def test_ring_errors() -> None:
    with pytest.raises(ValueError, match="k must be an integer in \\[1, 4\\]"):
        Ring(10, 5)
    with pytest.raises(ValueError, match="n must be an integer >= 3"):
        Ring(2)


@pytest.mark.parametrize("n", [1, 2, 9])
def test_complete_degrees(n: int) -> None:
    plan = Complete(n).plan(0)
    check_simple_undirected(plan, n)
    assert all(len(nb) == n - 1 for nb in plan.neighbors.values())
    assert len(plan.edges) == n * (n - 1) // 2


def test_erdos_renyi_density_and_seeding() -> None:
    n, p = 200, 0.05
    topo = ErdosRenyi(n, p, seed=4)
    total = n * (n - 1) // 2
    densities = []
    for r in range(5):
        plan = topo.plan(r)
        check_simple_undirected(plan, n)
        densities.append(len(plan.edges) / total)
    # sd of one round's density ~ sqrt(p(1-p)/total) ~ 0.0016
    assert abs(np.mean(densities) - p) < 0.005
    assert edge_set(topo.plan(0)) != edge_set(topo.plan(1))
    assert ErdosRenyi(n, p, seed=4).plan(3) == topo.plan(3)
    static = ErdosRenyi(n, p, time_varying=False, seed=4)
    assert edge_set(static.plan(6)) == edge_set(static.plan(0)) == edge_set(topo.plan(0))
    assert ErdosRenyi(10, 0.0).plan(0).edges == ()
    assert len(ErdosRenyi(10, 1.0).plan(0).edges) == 45
    with pytest.raises(ValueError, match="p must be a number in \\[0, 1\\]"):
        ErdosRenyi(10, 1.2)


# --------------------------------------------------------------------------- contact plans


def check_contact_plan(
    plan: ContactPlan, n: int, per_round: list[int]
) -> tuple[Counter[tuple[int, int]], Counter[int]]:
    met: Counter[tuple[int, int]] = Counter()
    total: Counter[int] = Counter()
    for e, c in enumerate(per_round):
        rp = plan.plan(e)
        check_simple_undirected(rp, n)
        assert rp.contacts == rp.edges
        assert all(a < b for a, b in rp.contacts)
        for node in range(n):
            assert len(rp.neighbors[node]) == c
            total[node] += c
        assert rp.participants == (tuple(range(n)) if c else ())
        met.update(rp.contacts)
    assert max(met.values()) == 1, "a pair met twice"
    return met, total


def test_contact_plan_fol() -> None:
    n, per_round = 70, [29, 20, 20]
    plan = ContactPlan.random(n, 3, per_round, seed=0)
    assert plan.kind == "contact" and plan.num_nodes == n and plan.num_rounds == 3
    met, total = check_contact_plan(plan, n, per_round)
    assert len(met) == n * (n - 1) // 2  # everyone met everyone
    for node in range(n):
        peers = set()
        for e in range(3):
            peers.update(plan.plan(e).neighbors[node])
        assert len(peers) == 69 and node not in peers
    # Beyond the schedule: no contacts.
    late = plan.plan(3)
    assert late.contacts == () and late.participants == () and late.round == 3
    assert all(nb == () for nb in late.neighbors.values())


def test_contact_plan_random_is_seeded() -> None:
    a = ContactPlan.random(70, 3, [29, 20, 20], seed=0)
    b = ContactPlan.random(70, 3, [29, 20, 20], seed=0)
    c = ContactPlan.random(70, 3, [29, 20, 20], seed=1)
    assert a.schedule == b.schedule
    assert a.plan(0).contacts != c.plan(0).contacts


def test_contact_plan_random_partial_and_odd() -> None:
    plan = ContactPlan.random(20, 4, 3, seed=2)
    check_contact_plan(plan, 20, [3, 3, 3, 3])
    # Odd n: a dummy node; each node gets per_round contacts, or one fewer in its bye round.
    odd = ContactPlan.random(9, 3, [3, 3, 3], seed=0)
    met = Counter()
    for e in range(3):
        rp = odd.plan(e)
        check_simple_undirected(rp, 9)
        assert all(len(nb) in (2, 3) for nb in rp.neighbors.values())
        met.update(rp.contacts)
    assert len(met) == 9 * 8 // 2 and max(met.values()) == 1


@pytest.mark.parametrize(
    "args,match",
    [
        ((70, 3, [30, 20, 20]), "sum\\(per_round\\)=70 exceeds the 69"),
        ((70, 3, [29, 20]), "per_round has 2 entries but rounds=3"),
        ((70, 3, [29, -1, 20]), "per_round\\[1\\] must be an integer >= 0"),
        ((70, 0, 5), "rounds must be an integer >= 1"),
        ((70, 2, "5"), "per_round must be an integer or a list"),
    ],
)
def test_contact_plan_random_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ContactPlan.random(*args)


def test_contact_plan_from_pairs() -> None:
    plan = ContactPlan.from_pairs(4, [[(1, 0), (2, 3)], [], [(0, 2)]])
    assert plan.plan(0).contacts == ((0, 1), (2, 3))
    assert plan.plan(0).neighbors[1] == (0,)
    assert plan.plan(1).participants == ()
    assert plan.plan(2).participants == (0, 2)
    assert plan.plan(2).neighbors[1] == ()
    with pytest.raises(ValueError, match="round 2 pair 0 \\(0, 1\\) already met in round 0"):
        ContactPlan.from_pairs(4, [[(0, 1)], [], [(1, 0)]])
    with pytest.raises(ValueError, match="round 0 pair 1: node id 4 out of range"):
        ContactPlan.from_pairs(4, [[(0, 1), (2, 4)]])
    with pytest.raises(ValueError, match="pairs a node with itself"):
        ContactPlan.from_pairs(4, [[(2, 2)]])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.csv"
    path.write_text(text)
    return path


def test_contact_plan_from_file(tmp_path: Path) -> None:
    path = write(tmp_path, "round,a,b\n0,0,1\n# comment\n\n2,3,1\n0, 2 ,3\n")
    plan = ContactPlan.from_file(path, 4)
    assert plan.num_rounds == 3
    assert plan.plan(0).contacts == ((0, 1), (2, 3))
    assert plan.plan(1).contacts == ()
    assert plan.plan(2).contacts == ((1, 3),)
    # Header optional.
    no_header = ContactPlan.from_file(write(tmp_path, "0,0,1\n1,1,2\n"), 3)
    assert no_header.plan(1).contacts == ((1, 2),)


@pytest.mark.parametrize(
    "text,match",
    [
        ("round,a,b\n0,0,1\n1,2,3\n2,1,0\n", r"plan\.csv:4: pair \(0, 1\) already met in round 0 \(line 2\)"),
        ("0,0,1\n0,1,9\n", r"plan\.csv:2: node id 9 out of range"),
        ("0,0,1\n1,2\n", r"plan\.csv:2: malformed line"),
        ("0,0,1\n1,x,2\n", r"plan\.csv:2: malformed line"),
        ("x,0,1\n", r"plan\.csv:1: malformed line"),
        ("0,0,1\n-1,2,3\n", r"plan\.csv:2: round -1 is negative"),
        ("0,2,2\n", r"plan\.csv:1: pair \(2, 2\) pairs a node with itself"),
    ],
)
def test_contact_plan_from_file_errors(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        ContactPlan.from_file(write(tmp_path, text), 4)
    assert "\n" not in str(info.value)


def test_contact_plan_from_file_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="contact plan file not found"):
        ContactPlan.from_file(tmp_path / "nope.csv", 4)


# --------------------------------------------------------------------------- mixing matrix


def test_mixing_matrix_uniform() -> None:
    plan = ContactPlan.from_pairs(4, [[(0, 1), (0, 2), (0, 3)]]).plan(0)  # a star graph
    W = mixing_matrix(plan, 4)
    np.testing.assert_allclose(W.sum(axis=1), 1.0)
    np.testing.assert_allclose(W[0], [0.25] * 4)
    np.testing.assert_allclose(W[1], [0.5, 0.5, 0, 0])
    # On a regular graph the uniform matrix is symmetric and doubly stochastic, and
    # repeated gossip over a connected graph reaches the mean.
    ring = mixing_matrix(Ring(8, 1).plan(0), 8)
    np.testing.assert_allclose(ring, ring.T)
    x = np.arange(8.0)
    np.testing.assert_allclose(np.linalg.matrix_power(ring, 200) @ x, x.mean())
    # A star round (no peer links) leaves everyone alone.
    np.testing.assert_allclose(mixing_matrix(Star(5).plan(0), 5), np.eye(5))


def test_mixing_matrix_metropolis_is_doubly_stochastic() -> None:
    plan = ErdosRenyi(30, 0.2, seed=1).plan(0)
    W = mixing_matrix(plan, 30, weights="metropolis")
    np.testing.assert_allclose(W, W.T)
    np.testing.assert_allclose(W.sum(axis=0), 1.0)
    np.testing.assert_allclose(W.sum(axis=1), 1.0)
    assert (W >= 0).all()
    with pytest.raises(ValueError, match="weights must be 'uniform' or 'metropolis'"):
        mixing_matrix(plan, 30, weights="max")
    with pytest.raises(ValueError, match="outside \\[0, 9\\]"):
        mixing_matrix(plan, 10)


# --------------------------------------------------------------------------- factory


def test_build_topology_kinds() -> None:
    assert isinstance(build_topology("star", 100, 0, sampling="count", count=10), Star)
    kr = build_topology("kregular", 300, 7)
    assert isinstance(kr, KRegular) and kr.k == 5
    assert kr.plan(2) == KRegular(300, 5, seed=7).plan(2)
    assert isinstance(build_topology("ring", 10, 0, k=2), Ring)
    assert isinstance(build_topology("complete", 5, 0), Complete)
    assert isinstance(build_topology("erdos_renyi", 20, 0, p=0.3), ErdosRenyi)
    cp = build_topology("contact_plan", 70, 3, per_round=[29, 20, 20])
    assert isinstance(cp, ContactPlan) and cp.num_rounds == 3
    assert cp.schedule == ContactPlan.random(70, 3, [29, 20, 20], seed=3).schedule
    cp2 = build_topology("contact_plan", 10, 0, per_round=2, rounds=4)
    assert cp2.num_rounds == 4
    for kind in TOPOLOGIES:
        assert TOPOLOGIES[kind]["description"]
        assert isinstance(TOPOLOGIES[kind]["params"], dict)


def test_build_topology_from_file(tmp_path: Path) -> None:
    path = write(tmp_path, "0,0,1\n")
    cp = build_topology("contact_plan", 3, 0, path=str(path))
    assert cp.plan(0).contacts == ((0, 1),)


@pytest.mark.parametrize(
    "kind,params,match",
    [
        ("mesh", {}, "unknown topology kind 'mesh'; allowed: star, kregular, ring, complete, "
         "erdos_renyi, contact_plan"),
        ("ring", {"p": 0.1}, "topology 'ring' does not take parameter\\(s\\) p; allowed: k"),
        ("complete", {"k": 2}, "does not take parameter\\(s\\) k; allowed: none"),
        ("erdos_renyi", {}, "topology 'erdos_renyi' needs parameter\\(s\\) p"),
        ("contact_plan", {}, "needs exactly one of path"),
        ("contact_plan", {"per_round": 3}, "rounds is required"),
        ("kregular", {"k": 3}, "n \\* k must be even"),
        ("star", {"sampling": "fraction", "fraction": 2}, "fraction must be a number"),
    ],
)
def test_build_topology_errors(kind: str, params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        build_topology(kind, 11, 0, **params)
    assert "\n" not in str(info.value)


def test_describe_and_base_class() -> None:
    for topo in (
        Star(10, sampling="count", count=3),
        KRegular(10, 3),
        Ring(5),
        Complete(3),
        ErdosRenyi(5, 0.5),
        ContactPlan.random(6, 1, 5),
    ):
        assert isinstance(topo, Topology)
        text = topo.describe()
        assert text.startswith(topo.kind) and "\n" not in text
        assert topo.describe() in repr(topo)


def test_written_config_of_a_ring_with_k_unset_rebuilds_the_same_ring() -> None:
    """config.toml (Experiment.to_toml) is what --resume and a re-run read: a ring whose k
    was left out (the builder's 1) must not come back as the schema's k-regular default 5."""
    import tomllib

    from lowband.config import validate
    from lowband.engine.simulator import make_topology

    exp = validate({"algorithm": {"name": "dfedavg"}, "topology": {"kind": "ring"}})
    again = validate(tomllib.loads(exp.to_toml()))
    a, b = make_topology(exp, "peer", 8).plan(0), make_topology(again, "peer", 8).plan(0)
    assert a.neighbors == b.neighbors
    assert all(len(a.neighbors[i]) == 2 for i in range(8))  # k = 1: one neighbour each side
