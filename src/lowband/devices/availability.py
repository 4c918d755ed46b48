"""When a device is reachable: the one interface every clock and sampler reads.

An availability model answers, for a node and a simulated time in seconds since the run
began, whether the node is on, and when its state next changes. Synchronous rounds ask
``available(node, t)`` at the round's start (and ``next_off`` to know whether a device
leaves mid-round, losing its work); the asynchronous event clock schedules a device's
next contribution at ``next_on``. Implementations must be pure functions of their
configuration and seed (no hidden state), so a resumed run sees the same windows.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

__all__ = ["Availability", "AlwaysOn", "ALWAYS_ON"]


@runtime_checkable
class Availability(Protocol):
    """On/off windows per node on the simulated clock (seconds since the run began)."""

    def available(self, node: int, t: float) -> bool:
        """Whether ``node`` is reachable at time ``t``."""
        ...

    def next_on(self, node: int, t: float) -> float:
        """The earliest time ``>= t`` at which ``node`` is on (``t`` itself if it is on;
        ``math.inf`` if never again)."""
        ...

    def next_off(self, node: int, t: float) -> float:
        """The earliest time ``> t`` at which an on ``node`` goes off (``math.inf`` if it
        stays on); for a node that is off at ``t``, ``t``."""
        ...


class AlwaysOn:
    """Every node reachable at every time: today's behaviour, the default."""

    def available(self, node: int, t: float) -> bool:
        return True

    def next_on(self, node: int, t: float) -> float:
        return t

    def next_off(self, node: int, t: float) -> float:
        return math.inf


ALWAYS_ON = AlwaysOn()
