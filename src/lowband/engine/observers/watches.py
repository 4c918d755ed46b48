"""Warnings about a run going wrong, once each (:mod:`lowband.engine.checks`).

- :class:`~lowband.engine.checks.TrafficWatch`: what crossed the links (a lossy codec on
  the model, bytes out of proportion), checked at each evaluation;
- :class:`~lowband.engine.checks.DecayWatch`: the main accuracy falls far from its best
  and stays there;
- :class:`~lowband.engine.checks.ChanceWatch`: the main accuracy never leaves chance
  (summary.json's ``learned_nothing``).

A resumed run feeds its earlier records quietly: they were warned about in the run that
wrote them.
"""

from __future__ import annotations

from typing import Any

from lowband.engine import checks
from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Watches"]


class Watches(Observer):
    def __init__(self, traffic: checks.TrafficWatch):
        self.traffic = traffic
        self.decay: Any = None
        self.chance: Any = None

    def on_run_start(self, run: Run) -> None:
        main = run.sim.main_metric
        self.decay = checks.DecayWatch(main)
        self.chance = checks.ChanceWatch(main, run.sim.fed.num_classes, run.exp.rounds)
        for rec in run.metrics:
            self.decay.check(rec, quiet=True)
            self.chance.check(rec, quiet=True)

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        self.traffic.check()

    def on_record(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        self.decay.check(rec)
        self.chance.check(rec)

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        summary.update(self.chance.summary())
