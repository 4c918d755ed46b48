"""Faults as a feature: client dropout and stragglers with a round deadline (``[faults]``).

One place for every algorithm: the run's faults observer
(:class:`lowband.engine.observers.Faults`) asks :meth:`FaultModel.round` for round ``r``'s
:class:`RoundFaults`, narrows the round's plan with it and hands it to the round loop,
which leaves the dropped nodes out of every step and out of delivery; never inside an
algorithm:

- **Dropout.** A dropped node is offline for the whole round: it is removed from the
  round's plan (from the sampled clients of a star, from the peer graph and the contacts
  of a peer or contact plan, so nobody addresses it), from the actors of every step (it
  neither computes nor sends, and keeps its state), and nothing addressed to it is
  delivered. It sends nothing, so it costs no bytes. Node ``i`` drops out of round ``r``
  when ``u < dropout`` for ``u = np_gen(seed, "faults", "dropout", r).random(n)[i]``, or
  when ``[r, i]`` is in ``dropout_schedule``.
- **Stragglers.** With probability ``straggler`` a node is slow in a round: its reply
  takes ``1 + (slowdown - 1) * v`` time units (``v`` uniform in [0, 1)) where a normal
  reply takes 1. A reply later than ``deadline`` units is dropped: the late node still
  computes (its own state advances), its messages of that round cross the link and are
  counted in the ledger (they were sent), but they are not delivered. Draws come from
  ``np_gen(seed, "faults", "straggler", r)`` and ``np_gen(seed, "faults", "slowness", r)``.

The run reports per round ``faults/dropped`` (dropped nodes the round would have
involved) and ``faults/late`` (late nodes that sent at least one message, which then
went undelivered).

All decisions are functions of (seed, round, node): the same in every process and after
``--resume``. The server never drops out and is never late. Round numbers are the
simulator's (1-based).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Optional, Sequence

import numpy as np

from lowband.comm.message import SERVER
from lowband.seeding import np_gen
from lowband.topology import RoundPlan

__all__ = ["FaultModel", "RoundFaults", "NO_FAULTS", "dropped_count"]


@dataclass(frozen=True)
class RoundFaults:
    """The faults of one round: ``dropped`` nodes are offline, ``late`` nodes' messages are
    counted but not delivered."""

    round: int
    dropped: frozenset[int] = frozenset()
    late: frozenset[int] = frozenset()

    @property
    def any(self) -> bool:
        return bool(self.dropped or self.late)

    def apply(self, plan: RoundPlan) -> RoundPlan:
        """``plan`` without the dropped nodes (and without their links and contacts)."""
        if not self.dropped:
            return plan
        gone = self.dropped
        participants = tuple(p for p in plan.participants if p not in gone)
        neighbors = MappingProxyType({i: (() if i in gone else tuple(j for j in nb if j not in gone))
                                      for i, nb in plan.neighbors.items()})
        contacts = tuple((a, b) for a, b in plan.contacts if a not in gone and b not in gone)
        return RoundPlan(plan.round, participants, neighbors, contacts)

    def actors(self, actors: Iterable[int]) -> list[int]:
        """``actors`` without the dropped nodes."""
        return [a for a in actors if a not in self.dropped]

    def delivers(self, src: int, dst: int) -> bool:
        """False when ``src`` replied late or ``dst`` is offline."""
        return src not in self.late and dst not in self.dropped

    def deliverable(self, src: int, dsts: Sequence[int]) -> list[int]:
        """The receivers among ``dsts`` that get ``src``'s message."""
        if src in self.late:
            return []
        return [d for d in dsts if d not in self.dropped]


NO_FAULTS = RoundFaults(0)


class FaultModel:
    """Draws each round's :class:`RoundFaults` (see the module docstring)."""

    def __init__(self, num_nodes: int, seed: int, *, dropout: float = 0.0,
                 dropout_schedule: Optional[Sequence[Sequence[int]]] = None, straggler: float = 0.0,
                 slowdown: float = 3.0, deadline: Optional[float] = None):
        self.num_nodes, self.seed = int(num_nodes), int(seed)
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1], got {dropout!r}")
        if not 0.0 <= straggler <= 1.0:
            raise ValueError(f"straggler must be a probability in [0, 1], got {straggler!r}")
        if not slowdown > 1.0:
            raise ValueError(f"slowdown must be > 1 (a straggler's reply takes up to slowdown x a normal one), "
                             f"got {slowdown!r}")
        if (straggler > 0) != (deadline is not None):
            raise ValueError("straggler and deadline go together: stragglers matter only when replies after the "
                             "deadline are dropped (set both, e.g. straggler = 0.2, deadline = 2.0)")
        if deadline is not None and not 1.0 <= deadline < slowdown:
            raise ValueError(f"deadline must be in [1, slowdown={slowdown:g}) time units (a normal reply takes 1; "
                             f"no straggler is later than slowdown), got {deadline!r}")
        self.dropout, self.straggler, self.slowdown, self.deadline = float(dropout), float(straggler), \
            float(slowdown), deadline
        self.schedule: dict[int, frozenset[int]] = {}
        for k, pair in enumerate(dropout_schedule or []):
            if len(pair) != 2:
                raise ValueError(f"dropout_schedule[{k}] must be a [round, node] pair, got {list(pair)!r}")
            r, node = int(pair[0]), int(pair[1])
            if r < 1 or not 0 <= node < self.num_nodes:
                raise ValueError(f"dropout_schedule[{k}] = [{r}, {node}]: rounds start at 1 and nodes are "
                                 f"0..{self.num_nodes - 1}")
            self.schedule[r] = self.schedule.get(r, frozenset()) | {node}

    @property
    def enabled(self) -> bool:
        return self.dropout > 0 or self.straggler > 0 or bool(self.schedule)

    def round(self, r: int) -> RoundFaults:
        """The faults of round ``r`` (1-based), a function of (seed, r, node) only."""
        n = self.num_nodes
        dropped = set(self.schedule.get(r, ()))
        if self.dropout > 0:
            u = np_gen(self.seed, "faults", "dropout", r).random(n)
            dropped.update(int(i) for i in np.flatnonzero(u < self.dropout))
        late: set[int] = set()
        if self.straggler > 0:
            slow = np_gen(self.seed, "faults", "straggler", r).random(n) < self.straggler
            t = 1.0 + (self.slowdown - 1.0) * np_gen(self.seed, "faults", "slowness", r).random(n)
            late = {int(i) for i in np.flatnonzero(slow & (t > self.deadline))} - dropped
        dropped.discard(SERVER)
        return RoundFaults(r, frozenset(dropped), frozenset(late))


def dropped_count(faults: RoundFaults, plan: RoundPlan, steps: Iterable) -> int:
    """``faults/dropped``: the dropped nodes that round ``plan`` (before the faults) or any of
    the round's steps (``.actors``) would have involved."""
    involved = set(plan.participants)
    for step in steps:
        involved.update(step.actors)
    return len(faults.dropped & involved)
