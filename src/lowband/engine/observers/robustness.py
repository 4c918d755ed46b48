"""Robustness as an observer: what a robust aggregation rule discarded or clipped, the
attack's own metrics, and the summary's names of both (docs/aggregation.md).

Present in a run's observers only when ``[aggregation]`` sets a rule or
``[faults.byzantine]`` names attackers, so an undefended, unattacked run is unchanged.
- ``on_run_start``: refuses a rule that cannot be served by the round's participants
  (:func:`lowband.aggregation.install.check`), before any round.
- ``on_deliver``: the rules' counters of the round (``robust/<rule>/<counter>``), drained
  from where the aggregating nodes ran, into the run's counters (metrics.jsonl, summary
  ``incidents``, the checkpoint).
- ``on_eval``: the attack's metrics (honest and attackers' accuracies apart for peer
  methods, ``attack/backdoor_acc`` for model replacement;
  :func:`lowband.attacks.observe.attack_metrics`).
- ``on_run_end``: ``attack`` and ``aggregation`` in the summary, so an undefended run's
  summary names the attack it suffered.
"""

from __future__ import annotations

from typing import Any, Optional

from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Robustness"]


class Robustness(Observer):
    """Counters, attack metrics and summary names of a defended or attacked run."""

    def __init__(self) -> None:
        self.recorder: Optional[Any] = None

    @staticmethod
    def wanted(exp: Any) -> bool:
        rule = getattr(getattr(exp, "aggregation", None), "rule", None)
        return rule is not None or getattr(exp.faults, "byzantine", None) is not None

    def on_run_start(self, run: Run) -> None:
        from lowband.aggregation.install import RobustnessRecorder, check

        sim = run.sim
        check(sim.exp, sim.alg, sim.topology.plan(0))
        self.recorder = RobustnessRecorder(sim.num_nodes, sim.alg.has_server)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        assert self.recorder is not None
        for r, per in self.recorder.drain(run.sim.executor).items():
            for key, n in per.items():
                run.counters.add(r, key, int(n))

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        from lowband.attacks.observe import attack_metrics

        rec.update(attack_metrics(run.sim, rnd.number, rnd.plan))

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        alg = run.sim.alg
        attack = getattr(alg, "attack", None)
        rule = getattr(alg, "aggregation", None)
        summary["attack"] = attack.describe() if attack is not None else "none"
        summary["aggregation"] = repr(rule) if rule is not None else "none"
