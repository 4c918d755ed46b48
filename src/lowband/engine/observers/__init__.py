"""Observers of the round driver: every cross-cutting feature of a run, each in its own
module, none of them known to the driver (:mod:`lowband.engine.simulator`).

See :mod:`lowband.engine.observers.base` for the hooks and docs/engine.md for how to
write one. :func:`default_observers` is the list a simulation starts with, in hook order.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from lowband.engine.observers.base import HOOKS, Observer, Round, Run
from lowband.engine.observers.checkpoint import Checkpoint, Resume
from lowband.engine.observers.counters import Counters
from lowband.engine.observers.devices import Devices
from lowband.engine.observers.diagnostics import Diagnostics
from lowband.engine.observers.faults import Faults
from lowband.engine.observers.incidents import Incidents
from lowband.engine.observers.linkclock import LinkClock
from lowband.engine.observers.record import RecordWriter
from lowband.engine.observers.robustness import Robustness
from lowband.engine.observers.timing import Timing
from lowband.engine.observers.views import Progress, TensorBoard
from lowband.engine.observers.watches import Watches

__all__ = ["HOOKS", "Observer", "Round", "Run", "Counters", "Checkpoint", "Resume", "Devices", "Diagnostics", "Faults",
           "Incidents", "LinkClock", "Timing", "Progress", "TensorBoard", "Watches", "default_observers"]


def default_observers(sim: Any, *, traffic: Any, builder: Any, progress: Progress,
                      extra: Sequence[Observer] = (), checkpoints: bool = True) -> list[Observer]:
    """The observers of ``sim``'s run, in hook order: the resume first (the others see the
    restored run), then what the config asks for, the ``extra`` ones, the checkpoint last
    (it saves every observer's state after the round)."""
    exp = sim.exp
    faults = Faults.from_config(exp, sim.num_nodes)
    link: Optional[Observer] = LinkClock.from_config(sim, builder) if exp.links is not None else None
    if getattr(sim.alg, "event_clock", False):  # asynchronous: one round per arrival (lowband.asynchronous)
        from lowband.asynchronous.clock import EventClock

        link = EventClock.from_sim(sim, builder)
    obs: list[Optional[Observer]] = [
        Resume(),
        faults if faults.model.enabled else None,
        link,  # the link clock, or the event clock of an asynchronous run (which reads [devices] itself)
        Devices.from_config(sim, link, builder) if exp.devices is not None and isinstance(link, LinkClock) else None,
        Diagnostics(),  # alg/* after time/*: the order of a metrics line
        Watches(traffic),
        Incidents(),
        Robustness() if Robustness.wanted(exp) else None,
        sim.counters,
        Timing(),
        TensorBoard() if exp.log.tensorboard else None,
        progress,
        *extra,
        Checkpoint(exp.checkpoint_every) if checkpoints else None,
        RecordWriter(),  # last: the record holds the summary every other observer made
    ]
    return [o for o in obs if o is not None]
