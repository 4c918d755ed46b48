"""``[links]``: simulated time and radio energy per round, from the ledger (:mod:`lowband.comm.links`).

Each finished round's ledger rows are replayed on the link model (``time/round_s``,
``time/sim_s``, ``energy/*`` in every metrics record; ``sim_time_s``,
``time_to_target_s``, ``energy_j`` ... in summary.json). With a deadline the round also
carries a live clock: the loop feeds it each step's transfers, and a reply arriving past
the deadline is not delivered (``links/late`` counts those (message, receiver) pairs).
A resumed run replays its earlier rounds from the restored ledger.
"""

from __future__ import annotations

from typing import Any

from lowband.comm import links
from lowband.engine.errors import config_errors
from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["LinkClock"]


class LinkClock(Observer):
    def __init__(self, timer: links.LinkTimer):
        self.timer = timer

    @classmethod
    def from_config(cls, sim: Any, builder: Any) -> "LinkClock":
        exp = sim.exp
        with config_errors("devices"):
            from lowband.devices.build import device_set

            devices = device_set(exp, len(sim.fed.nodes))  # [devices]: each node's rate (None: links.device_flops)
        with config_errors("links"):
            compute = links.node_compute_seconds(
                exp.links, hp=sim.alg.hp, n_train=[nd.n_train for nd in sim.fed.nodes], model_key=builder.key,
                build=builder, input_shape=tuple(sim.fed.input_shape),
                device_flops=devices.flops if devices is not None else None)
            relays = getattr(sim.alg, "infrastructure", ()) or ()  # a hierarchy's gateways
            return cls(links.LinkTimer(links.build_link_model(exp.links, compute_s=compute, seed=exp.seed,
                                                              relays=relays)))

    @property
    def deadline(self) -> bool:
        return self.timer.model.deadline_s is not None

    def on_run_start(self, run: Run) -> None:
        if self.deadline:
            run.counters.declare("links/late")
        for r in range(1, run.start + 1):  # simulated times are a function of the ledger: replay them
            self.timer.finish(run.sim.ledger, r)

    def on_round_start(self, run: Run, rnd: Round) -> None:
        if self.deadline:
            rnd.clock = self.timer.live(rnd.number)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        self.timer.finish(run.sim.ledger, rnd.number)
        if rnd.clock is not None:
            run.counters.add(rnd.number, "links/late", rnd.clock.late)

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        rec.update(self.timer.record(rnd.number))

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        rounds, t = run.exp.rounds, self.timer
        hit = summary.get("rounds_to_target")  # simulated time to the main metric's target
        summary["sim_time_s"] = t.elapsed(rounds)
        summary["time_to_target_s"] = t.elapsed(hit) if hit is not None else None
        if t.energy(rounds) is not None:  # a preset with radio power figures
            summary["energy_j"] = t.energy(rounds)
            summary["energy_to_target_j"] = t.energy(hit) if hit is not None else None
