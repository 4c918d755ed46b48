"""record.jsonl: the run's record (:mod:`lowband.results.record`), written beside
metrics.jsonl by every run that writes a folder, whatever its backend (the simulator's,
Flower's).

At the run's end the record is built from the folder's files and the ledger and summary the
run holds in memory (ledger.csv and summary.json are written after the observers' last hook),
so it holds every round. A run cut short keeps a partial record: after a checkpoint
round, at most once a :data:`PARTIAL_EVERY_S` seconds, the record of the rounds done so far is
written again. The observer only reads the run and writes its own file: metrics.jsonl,
ledger.csv and summary.json are the same with or without it."""

from __future__ import annotations

import time
from typing import Any

from lowband.engine.observers.base import Observer, Round, Run
from lowband.engine.observers.checkpoint import Checkpoint

__all__ = ["RecordWriter", "PARTIAL_EVERY_S"]

#: the least wall-clock seconds between two partial records of a run
PARTIAL_EVERY_S = 60.0


class RecordWriter(Observer):
    """Writes ``record.jsonl`` (or ``.jsonl.gz``) in the run folder: at the end, and partial
    after checkpoint rounds. The last observer: it sees the summary every other one made."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    @staticmethod
    def _write(run: Run, **summary: Any) -> None:
        from lowband.results.record import ledger_rounds, write_record

        write_record(run.log.dir, ledger=ledger_rounds(run.sim.ledger), **summary)  # type: ignore[union-attr]

    def on_round_end(self, run: Run, rnd: Round) -> None:
        ck = next((o for o in run.observers if isinstance(o, Checkpoint)), None)  # before this one
        if run.log is None or ck is None or not ck.rounds or ck.rounds[-1] != rnd.number \
                or rnd.number >= run.exp.rounds:
            return
        if time.monotonic() - self._last >= PARTIAL_EVERY_S:
            self._write(run, summary={})
            self._last = time.monotonic()

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        if run.log is None:
            return
        import json

        from lowband.engine.runlog import clean

        self._write(run, summary=json.loads(json.dumps(clean(summary), allow_nan=False)))
