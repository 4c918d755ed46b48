"""``[devices]``: availability honoured by sampling and topologies, departures, compute energy.

A wrapper of the round like the faults observer (:mod:`lowband.engine.observers.faults`),
on the ``[links]`` simulated clock (round ``r`` starts at ``t0``, the simulated seconds
of rounds ``1..r-1``):

- **Sampling.** Devices off at ``t0`` take no part in round ``r``. On a star that samples
  clients (``fraction``/``count``), the sampled devices that are off are replaced by
  devices that are on, drawn uniformly from ``(seed, "devices", "sample", r)`` (the round's
  sample is then uniform among the devices on at ``t0``; fewer when fewer are on); other
  plans (a peer graph, ``sampling = "all"``, a schedule) lose their absent devices. Absent
  devices are offline for the round as a dropped node is (:class:`~lowband.faults.RoundFaults`):
  they neither compute nor send, nothing is delivered to them, and an absent peer
  neither sends nor receives.
- **Departures.** A device on at ``t0`` that goes off at ``t_off = next_off(t0)`` during the
  round loses its work: a message it sends (or a peer message to it) arriving after
  ``t_off`` is not delivered (the round's live clock says when each message arrives). The
  ledger keeps every byte the round put on the links, the departed device's included
  (a transfer cut by a departure is counted whole: the ledger counts messages).
- **Energy.** Compute energy: each device that sent in a round trained
  ``alg.compute_phases`` times (1; HierFAVG: its edge aggregations per round), each
  ``3 x forward FLOPs x samples`` at its device's joules per FLOP. Radio energy per device
  comes from the link clock's replay of the round.

Nodes the algorithm names as infrastructure (``alg.infrastructure``: HierFAVG's gateways)
are always on. Writes ``devices/available`` (devices on at the start of the evaluated
round), ``devices/departed`` (devices whose work was lost), ``energy/compute_round_j``
and ``energy/compute_j`` (with an energy figure) in the metrics, and the per-device
energy and compute time in summary.json. Everything is a function of the ledger and
the config, so a resumed run replays its earlier rounds and writes the same numbers.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from lowband.comm import links
from lowband.comm.message import DIRECTIONS, SERVER
from lowband.devices.availability import ALWAYS_ON, Availability
from lowband.devices.compute import DeviceSet, class_counts, summary_stats
from lowband.engine.errors import config_errors
from lowband.engine.observers.base import Observer, Round, Run
from lowband.faults import RoundFaults
from lowband.seeding import np_gen
from lowband.topology import RoundPlan

__all__ = ["Devices", "DepartureClock", "available_plan"]


class DepartureClock:
    """A round's live clock that also drops what a departing device sends or should receive.

    Wraps the ``[links]`` clock (its deadline, if any, still applies); ``leave``: node ->
    seconds after the round start at which it goes off."""

    def __init__(self, inner: links.RoundClock, leave: dict[int, float]):
        self.inner, self.leave = inner, leave
        self._pair = (SERVER, SERVER)
        self.departed: set[int] = set()

    @property
    def late(self) -> int:
        return self.inner.late

    def transfer(self, src: int, dst: int, direction: str, nbytes: int) -> float:
        self._pair = (src, dst)
        return self.inner.transfer(src, dst, direction, nbytes)

    def on_time(self, arrival: float) -> bool:
        src, dst = self._pair
        ok = True
        for node in (src, dst):
            if arrival > self.leave.get(node, math.inf):
                self.departed.add(node)
                ok = False
        return ok and self.inner.on_time(arrival)


def available_plan(plan: RoundPlan, absent: frozenset[int], topology: Any, seed: int, round: int,
                   exempt: frozenset[int] = frozenset()) -> RoundPlan:
    """``plan`` without ``absent`` nodes; a sampling star's absent clients replaced by present
    ones (module docstring), never by ``exempt`` nodes (infrastructure)."""
    gone = [p for p in plan.participants if p in absent]
    if not gone:
        return plan
    keep = [p for p in plan.participants if p not in absent]
    if getattr(topology, "kind", None) == "star" and getattr(topology, "sampling", None) in ("fraction", "count"):
        n = topology.num_nodes
        pool = [i for i in range(n) if i not in absent and i not in exempt and i not in set(keep)]
        k = min(len(gone), len(pool))
        if k:
            pick = np_gen(seed, "devices", "sample", round).choice(len(pool), size=k, replace=False)
            keep.extend(pool[int(j)] for j in pick)
        return RoundPlan(plan.round, tuple(sorted(keep)), plan.neighbors, plan.contacts)
    return RoundFaults(0, dropped=absent).apply(plan)


class Devices(Observer):
    """The ``[devices]`` observer (module docstring). Comes after the link clock in hook order."""

    def __init__(self, link: Any, devices: Optional[DeviceSet], availability: Availability,
                 train_flops: Optional[list[float]]):
        self.link, self.devices, self.availability = link, devices, availability
        self.train_flops = train_flops  # per node, per upload (None: no compute energy)
        self.radio_j: dict[int, float] = {}
        self.compute_j: dict[int, float] = {}
        self._compute_cum: list[float] = [0.0]  # compute joules of rounds 1..r
        self._available: dict[int, int] = {}
        self._departed_total = 0

    @classmethod
    def from_config(cls, sim: Any, link: Any, builder: Any) -> "Devices":
        from lowband.devices.build import availability_model, device_set

        exp, n = sim.exp, len(sim.fed.nodes)
        with config_errors("devices"):
            devices = device_set(exp, n)
            avail = availability_model(exp, n)
            flops = None
            if devices is not None and devices.has_energy:
                flops = links.node_train_flops(hp=sim.alg.hp, n_train=[nd.n_train for nd in sim.fed.nodes],
                                               model_key=builder.key, build=builder,
                                               input_shape=tuple(sim.fed.input_shape))
        return cls(link, devices, avail, flops)

    # -- helpers ---------------------------------------------------------------------------
    @property
    def timer(self) -> links.LinkTimer:
        return self.link.timer

    @staticmethod
    def _exempt(run: Run) -> frozenset[int]:
        return frozenset(int(i) for i in getattr(run.sim.alg, "infrastructure", ()) or ())

    def _account(self, run: Run, r: int, clock: Optional[links.RoundClock]) -> None:
        """Radio (from the round's replayed clock) and compute energy of round ``r``, per device."""
        if clock is not None:
            for node, e in clock.energy_by_node.items():
                if node != SERVER:
                    self.radio_j[node] = self.radio_j.get(node, 0.0) + e
        total = 0.0
        if self.train_flops is not None and self.devices is not None:
            cols = run.sim.ledger.columns()
            sel = (cols["round"] == r) & (cols["direction"] != DIRECTIONS.index("down"))
            exempt = self._exempt(run)
            phases = int(getattr(run.sim.alg, "compute_phases", 1) or 1)
            for node in sorted(set(cols["src"][sel].tolist())):
                if node == SERVER or node in exempt:
                    continue
                e = phases * self.devices.compute_joules(node, self.train_flops[node])
                self.compute_j[node] = self.compute_j.get(node, 0.0) + e
                total += e
        del self._compute_cum[r:]
        self._compute_cum.append(self._compute_cum[r - 1] + total)

    def _absent(self, run: Run, r: int) -> frozenset[int]:
        """The devices off at round ``r``'s start (and their count on, kept for the metrics)."""
        n, exempt, av = len(run.sim.fed.nodes), self._exempt(run), self.availability
        t0 = self.timer.elapsed(r - 1)
        absent = frozenset() if av is ALWAYS_ON else frozenset(
            i for i in range(n) if i not in exempt and not av.available(i, t0))
        self._available[r] = n - len(exempt) - len(absent)
        return absent

    # -- hooks -----------------------------------------------------------------------------
    def on_run_start(self, run: Run) -> None:
        if self.availability is not ALWAYS_ON:  # always on: nothing to count (the metrics stay today's)
            run.counters.declare("devices/departed")
        for r in range(1, run.start + 1):  # a resume: everything below is a function of the ledger
            clock = links.replay_round(self.timer.model, run.sim.ledger, r, self.timer.elapsed(r - 1))
            self._account(run, r, clock)
            self._absent(run, r)

    def on_round_start(self, run: Run, rnd: Round) -> None:
        r = rnd.number
        t0 = self.timer.elapsed(r - 1)
        av = self.availability
        exempt = self._exempt(run)
        absent = self._absent(run, r)
        if av is ALWAYS_ON:
            return
        if absent:
            rnd.played = available_plan(rnd.played, absent, run.sim.topology, run.exp.seed, r, exempt)
            f = rnd.faults
            rnd.faults = RoundFaults(r, f.dropped | absent, f.late - absent)
            rnd.played = rnd.faults.apply(rnd.played)
        involved = set(rnd.played.participants) | {j for nb in rnd.played.neighbors.values() for j in nb}
        leave = {i: av.next_off(i, t0) - t0 for i in sorted(involved) if i not in exempt and i != SERVER}
        leave = {i: t for i, t in leave.items() if math.isfinite(t)}
        if leave:
            inner = rnd.clock if rnd.clock is not None else self.timer.live(r)
            rnd.clock = DepartureClock(inner, leave)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        if isinstance(rnd.clock, DepartureClock) and rnd.clock.departed:
            run.counters.add(rnd.number, "devices/departed", len(rnd.clock.departed))
        self._account(run, rnd.number, self.timer.last)

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        r = rnd.number
        if r in self._available and self.availability is not ALWAYS_ON:
            rec["devices/available"] = self._available[r]
        if self.train_flops is not None:
            cum = self._compute_cum
            i = max(0, min(r, len(cum) - 1))
            rec["energy/compute_round_j"] = float(cum[i] - cum[i - 1]) if i >= 1 else 0.0
            rec["energy/compute_j"] = float(cum[i])

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        n = len(run.sim.fed.nodes)
        exempt = self._exempt(run)
        nodes = [i for i in range(n) if i not in exempt]
        model = self.timer.model
        if self.devices is not None:  # the devices' classes (infrastructure nodes are not devices)
            summary["devices"] = class_counts(self.devices, nodes)
        summary["compute_s_per_upload"] = summary_stats([model.compute(i) for i in nodes])
        if self.train_flops is not None:
            summary["energy_compute_j"] = float(self._compute_cum[-1])
        if model.has_energy or self.train_flops is not None:
            per = [self.radio_j.get(i, 0.0) + self.compute_j.get(i, 0.0) for i in nodes]
            summary["energy_per_device_j"] = summary_stats(per)
            summary["energy_by_device_j"] = [float(x) for x in per]
        ok = [v for v in self._available.values()]
        if ok and self.availability is not ALWAYS_ON:
            summary["devices_available_mean"] = float(np.mean(ok))
