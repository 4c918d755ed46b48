"""The CPU time a run's processes spend in a round: what a results table counts as compute.

A round's wall-clock time times the run's ``threads`` says nothing of the engine's worker
processes (``[engine] workers``: two processes on two cores do twice a core's work in the
same wall time) and counts as work the time a run waits for a core it shares. The meter
reads what the operating system charged instead: this process's CPU time
(:func:`time.process_time`, all its threads) plus that of each local worker process
(``/proc/PID/stat`` on Linux). Where a worker's time cannot be read (another operating
system, or workers on other machines: Ray), the round's CPU time is unknown (None) and the
table falls back to wall-clock x threads x workers, and says so.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["CpuMeter", "process_cpu_s"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") and "SC_CLK_TCK" in os.sysconf_names else 100


def process_cpu_s(pid: int) -> Optional[float]:
    """User + system CPU seconds of process ``pid`` so far, from ``/proc/PID/stat`` (None: no
    such file, e.g. not Linux, or the process has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after it
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15


class CpuMeter:
    """CPU seconds of this process and its workers between :meth:`start` and :meth:`stop`.

    ``worker_pids``: the local worker processes now computing for the run ([]: none, the
    serial executor; None: workers whose time cannot be read here, Ray's)."""

    def __init__(self, worker_pids: Callable[[], Optional[Sequence[int]]]):
        self.worker_pids = worker_pids
        self._start: Optional[dict[int, float]] = None

    def _read(self) -> Optional[dict[int, float]]:
        """Seconds so far per process (0: this one), or None when a worker's cannot be read."""
        pids = self.worker_pids()
        if pids is None:
            return None
        now = {0: time.process_time()}
        for pid in pids:
            s = process_cpu_s(int(pid))
            if s is None:
                return None
            now[int(pid)] = s
        return now

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> Optional[float]:
        """The seconds since :meth:`start` (None: unknown). A worker started in between
        counts from zero; one that ended in between is lost (its last seconds cannot be
        read), so the value is then a lower bound; a round does not restart workers."""
        end, begin = self._read(), self._start
        self._start = None
        if end is None or begin is None:
            return None
        return round(sum(s - begin.get(p, 0.0) for p, s in end.items()), 4)
