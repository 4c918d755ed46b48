"""timing.jsonl: one line per round with wall-clock seconds (training, evaluation, since
the start), the engine's worker count and the CPU seconds this process and its workers
took (:mod:`lowband.engine.cputime`). Not deterministic, so not in metrics.jsonl."""

from __future__ import annotations

import time
from typing import Any, Optional

from lowband.engine.cputime import CpuMeter
from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Timing"]


class Timing(Observer):
    def __init__(self) -> None:
        self.meter: Optional[CpuMeter] = None
        self.workers = 1
        self._t_run = self._t0 = self._t1 = 0.0

    def on_run_start(self, run: Run) -> None:
        ex = run.sim.executor
        self.meter = CpuMeter(getattr(ex, "worker_pids", lambda: None))
        self.workers = int(getattr(ex, "num_workers", 1))
        self._t_run = time.perf_counter()

    def on_round_start(self, run: Run, rnd: Round) -> None:
        self._t0 = time.perf_counter()
        self.meter.start()  # type: ignore[union-attr]

    def on_deliver(self, run: Run, rnd: Round) -> None:
        self._t1 = time.perf_counter()

    def on_round_end(self, run: Run, rnd: Round) -> None:
        now = time.perf_counter()
        cpu_s = self.meter.stop()  # type: ignore[union-attr]  # None: unknown (Ray's workers)
        if run.log is not None:
            rec: dict[str, Any] = {"round": rnd.number, "round_s": round(self._t1 - self._t0, 4),
                                   "eval_s": round(now - self._t1, 4), "elapsed_s": round(now - self._t_run, 3),
                                   "workers": self.workers}
            if cpu_s is not None:
                rec["cpu_s"] = cpu_s
            run.log.log_timing(rec)
