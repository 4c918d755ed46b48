"""Refused messages and diverged training, counted per round.

Receivers refuse what fails validation (:mod:`lowband.comm.validate`; the Flower server's
checks, :mod:`lowband.flower.guard`) into ``network.rejections``; the executor notes a
local training that diverged (a non-finite loss). After the round's play, and again
after its evaluation (an evaluation reply may be refused too), this observer moves them
into the run's counters as ``rejected/<reason>`` and ``faults/diverged``, and logs the
first of each reason once per run.
"""

from __future__ import annotations

import logging
from typing import Any

from lowband.engine.observers.base import Observer, Round, Run

logger = logging.getLogger("lowband")

__all__ = ["Incidents"]


class Incidents(Observer):
    def __init__(self) -> None:
        self._logged: set[str] = set()

    def collect(self, run: Run, r: int, diverged: list[tuple[int, int]]) -> None:
        net, ex = run.sim.network, run.sim.executor
        rejections = net.rejections
        net.rejections = []
        for rej in rejections:
            run.counters.add(r, f"rejected/{rej.reason}")
            if rej.reason not in self._logged:
                self._logged.add(rej.reason)
                logger.warning("%s; further '%s' rejections are counted in metrics.jsonl as rejected/%s, not logged",
                               rej.describe(), rej.reason, rej.reason)
        diverged = list(diverged) + list(getattr(ex, "diverged", []))
        if getattr(ex, "diverged", None):
            ex.diverged.clear()
        for dr, node in diverged:
            run.counters.add(r, "faults/diverged")
            if "diverged" not in self._logged:
                self._logged.add("diverged")
                logger.warning("round %d: the local training of node %d diverged (non-finite loss); further "
                               "divergences are counted in metrics.jsonl as faults/diverged, not logged", dr, node)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        self.collect(run, rnd.number, rnd.diverged)

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        self.collect(run, rnd.number, [])
