"""Who may talk to whom in round r.

A :class:`Topology` turns a round number into a :class:`RoundPlan`: the nodes active in
that round and, for decentralised methods, the graph they exchange over. Three kinds:

- ``"star"`` (:class:`Star`): a server and ``num_clients`` clients; each round a sample
  of clients talks to the server. ``plan.participants`` are the sampled clients and
  ``plan.neighbors`` is empty (every link is client <-> :data:`SERVER`).
- ``"peer"`` (:class:`KRegular`, :class:`Ring`, :class:`Complete`,
  :class:`ErdosRenyi`): every node is active and exchanges with its neighbours in the
  round's undirected graph.
- ``"contact"`` (:class:`ContactPlan`): one-shot schedules in which each unordered pair
  meets at most once over the whole plan (FOL's model-collection rounds).

Randomness is addressed (design rule 4): round ``r``'s random graph or client sample
comes from ``np_gen(seed, "topology", r)``, so it does not depend on which other rounds
were computed or in which order, and a resumed run sees the same rounds as an
uninterrupted one. A random contact plan is drawn once, from
``np_gen(seed, "topology", "contact_plan")``, because its rounds depend on each other
(no pair may meet twice).

Node ids are ``0 .. num_nodes - 1``; the server, where there is one, is :data:`SERVER`.
"""

from __future__ import annotations

import csv
import math
import os
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from lowband.seeding import np_gen

from lowband.comm.message import SERVER  # the one definition of the server's node id

__all__ = [
    "SERVER",
    "REQUIRED",
    "RoundPlan",
    "Topology",
    "Star",
    "KRegular",
    "Ring",
    "Complete",
    "ErdosRenyi",
    "ContactPlan",
    "TOPOLOGIES",
    "build_topology",
    "mixing_matrix",
]

Pair = tuple[int, int]


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class RoundPlan:
    """Who is active in one round, and over which links.

    Attributes:
        round: The round this plan is for (0-based).
        participants: Sorted node ids active this round: the sampled clients for a star,
            every node for a peer graph, the nodes with at least one contact for a
            contact plan.
        neighbors: For peer graphs and contact plans, node -> sorted tuple of the nodes
            it exchanges with this round (undirected, no self loops). Every node
            ``0 .. n-1`` is a key (isolated nodes map to ``()``), so ``neighbors[i]``
            never raises. Empty for a star, whose links all go through the server.
        contacts: For contact plans, the unordered pairs ``(a, b)`` with ``a < b`` that
            meet this round, sorted. Empty for other kinds; use :attr:`edges` for the
            edge list of any plan.
    """

    round: int
    participants: tuple[int, ...]
    neighbors: Mapping[int, tuple[int, ...]] = field(hash=False)
    contacts: tuple[tuple[int, int], ...] = ()

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """The round's undirected links as sorted pairs ``(a, b)`` with ``a < b``.

        Derived from :attr:`neighbors`, so it is the graph's edge list for peer plans,
        equals :attr:`contacts` for contact plans, and is empty for a star.
        """
        return tuple(
            (a, b) for a in sorted(self.neighbors) for b in self.neighbors[a] if a < b
        )

    def degree(self, node: int) -> int:
        """Number of neighbours of ``node`` this round (0 for a star or an absent node)."""
        return len(self.neighbors.get(node, ()))


def _plan_from_edges(
    round: int, n: int, edges: np.ndarray, *, contact: bool = False
) -> RoundPlan:
    """Build a plan from an ``(m, 2)`` array of undirected edges over nodes ``0..n-1``.

    Peer plans list every node as a participant; contact plans (``contact=True``) list
    only nodes with at least one contact and also fill :attr:`RoundPlan.contacts`.
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    lo = np.minimum(edges[:, 0], edges[:, 1])
    hi = np.maximum(edges[:, 0], edges[:, 1])
    src = np.concatenate([lo, hi])
    dst = np.concatenate([hi, lo])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    counts = np.bincount(src, minlength=n)
    splits = np.split(dst, np.cumsum(counts)[:-1]) if n > 0 else []
    neighbors = MappingProxyType({i: tuple(splits[i].tolist()) for i in range(n)})
    if contact:
        participants = tuple(int(i) for i in np.flatnonzero(counts))
        pair_order = np.lexsort((hi, lo))
        contacts = tuple(zip(lo[pair_order].tolist(), hi[pair_order].tolist()))
        return RoundPlan(round, participants, neighbors, contacts)
    return RoundPlan(round, tuple(range(n)), neighbors)


# --------------------------------------------------------------------------- validation


def _is_int(value: Any) -> bool:
    """True for Python/numpy integers, False for bools and everything else."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_int(owner: str, name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as an int in ``[lo, hi]`` or raise a one-line ValueError."""
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    if not _is_int(value) or value < lo or (hi is not None and value > hi):
        raise ValueError(f"{owner}: {name} must be {allowed}, got {value!r}")
    return int(value)


