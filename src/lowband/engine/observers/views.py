"""Views of the metrics as they are written: a progress callback (the CLI's bar) and
TensorBoard scalars (``log.tensorboard``, :mod:`lowband.tblog`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Progress", "TensorBoard"]


class Progress(Observer):
    """``callback(round, total_rounds, record)`` after each written metrics record (None:
    nothing; ``Simulation.progress`` sets it)."""

    def __init__(self, callback: Optional[Callable[[int, int, dict[str, Any]], None]] = None):
        self.callback = callback

    def on_record(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        if self.callback is not None:
            self.callback(rnd.number, run.exp.rounds, rec)


class TensorBoard(Observer):
    """Every metrics record as TensorBoard scalars in ``RUN/tb/``, rebuilt from
    metrics.jsonl at the first record of a run (a resumed run logs each round once)."""

    def __init__(self) -> None:
        self._tb: Any = None

    def on_record(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        if run.log is None:
            return
        if self._tb is None:
            from lowband.tblog import TB_DIR, TensorBoardLog

            self._tb = TensorBoardLog(run.log.dir / TB_DIR, run.log.metrics())
        else:
            self._tb.add(rec)

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
