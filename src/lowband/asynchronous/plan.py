"""The plan of one asynchronous round: who receives the model, who delivers an update.

On the event clock (:mod:`lowband.asynchronous.clock`) one driver round is one *arrival*:
the next client update to reach the server. :class:`AsyncPlan` tells the algorithm's
steps which clients the server sends its current model to in that round (``dispatch``:
those it starts while the previous arrival's update is the newest model), which client
delivers (``arrivals``: at most one), and which clients lost their work (``lost``: their
device went away before their upload was through). ``participants`` is their union.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowband.topology import RoundPlan

__all__ = ["AsyncPlan"]


@dataclass(frozen=True)
class AsyncPlan(RoundPlan):
    """A :class:`~lowband.topology.RoundPlan` of the event clock (module docstring)."""

    dispatch: tuple[int, ...] = ()
    arrivals: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