def _check_prob(owner: str, name: str, value: Any, *, open_low: bool) -> float:
    """Return ``value`` as a float in ``(0, 1]`` (``open_low``) or ``[0, 1]``."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = (0.0 < v if open_low else 0.0 <= v) and v <= 1.0 and math.isfinite(v)
    if not ok:
        rng = "(0, 1]" if open_low else "[0, 1]"
        raise ValueError(f"{owner}: {name} must be a number in {rng}, got {value!r}")
    return float(value)


def _check_bool(owner: str, name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool, else raise (no truthy strings like "false")."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{owner}: {name} must be true or false, got {value!r}")
    return bool(value)


# --------------------------------------------------------------------------- base


class Topology(ABC):
    """Maps a round number to a :class:`RoundPlan`.

    Subclasses implement :meth:`_plan`; :meth:`plan` validates the round and keeps the
    most recent plan, because the simulator and the algorithm often ask for the same
    round more than once. Plans are pure functions of the constructor arguments and the
    round, so caching never changes a result.
    """

    num_nodes: int
    kind: str  # "star" | "peer" | "contact"

    def plan(self, round: int) -> RoundPlan:
        """The plan for ``round`` (a non-negative integer)."""
        r = _check_int(type(self).__name__, "round", round, 0)
        cached = getattr(self, "_last_plan", None)
        if cached is not None and cached.round == r:
            return cached
        plan = self._plan(r)
        self._last_plan = plan
        return plan

    @abstractmethod
    def _plan(self, round: int) -> RoundPlan:
        """Compute the plan for a validated round."""

    @abstractmethod
    def describe(self) -> str:
        """One line saying what this topology is, for logs and ``lowband list``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}>"


def same_graph(base: RoundPlan, round: int) -> RoundPlan:
    """``base``'s participants and graph as round ``round``'s plan (a graph that does not change)."""
    return RoundPlan(round, base.participants, base.neighbors)


class DrawnGraph(Topology):
    """A peer graph drawn by :meth:`_draw` from round ``r``'s generator; with
    ``time_varying=False`` round 0's graph every round, drawn once and kept."""

    time_varying: bool
    _static: Optional[RoundPlan] = None

    def _plan(self, round: int) -> RoundPlan:
        if self.time_varying:
            return self._draw(round)
        if self._static is None:
            self._static = self._draw(0)
        return same_graph(self._static, round)

    @abstractmethod
    def _draw(self, round: int) -> RoundPlan:
        """Round ``round``'s graph."""


# --------------------------------------------------------------------------- star

_SAMPLINGS = ("all", "fraction", "count", "list", "poisson")


