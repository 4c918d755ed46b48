"""The observer protocol of the round driver (:class:`lowband.engine.simulator.Simulation`).

The driver plays plan -> steps -> play -> evaluate -> record and calls each observer's
hooks at fixed points; everything else (faults, link time, incidents, watches, CPU time,
checkpoints, progress, TensorBoard) is an observer. Hooks run in the order of the run's
observer list (``Simulation.observers``: the defaults of :func:`default_observers`, then
the ``observers=`` given to the simulation). See docs/engine.md for the picture.

Hooks and what each may do:

- ``on_run_start(run)``: the run folder is open; a resumed run's states, ledger and
  observer states are restored (by :class:`~lowband.engine.observers.checkpoint.Resume`,
  the first observer) and ``run.start`` is the last round already done, ``run.metrics``
  the records so far. Set up, replay what earlier rounds did.
- ``on_round_start(run, rnd)``: before the algorithm draws the round's steps. May narrow
  ``rnd.played`` (the plan the algorithm sees), set ``rnd.faults`` (nodes absent or late:
  the loop neither runs nor delivers them) and ``rnd.clock`` (a deadline clock: late
  (message, receiver) pairs are not delivered).
- ``on_deliver(run, rnd)``: the round's steps were played: every message encoded, counted
  in the ledger and delivered; ``rnd.steps`` are the algorithm's steps, ``rnd.diverged``
  the nodes whose training diverged. Count what happened (``run.counters.add``).
- ``on_eval(run, rnd, rec)``: an evaluated round (``rnd.number`` 0 for the evaluation
  before training); ``rec`` holds the protocols' metrics and the byte totals. May add keys
  (measurements, counts): they go to metrics.jsonl.
- ``on_record(run, rnd, rec)``: ``rec`` is final, written, and the last of ``run.metrics``;
  look only (warnings, progress bars, TensorBoard).
- ``on_round_end(run, rnd)``: after the round (and its evaluation). Timing lines,
  checkpoints.
- ``on_run_end(run, summary)``: every round done; may add keys to ``summary`` (written
  as summary.json after the hooks).
- ``checkpoint_state()`` / ``restore(ckpt)``: what the observer keeps across a kill:
  a dict of top-level checkpoint entries (tensors, numbers, strings, lists and dicts of
  them), and reading them back on resume (``ckpt`` is the whole checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from lowband.faults import NO_FAULTS, RoundFaults
from lowband.topology import RoundPlan

if TYPE_CHECKING:  # pragma: no cover
    from lowband.algorithms.base import Step
    from lowband.engine.observers.counters import Counters
    from lowband.engine.runlog import RunLog

__all__ = ["Observer", "Run", "Round", "HOOKS"]

#: the hooks in the order the driver calls them in a round
HOOKS = ("on_run_start", "on_round_start", "on_deliver", "on_eval", "on_record", "on_round_end", "on_run_end")


@dataclass
class Round:
    """One round as the driver plays it (``number`` is 1-based; 0: the evaluation before
    training)."""

    number: int
    #: the topology's plan of the round
    plan: RoundPlan
    #: the plan the algorithm plays (an observer may narrow it: dropped nodes)
    played: RoundPlan
    #: the algorithm's steps of the round (set after ``on_round_start``)
    steps: list["Step"] = field(default_factory=list)
    #: nodes offline or late this round: the loop neither runs nor delivers them
    faults: RoundFaults = NO_FAULTS
    #: a deadline clock (``transfer``/``on_time``): late (message, receiver) pairs stay undelivered
    clock: Any = None
    #: (round, node) of the steps whose local training diverged (set after the play)
    diverged: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Run:
    """What every hook sees of the run."""

    #: the simulation: ``exp``, ``alg``, ``fed``, ``topology``, ``ledger``, ``network``,
    #: ``executor``, ``backend``, ``main_metric``, ``resume``
    sim: Any
    #: the run folder (None: an in-memory run, ``write=False``)
    log: Optional["RunLog"]
    #: the observers, in hook order
    observers: list["Observer"]
    #: per-round counts summed into each metrics record (:class:`Counters`)
    counters: "Counters"
    #: the last round done before this run (a resume's checkpoint), 0 for a fresh run
    start: int = 0
    #: the metrics records so far (a resumed run's earlier ones first)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exp(self) -> Any:
        return self.sim.exp


class Observer:
    """A run observer: override the hooks you need (see the module docstring); every
    hook of this base class does nothing."""

    def on_run_start(self, run: Run) -> None:
        pass

    def on_round_start(self, run: Run, rnd: Round) -> None:
        pass

    def on_deliver(self, run: Run, rnd: Round) -> None:
        pass

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        pass

    def on_record(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        pass

    def on_round_end(self, run: Run, rnd: Round) -> None:
        pass

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        pass

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def restore(self, ckpt: dict[str, Any]) -> None:
        pass
