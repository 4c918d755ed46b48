"""``[faults]`` as a wrapper of the round: dropout and late stragglers (:mod:`lowband.faults`).

At the start of round ``r`` the round's :class:`~lowband.faults.RoundFaults` narrows the
plan the algorithm sees (dropped nodes are not in it) and goes with the round to the
loop, which neither runs dropped nodes' steps nor delivers to them or from late nodes.
After the play it counts ``faults/dropped`` (dropped nodes the round would have
involved) and ``faults/late`` (late nodes that sent something, which was counted in the
ledger and not delivered); both keys are in every metrics record of a run with faults.
"""

from __future__ import annotations

from typing import Any

from lowband.engine.errors import config_errors
from lowband.engine.observers.base import Observer, Round, Run
from lowband.faults import FaultModel, dropped_count

__all__ = ["Faults"]


class Faults(Observer):
    def __init__(self, model: FaultModel):
        self.model = model

    @classmethod
    def from_config(cls, exp: Any, num_nodes: int) -> "Faults":
        with config_errors("faults"):
            f = exp.faults
            return cls(FaultModel(num_nodes, exp.seed, dropout=f.dropout, dropout_schedule=f.dropout_schedule,
                                  straggler=f.straggler, slowdown=f.slowdown, deadline=f.deadline))

    def on_run_start(self, run: Run) -> None:
        run.counters.declare("faults/dropped", "faults/late")

    def on_round_start(self, run: Run, rnd: Round) -> None:
        rnd.faults = self.model.round(rnd.number)
        rnd.played = rnd.faults.apply(rnd.plan)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        f, r = rnd.faults, rnd.number
        if f.dropped:
            run.counters.add(r, "faults/dropped", dropped_count(f, rnd.plan, rnd.steps))
        if f.late:  # late nodes that sent something this round (counted, not delivered)
            cols = run.sim.ledger.columns()
            run.counters.add(r, "faults/late", len(f.late & set(cols["src"][cols["round"] == r].tolist())))
