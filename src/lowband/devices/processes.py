"""Availability models (:class:`~lowband.devices.availability.Availability`): on/off windows per node.

- :class:`Windows`: explicit on-windows per node ``[start_s, end_s)``, optionally repeating
  with a period (a trace file, a converted FedScale trace).
- :class:`Diurnal`: each device is on for ``on_fraction`` of every ``period_s`` (a day),
  starting at its own phase (its time zone): phases uniform over the period from
  ``(seed, "devices", "phase")``, or all equal.
- :class:`Churn`: random churn, alternating on and off periods drawn exponential with
  means ``mean_on_s`` and ``mean_off_s`` from ``(seed, "devices", "churn", node)``; a
  node starts on with the stationary probability ``mean_on / (mean_on + mean_off)``.

Times are seconds on the simulated clock since the run began. Every model is a pure
function of its configuration and seed (Churn extends its windows lazily, always the same
sequence), so a resumed run sees the same windows. Windows are half-open: a node is on at
``start`` and off at ``end``.
"""

from __future__ import annotations

import bisect
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from lowband.seeding import np_gen

__all__ = ["Windows", "Diurnal", "Churn", "merge_windows"]


def merge_windows(windows: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping windows (touching or overlapping ones joined; empty ones dropped)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted((float(a), float(b)) for a, b in windows):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


class _Sorted:
    """One node's windows as sorted start and end arrays (merged)."""

    def __init__(self, windows: Sequence[tuple[float, float]]):
        w = merge_windows(windows)
        self.starts = [s for s, _ in w]
        self.ends = [e for _, e in w]

    def index(self, t: float) -> int:
        """Index of the last window starting at or before ``t`` (-1: none)."""
        return bisect.bisect_right(self.starts, t) - 1

    def state(self, t: float) -> tuple[bool, float]:
        """(on at ``t``, the time the state next changes; inf: never)."""
        i = self.index(t)
        if i >= 0 and t < self.ends[i]:
            return True, self.ends[i]
        nxt = i + 1
        return False, (self.starts[nxt] if nxt < len(self.starts) else math.inf)


class _FromState:
    """The Availability protocol's three answers from one ``_state(node, t) -> (on, time of the
    next change)`` of the subclass."""

    def _state(self, node: int, t: float) -> tuple[bool, float]:
        raise NotImplementedError

    def available(self, node: int, t: float) -> bool:
        return self._state(node, t)[0]

    def next_on(self, node: int, t: float) -> float:
        on, change = self._state(node, t)
        return t if on else change

    def next_off(self, node: int, t: float) -> float:
        on, change = self._state(node, t)
        return change if on else t


class Windows(_FromState):
    """Explicit on-windows per node; ``period_s``: the windows repeat every ``period_s``
    (they must then lie in ``[0, period_s)``). A node without windows is never on."""

    def __init__(self, windows: Mapping[int, Sequence[tuple[float, float]]], period_s: Optional[float] = None):
        if period_s is not None and not (period_s > 0 and math.isfinite(period_s)):
            raise ValueError(f"period_s must be a finite number > 0, got {period_s!r}")
        self.period = None if period_s is None else float(period_s)
        self._nodes: dict[int, _Sorted] = {}
        for node, ws in windows.items():
            for s, e in ws:
                if not (0 <= s < e) or not math.isfinite(e) and self.period is not None:
                    raise ValueError(f"node {node}: a window must have 0 <= start_s < end_s, got ({s}, {e})")
                if self.period is not None and e > self.period:
                    raise ValueError(f"node {node}: window ({s}, {e}) ends after the period {self.period:g} s")
            self._nodes[int(node)] = _Sorted(ws)
        self._empty = _Sorted(())

    def windows(self, node: int) -> list[tuple[float, float]]:
        w = self._nodes.get(int(node), self._empty)
        return list(zip(w.starts, w.ends))

    def _state(self, node: int, t: float) -> tuple[bool, float]:
        w = self._nodes.get(int(node), self._empty)
        if self.period is None:
            return w.state(t)
        if not w.starts:
            return False, math.inf
        k = math.floor(t / self.period)
        on, change = w.state(t - k * self.period)
        if change == math.inf:  # off until the first window of the next period
            change = self.period + w.starts[0]
        elif on and change == self.period and w.starts[0] == 0.0:  # a window wrapping over the period's end
            on2, change2 = w.state(0.0)
            change = self.period + change2
        return on, k * self.period + change


class Diurnal:
    """On for ``on_fraction x period_s`` of every period, from the node's phase (module docstring).

    Node ``i`` is on when ``(t + phase_i) mod period_s < on_fraction x period_s``; with
    ``phases = "uniform"`` ``phase_i`` is uniform in ``[0, period_s)`` (devices spread over
    time zones), with ``"equal"`` every phase is 0 (one time zone: all on at t = 0)."""

    def __init__(self, num_nodes: int, seed: int, *, on_fraction: float = 0.5, period_s: float = 86400.0,
                 phases: str = "uniform"):
        if not 0.0 < on_fraction <= 1.0:
            raise ValueError(f"on_fraction must be in (0, 1], got {on_fraction!r}")
        if not (period_s > 0 and math.isfinite(period_s)):
            raise ValueError(f"period_s must be a finite number > 0, got {period_s!r}")
        if phases not in ("uniform", "equal"):
            raise ValueError(f"phases must be 'uniform' or 'equal', got {phases!r}")
        self.on_fraction, self.period = float(on_fraction), float(period_s)
        self.on_s = self.on_fraction * self.period
        if phases == "uniform":
            self.phase = np_gen(seed, "devices", "phase").random(num_nodes) * self.period
        else:
            self.phase = np.zeros(num_nodes)

    def _local(self, node: int, t: float) -> float:
        return (t + float(self.phase[node])) % self.period

    def available(self, node: int, t: float) -> bool:
        return self.on_fraction >= 1.0 or self._local(node, t) < self.on_s

    def next_on(self, node: int, t: float) -> float:
        if self.available(node, t):
            return t
        return t + (self.period - self._local(node, t))

    def next_off(self, node: int, t: float) -> float:
        if self.on_fraction >= 1.0:
            return math.inf
        if not self.available(node, t):
            return t
        return t + (self.on_s - self._local(node, t))


class Churn(_FromState):
    """Exponential on and off periods per node (module docstring), extended lazily."""

    def __init__(self, num_nodes: int, seed: int, *, mean_on_s: float, mean_off_s: float):
        if not (mean_on_s > 0 and mean_off_s > 0 and math.isfinite(mean_on_s) and math.isfinite(mean_off_s)):
            raise ValueError(f"mean_on_s and mean_off_s must be finite numbers > 0, got {mean_on_s!r}, {mean_off_s!r}")
        self.num_nodes, self.seed = int(num_nodes), int(seed)
        self.mean_on, self.mean_off = float(mean_on_s), float(mean_off_s)
        self._changes: dict[int, list[float]] = {}  # node -> times its state changes (first: 0.0)
        self._first_on: dict[int, bool] = {}
        self._rng: dict[int, np.random.Generator] = {}

    def _extend(self, node: int, t: float) -> tuple[list[float], bool]:
        node = int(node)
        if node not in self._changes:
            g = np_gen(self.seed, "devices", "churn", node)
            self._rng[node] = g
            self._first_on[node] = bool(g.random() < self.mean_on / (self.mean_on + self.mean_off))
            self._changes[node] = [0.0]
        ch, g, on0 = self._changes[node], self._rng[node], self._first_on[node]
        while ch[-1] <= t:
            on = (len(ch) % 2 == 1) == on0  # state during the period starting at ch[-1]
            ch.append(ch[-1] + float(g.exponential(self.mean_on if on else self.mean_off)))
        return ch, on0

    def _state(self, node: int, t: float) -> tuple[bool, float]:
        ch, on0 = self._extend(node, t)
        i = bisect.bisect_right(ch, t) - 1  # the period containing t
        on = (i % 2 == 0) == on0
        return on, ch[i + 1]