class Star(Topology):
    """A server and ``num_clients`` clients; some clients take part in each round.

    Sampling modes:

    - ``"all"``: every client, every round.
    - ``"fraction"``: ``max(1, round(fraction * num_clients))`` clients drawn uniformly
      without replacement, afresh each round (FedAvg's ``C``; rounded rather than
      truncated so that e.g. 0.29 * 100 gives 29, not 28 from float error).
    - ``"count"``: ``count`` clients drawn uniformly without replacement each round.
    - ``"list"``: round ``r`` uses ``schedule[r % len(schedule)]`` (a fixed, cycling
      schedule, e.g. to replay a paper's participation trace).
    - ``"poisson"``: each client takes part independently with probability ``q =
      fraction`` (Poisson sampling, the sampling event DP-SGD and DP-FedAvg accountants
      amplify by); the cohort size varies and may be 0. ``per_round`` is the expected
      cohort ``round(q * num_clients)`` (at least 1).

    Each round's sample comes from ``np_gen(seed, "topology", r)``.
    """

    kind = "star"

    def __init__(
        self,
        num_clients: int,
        sampling: str = "all",
        fraction: float = 0.1,
        count: int = 10,
        schedule: Sequence[Sequence[int]] | None = None,
        seed: int = 0,
    ) -> None:
        self.num_nodes = _check_int("Star", "num_clients", num_clients, 1)
        if sampling not in _SAMPLINGS:
            raise ValueError(
                f"Star: sampling must be one of {', '.join(_SAMPLINGS)}, got {sampling!r}"
            )
        self.sampling = sampling
        self.seed = _check_int("Star", "seed", seed, 0)
        self.fraction = fraction
        self.count = count
        self.schedule: tuple[tuple[int, ...], ...] | None = None
        if sampling in ("fraction", "poisson"):
            self.fraction = _check_prob("Star", "fraction", fraction, open_low=True)
            self.per_round = max(1, int(round(self.fraction * self.num_nodes)))
        elif sampling == "count":
            self.count = _check_int("Star", "count", count, 1, self.num_nodes)
            self.per_round = self.count
        elif sampling == "list":
            self.schedule = self._check_schedule(schedule)
            self.per_round = -1
        else:
            self.per_round = self.num_nodes
        if sampling != "list" and schedule is not None:
            raise ValueError(
                f"Star: schedule is only used with sampling='list', got sampling={sampling!r}"
            )

    def _check_schedule(self, schedule: Any) -> tuple[tuple[int, ...], ...]:
        """Validate a participation schedule: non-empty rounds of distinct, in-range ids."""
        if schedule is None or isinstance(schedule, (str, bytes)) or len(schedule) == 0:
            raise ValueError(
                "Star: sampling='list' needs schedule, a non-empty list of lists of client ids"
            )
        out = []
        for e, ids in enumerate(schedule):
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise ValueError(f"Star: schedule[{e}] must be a list of client ids, got {ids!r}")
            ids = list(ids)
            if not ids:
                raise ValueError(f"Star: schedule[{e}] is empty; each round needs >= 1 client")
            for c in ids:
                if not _is_int(c) or not 0 <= c < self.num_nodes:
                    raise ValueError(
                        f"Star: schedule[{e}] has client id {c!r}; ids must be integers in "
                        f"[0, {self.num_nodes - 1}]"
                    )
            if len(set(ids)) != len(ids):
                raise ValueError(f"Star: schedule[{e}] lists a client more than once: {ids}")
            out.append(tuple(sorted(int(c) for c in ids)))
        return tuple(out)

    def _plan(self, round: int) -> RoundPlan:
        n = self.num_nodes
        if self.sampling == "all":
            participants: tuple[int, ...] = tuple(range(n))
        elif self.sampling == "list":
            assert self.schedule is not None
            participants = self.schedule[round % len(self.schedule)]
        elif self.sampling == "poisson":
            draws = np_gen(self.seed, "topology", round).random(n)
            participants = tuple(int(c) for c in np.flatnonzero(draws < self.fraction))
        else:
            rng = np_gen(self.seed, "topology", round)
            chosen = rng.choice(n, size=self.per_round, replace=False)
            participants = tuple(sorted(int(c) for c in chosen))
        return RoundPlan(round, participants, MappingProxyType({}))

    def describe(self) -> str:
        n = self.num_nodes
        if self.sampling == "all":
            how = "all clients every round"
        elif self.sampling == "fraction":
            how = f"{self.per_round} sampled uniformly per round (fraction={self.fraction:g})"
        elif self.sampling == "count":
            how = f"{self.per_round} sampled uniformly per round"
        elif self.sampling == "poisson":
            how = f"each client independently with probability {self.fraction:g} per round (Poisson)"
        else:
            assert self.schedule is not None
            how = f"fixed schedule of {len(self.schedule)} rounds, cycled"
        return f"star: server + {n} clients, {how}, seed={self.seed}"


# --------------------------------------------------------------------------- peer graphs


def _random_regular_edges(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Edges of a random simple ``k``-regular graph on ``n`` nodes, as an ``(n*k/2, 2)`` array.

    Steger-Wormald style pairing (the method behind networkx's random_regular_graph):
    shuffle the ``n*k`` stubs and pair them up, keep the pairs that form a new simple
    edge, and re-pair only the leftover stubs; restart from scratch if the leftovers can
    no longer be matched. Asymptotically uniform for small ``k``, and unlike the plain
    configuration model (which for k=5 accepts only ~e^-6 of its pairings) it succeeds
    in one or two attempts, about a millisecond for n=300, k=5. For ``k > (n-1)/2`` the
    complement of an ``(n-1-k)``-regular graph is drawn instead, which stays fast and is
    uniform whenever the complement's draw is.
    """
    if k == 0:
        return np.empty((0, 2), dtype=np.int64)
    if k > (n - 1) / 2:
        comp = _random_regular_edges(n, n - 1 - k, rng)
        adj = ~np.eye(n, dtype=bool)
        adj[comp[:, 0], comp[:, 1]] = False
        adj[comp[:, 1], comp[:, 0]] = False
        a, b = np.nonzero(np.triu(adj, 1))
        return np.stack([a, b], axis=1).astype(np.int64)

    for _attempt in range(1000):
        edges = _try_regular_pairing(n, k, rng)
        if edges is not None:
            return np.array(sorted(edges), dtype=np.int64)
    raise RuntimeError(  # pragma: no cover - practically impossible for valid (n, k)
        f"could not draw a simple {k}-regular graph on {n} nodes in 1000 attempts"
    )


def _try_regular_pairing(n: int, k: int, rng: np.random.Generator) -> set[Pair] | None:
    """One attempt of the incremental pairing; ``None`` when it gets stuck."""
    edges: set[Pair] = set()
    stubs = np.repeat(np.arange(n), k)
    for _pass in range(100):
        perm = rng.permutation(stubs).tolist()
        leftover: dict[int, int] = defaultdict(int)
        for a, b in zip(perm[0::2], perm[1::2]):
            if a > b:
                a, b = b, a
            if a != b and (a, b) not in edges:
                edges.add((a, b))
            else:
                leftover[a] += 1
                leftover[b] += 1
        if not leftover:
            return edges
        # Every leftover node must still have some leftover partner it is not yet joined
        # to; otherwise no re-pairing can succeed and we start over.
        nodes = list(leftover)
        for a in nodes:
            if not any(b != a and (min(a, b), max(a, b)) not in edges for b in nodes):
                return None
        stubs = np.repeat(np.array(nodes), [leftover[a] for a in nodes])
    return None


class KRegular(DrawnGraph):
    """A random simple ``k``-regular graph on ``n`` nodes, fresh every round by default.

    Every node has exactly ``k`` distinct neighbours, no self loops, no multi-edges; the
    graph need not be connected (NTK-DFL draws a random 5-regular graph per round). Round
    ``r``'s graph comes from ``np_gen(seed, "topology", r)``; with ``time_varying=False``
    every round uses round 0's graph. Requires ``0 <= k < n`` and ``n * k`` even.
    """

    kind = "peer"

    def __init__(self, n: int, k: int, time_varying: bool = True, seed: int = 0) -> None:
        self.num_nodes = _check_int("KRegular", "n", n, 1)
        self.k = _check_int("KRegular", "k", k, 0, self.num_nodes - 1)
        if (self.num_nodes * self.k) % 2:
            raise ValueError(
                f"KRegular: n * k must be even for a k-regular graph to exist, "
                f"got n={self.num_nodes}, k={self.k}"
            )
        self.time_varying = _check_bool("KRegular", "time_varying", time_varying)
        self.seed = _check_int("KRegular", "seed", seed, 0)

    def _draw(self, round: int) -> RoundPlan:
        rng = np_gen(self.seed, "topology", round)
        edges = _random_regular_edges(self.num_nodes, self.k, rng)
        return _plan_from_edges(round, self.num_nodes, edges)

    def describe(self) -> str:
        when = "fresh every round" if self.time_varying else "fixed (round 0's graph)"
        return f"peer: random {self.k}-regular graph on {self.num_nodes} nodes, {when}, seed={self.seed}"


class Ring(Topology):
    """Node ``i`` is linked to ``i±1, ..., i±k`` (mod ``n``): degree exactly ``2k``.

    Requires ``1 <= k <= (n-1)//2`` so that the ``2k`` neighbours are distinct; for
    denser graphs use :class:`Complete`. The same graph every round.
    """

    kind = "peer"

    def __init__(self, n: int, k: int = 1) -> None:
        self.num_nodes = _check_int("Ring", "n", n, 3)
        self.k = _check_int("Ring", "k", k, 1, (self.num_nodes - 1) // 2)
        i = np.arange(self.num_nodes)
        self._edges = np.concatenate(
            [np.stack([i, (i + j) % self.num_nodes], axis=1) for j in range(1, self.k + 1)]
        )
        self._base = _plan_from_edges(0, self.num_nodes, self._edges)

    def _plan(self, round: int) -> RoundPlan:
        return same_graph(self._base, round)

    def describe(self) -> str:
        return f"peer: ring of {self.num_nodes} nodes, {self.k} neighbour(s) on each side"


class Complete(Topology):
    """Every node is linked to every other node, every round."""

    kind = "peer"

    def __init__(self, n: int) -> None:
        self.num_nodes = _check_int("Complete", "n", n, 1)
        a, b = np.triu_indices(self.num_nodes, 1)
        self._base = _plan_from_edges(0, self.num_nodes, np.stack([a, b], axis=1))

    def _plan(self, round: int) -> RoundPlan:
        return same_graph(self._base, round)

    def describe(self) -> str:
        return f"peer: complete graph on {self.num_nodes} nodes"


class ErdosRenyi(DrawnGraph):
    """G(n, p): each of the ``n(n-1)/2`` possible edges present independently with prob. ``p``.

    Fresh every round from ``np_gen(seed, "topology", r)``, or round 0's graph every round
    with ``time_varying=False``. Isolated nodes are possible (they map to ``()``).
    """

    kind = "peer"

    def __init__(self, n: int, p: float, time_varying: bool = True, seed: int = 0) -> None:
        self.num_nodes = _check_int("ErdosRenyi", "n", n, 1)
        self.p = _check_prob("ErdosRenyi", "p", p, open_low=False)
        self.time_varying = _check_bool("ErdosRenyi", "time_varying", time_varying)
        self.seed = _check_int("ErdosRenyi", "seed", seed, 0)

    def _draw(self, round: int) -> RoundPlan:
        rng = np_gen(self.seed, "topology", round)
        a, b = np.triu_indices(self.num_nodes, 1)
        keep = rng.random(a.size) < self.p
        return _plan_from_edges(round, self.num_nodes, np.stack([a[keep], b[keep]], axis=1))

    def describe(self) -> str:
        when = "fresh every round" if self.time_varying else "fixed (round 0's graph)"
        return (
            f"peer: Erdos-Renyi G(n={self.num_nodes}, p={self.p:g}), {when}, seed={self.seed}"
        )


# --------------------------------------------------------------------------- contact plans


def _round_robin_matchings(n: int) -> list[list[Pair]]:
    """A 1-factorisation of K_n by the circle method.

    For even ``n``: ``n-1`` perfect matchings that together hold every pair exactly once.
    For odd ``n`` a dummy node is added, giving ``n`` matchings; the pair with the dummy
    is dropped, so in each matching exactly one node sits out.
    """
    m = n if n % 2 == 0 else n + 1
    fixed = m - 1
    matchings: list[list[Pair]] = []
    for i in range(m - 1):
        pairs = [(i, fixed)]
        for j in range(1, m // 2):
            pairs.append(((i + j) % (m - 1), (i - j) % (m - 1)))
        matchings.append([(min(a, b), max(a, b)) for a, b in pairs if a < n and b < n])
    return matchings


class ContactPlan(Topology):
    """A one-shot contact schedule: each unordered pair meets at most once over the plan.

    ``schedule[r]`` lists the pairs that meet in round ``r``. For round ``r``,
    ``plan(r).contacts`` are those pairs, ``neighbors`` maps every node to the peers it
    meets that round, and ``participants`` are the nodes with at least one contact.
    Rounds beyond the schedule have no contacts.

    Build one with :meth:`random` (FOL's default), :meth:`from_file` or
    :meth:`from_pairs`.
    """

    kind = "contact"

    def __init__(
        self, num_nodes: int, schedule: Sequence[Iterable[Sequence[int]]], *, source: str = "pairs"
    ) -> None:
        self.num_nodes = _check_int("ContactPlan", "num_nodes", num_nodes, 2)
        self.source = source
        if isinstance(schedule, (str, bytes)) or not hasattr(schedule, "__iter__"):
            raise ValueError(
                f"ContactPlan: schedule must be a list of rounds, each a list of (a, b) pairs, "
                f"got {type(schedule).__name__}"
            )
        seen: dict[Pair, int] = {}
        rounds: list[tuple[Pair, ...]] = []
        for r, pairs in enumerate(schedule):
            if isinstance(pairs, (str, bytes)) or not hasattr(pairs, "__iter__"):
                raise ValueError(f"ContactPlan: round {r} must be a list of (a, b) pairs, got {pairs!r}")
            this: list[Pair] = []
            for idx, pair in enumerate(pairs):
                key = self._check_pair(pair, f"ContactPlan: round {r} pair {idx}")
                if key in seen:
                    raise ValueError(
                        f"ContactPlan: round {r} pair {idx} {key} already met in round "
                        f"{seen[key]}; each pair may meet at most once"
                    )
                seen[key] = r
                this.append(key)
            rounds.append(tuple(sorted(this)))
        self.schedule: tuple[tuple[Pair, ...], ...] = tuple(rounds)
        self._plans = [
            _plan_from_edges(r, self.num_nodes, np.array(p, dtype=np.int64), contact=True)
            for r, p in enumerate(self.schedule)
        ]

    def _check_pair(self, pair: Any, where: str) -> Pair:
        """Validate one pair of distinct in-range ids; return it as ``(min, max)``."""
        try:
            a, b = pair
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a pair (a, b), got {pair!r}") from None
        n = self.num_nodes
        for v in (a, b):
            if not _is_int(v) or not 0 <= v < n:
                raise ValueError(f"{where}: node id {v!r} out of range; ids must be integers in [0, {n - 1}]")
        if a == b:
            raise ValueError(f"{where}: ({a}, {b}) pairs a node with itself")
        return (int(min(a, b)), int(max(a, b)))

    @property
    def num_rounds(self) -> int:
        """Number of rounds in the schedule (later rounds have no contacts)."""
        return len(self.schedule)

    def _plan(self, round: int) -> RoundPlan:
        if round < len(self._plans):
            return self._plans[round]
        return _plan_from_edges(round, self.num_nodes, np.empty((0, 2)), contact=True)

    def describe(self) -> str:
        per = [len(p) for p in self.schedule]
        return (
            f"contact: one-shot plan over {self.num_nodes} nodes, {self.num_rounds} rounds, "
            f"contacts per round {per}, from {self.source}"
        )

    # ---- constructors

    @classmethod
    def from_pairs(cls, n: int, rounds_pairs: Sequence[Iterable[Sequence[int]]]) -> "ContactPlan":
        """A plan from an explicit list: ``rounds_pairs[r]`` = pairs that meet in round r."""
        return cls(n, rounds_pairs, source="pairs")

    @classmethod
    def random(
        cls, n: int, rounds: int, per_round: int | Sequence[int], seed: int = 0
    ) -> "ContactPlan":
        """A seeded random schedule in which no pair meets twice.

        K_n's edges are split into perfect matchings (round-robin 1-factorisation; a
        dummy node for odd ``n``), the matchings are shuffled and the node labels
        randomly permuted with ``np_gen(seed, "topology", "contact_plan")``, and round
        ``e`` takes the next ``per_round[e]`` matchings. So in round ``e`` every node
        meets exactly ``per_round[e]`` peers it has never met (for odd ``n``, one fewer
        in the round holding its bye). ``sum(per_round)`` may not exceed the number of
        matchings: ``n-1`` for even ``n``, ``n`` for odd. FOL: ``n=70, rounds=3,
        per_round=[29, 20, 20]`` meets all 69 others exactly once.
        """
        n = _check_int("ContactPlan.random", "n", n, 2)
        rounds = _check_int("ContactPlan.random", "rounds", rounds, 1)
        seed = _check_int("ContactPlan.random", "seed", seed, 0)
        if _is_int(per_round):
            counts = [_check_int("ContactPlan.random", "per_round", per_round, 0)] * rounds
        elif isinstance(per_round, Sequence) and not isinstance(per_round, (str, bytes)):
            if len(per_round) != rounds:
                raise ValueError(
                    f"ContactPlan.random: per_round has {len(per_round)} entries but rounds={rounds}; "
                    f"give one count per round or a single integer"
                )
            counts = [
                _check_int("ContactPlan.random", f"per_round[{e}]", c, 0)
                for e, c in enumerate(per_round)
            ]
        else:
            raise ValueError(
                f"ContactPlan.random: per_round must be an integer or a list of integers, got {per_round!r}"
            )
        matchings = _round_robin_matchings(n)
        if sum(counts) > len(matchings):
            raise ValueError(
                f"ContactPlan.random: sum(per_round)={sum(counts)} exceeds the {len(matchings)} "
                f"contacts per node available among n={n} nodes without repeats"
            )
        rng = np_gen(seed, "topology", "contact_plan")
        order = rng.permutation(len(matchings))
        label = rng.permutation(n)
        schedule: list[list[Pair]] = []
        pos = 0
        for c in counts:
            pairs = []
            for mi in order[pos : pos + c]:
                pairs.extend((int(label[a]), int(label[b])) for a, b in matchings[mi])
            schedule.append(pairs)
            pos += c
        plan = cls(n, schedule, source=f"random(per_round={counts}, seed={seed})")
        return plan

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], n: int) -> "ContactPlan":
        """Read a CSV of ``round,a,b`` lines (0-based rounds; header line optional).

        Blank lines and lines starting with ``#`` are skipped. Rounds may appear in any
        order and may skip numbers (a skipped round has no contacts). Every problem is
        one ValueError naming ``path:line``: malformed line, id out of range, a node
        paired with itself, or a pair that already met (either order).
        """
        n = _check_int("ContactPlan.from_file", "n", n, 2)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"contact plan file not found: {path} (expected a CSV of round,a,b)")
        by_round: dict[int, list[Pair]] = defaultdict(list)
        seen: dict[Pair, tuple[int, int]] = {}
        first_content = True
        with open(path, newline="") as fh:
            for lineno, row in enumerate(csv.reader(fh), start=1):
                fields = [f.strip() for f in row]
                if not fields or all(f == "" for f in fields) or fields[0].startswith("#"):
                    continue
                where = f"{path}:{lineno}"
                if first_content:
                    first_content = False
                    if len(fields) == 3 and not any(_parses_int(f) for f in fields):
                        continue  # header, e.g. "round,a,b"
                if len(fields) != 3 or not all(_parses_int(f) for f in fields):
                    raise ValueError(
                        f"{where}: malformed line {','.join(row)!r}; expected 'round,a,b' with "
                        f"three integers"
                    )
                r, a, b = (int(f) for f in fields)
                if r < 0:
                    raise ValueError(f"{where}: round {r} is negative; rounds are 0-based")
                for v in (a, b):
                    if not 0 <= v < n:
                        raise ValueError(f"{where}: node id {v} out of range; ids must be in [0, {n - 1}]")
                if a == b:
                    raise ValueError(f"{where}: pair ({a}, {b}) pairs a node with itself")
                key = (min(a, b), max(a, b))
                if key in seen:
                    r0, line0 = seen[key]
                    raise ValueError(
                        f"{where}: pair {key} already met in round {r0} (line {line0}); "
                        f"each pair may meet at most once"
                    )
                seen[key] = (r, lineno)
                by_round[r].append(key)
        num_rounds = max(by_round) + 1 if by_round else 0
        schedule = [by_round.get(r, []) for r in range(num_rounds)]
        return cls(n, schedule, source=path)


def _parses_int(text: str) -> bool:
    """True when ``text`` is an optionally signed decimal integer."""
    t = text[1:] if text[:1] in "+-" else text
    return t.isdigit() and t.isascii()


# --------------------------------------------------------------------------- mixing


def mixing_matrix(plan: RoundPlan, n: int, weights: str = "uniform") -> np.ndarray:
    """The ``n x n`` gossip matrix of a round: row ``i`` says how node ``i`` averages.

    ``weights="uniform"`` (default; NTK-DFL and the DFL baselines): closed-neighbourhood
    mean, ``W[i, j] = 1 / (deg_i + 1)`` for ``j`` in ``N(i) ∪ {i}``. Row-stochastic;
    symmetric (hence doubly stochastic) only on regular graphs.
    ``weights="metropolis"``: ``W[i, j] = 1 / (1 + max(deg_i, deg_j))`` for neighbours,
    the rest on the diagonal; symmetric and doubly stochastic on any graph, so repeated
    gossip converges to the exact mean.
    A star plan (no neighbours) gives the identity.
    """
    n = _check_int("mixing_matrix", "n", n, 1)
    if weights not in ("uniform", "metropolis"):
        raise ValueError(f"mixing_matrix: weights must be 'uniform' or 'metropolis', got {weights!r}")
    nodes = set(plan.neighbors)
    for nb in plan.neighbors.values():
        nodes.update(nb)
    if nodes and (min(nodes) < 0 or max(nodes) >= n):
        raise ValueError(f"mixing_matrix: plan has node ids outside [0, {n - 1}] for n={n}")
    deg = np.zeros(n, dtype=np.int64)
    for i, nb in plan.neighbors.items():
        deg[i] = len(nb)
    W = np.zeros((n, n), dtype=np.float64)
    if weights == "uniform":
        for i in range(n):
            nb = plan.neighbors.get(i, ())
            W[i, list(nb) + [i]] = 1.0 / (deg[i] + 1)
    else:
        for i, nb in plan.neighbors.items():
            for j in nb:
                W[i, j] = 1.0 / (1 + max(deg[i], deg[j]))
        W[np.arange(n), np.arange(n)] = 1.0 - W.sum(axis=1)
    return W


# --------------------------------------------------------------------------- factory


class _Required:
    """Sentinel default for a parameter that has none (printed as ``<required>``)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()

TOPOLOGIES: dict[str, dict[str, Any]] = {
    "star": {
        "description": "server + clients; each round 'all', a 'fraction', a 'count' or a fixed "
        "'list' schedule of clients takes part, sampled uniformly without replacement, or "
        "'poisson': each client independently with probability fraction",
        "params": {"sampling": "all", "fraction": 0.1, "count": 10, "schedule": None},
    },
    "kregular": {
        "description": "random simple k-regular peer graph, fresh each round unless "
        "time_varying=false (NTK-DFL: k=5)",
        "params": {"k": 5, "time_varying": True},
    },
    "ring": {
        "description": "peer ring, each node linked to k neighbours on each side",
        "params": {"k": 1},
    },
    "complete": {
        "description": "every node linked to every other node",
        "params": {},
    },
    "erdos_renyi": {
        "description": "Erdos-Renyi G(n, p) peer graph, fresh each round unless time_varying=false",
        "params": {"p": REQUIRED, "time_varying": True},
    },
    "contact_plan": {
        "description": "one-shot contacts, each pair meets at most once: a seeded random plan "
        "(per_round contacts per node in each round; FOL: per_round=[29, 20, 20]) or a CSV "
        "file of round,a,b lines (path; topology.plan_file in a config)",
        "params": {"per_round": None, "rounds": None, "path": None},
    },
}


def _build_contact_plan(num_nodes: int, seed: int, per_round: Any, rounds: Any, path: Any) -> ContactPlan:
    """Factory branch for contact plans: exactly one of ``path`` or ``per_round``."""
    if (path is None) == (per_round is None):
        raise ValueError(
            "topology 'contact_plan' needs exactly one of path (a CSV of round,a,b) or "
            "per_round (contacts per node per round, for a random plan)"
        )
    if path is not None:
        if rounds is not None:
            raise ValueError("topology 'contact_plan': rounds is taken from the file when path is given; drop rounds")
        return ContactPlan.from_file(path, num_nodes)
    if rounds is None:
        if _is_int(per_round):
            raise ValueError(
                "topology 'contact_plan': rounds is required when per_round is a single integer"
            )
        rounds = len(per_round) if hasattr(per_round, "__len__") else per_round
    return ContactPlan.random(num_nodes, rounds, per_round, seed)


_BUILDERS: dict[str, Callable[..., Topology]] = {
    "star": lambda n, seed, **p: Star(n, seed=seed, **p),
    "kregular": lambda n, seed, **p: KRegular(n, seed=seed, **p),
    "ring": lambda n, seed, **p: Ring(n, **p),
    "complete": lambda n, seed, **p: Complete(n, **p),
    "erdos_renyi": lambda n, seed, **p: ErdosRenyi(n, seed=seed, **p),
    "contact_plan": lambda n, seed, **p: _build_contact_plan(n, seed, **p),
}


def build_topology(kind: str, num_nodes: int, seed: int, **params: Any) -> Topology:
    """Build a topology by name, e.g. ``build_topology("kregular", 300, seed=0, k=5)``.

    ``kind`` is one of :data:`TOPOLOGIES`; ``params`` are that kind's parameters (listed
    with their defaults in ``TOPOLOGIES[kind]["params"]``). An unknown kind, an unknown
    parameter or a missing required one is a one-line ValueError listing what is allowed.
    """
    if kind not in TOPOLOGIES:
        raise ValueError(f"unknown topology kind {kind!r}; allowed: {', '.join(TOPOLOGIES)}")
    spec = TOPOLOGIES[kind]["params"]
    unknown = sorted(set(params) - set(spec))
    if unknown:
        allowed = ", ".join(spec) if spec else "none"
        raise ValueError(
            f"topology {kind!r} does not take parameter(s) {', '.join(unknown)}; allowed: {allowed}"
        )
    full = {name: params.get(name, default) for name, default in spec.items()}
    missing = [name for name, v in full.items() if v is REQUIRED]
    if missing:
        raise ValueError(f"topology {kind!r} needs parameter(s) {', '.join(missing)}")
    return _BUILDERS[kind](num_nodes, seed, **full)
