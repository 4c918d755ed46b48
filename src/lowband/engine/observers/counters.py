"""Per-round counts written with the metrics: ``rejected/<reason>``, ``faults/*``,
``links/late``, and any other observer's (a robust rule's screened updates, a privacy
mechanism's clipped ones).

An observer adds to a count of the current round with ``run.counters.add(round, key, n)``
(in ``on_round_start``, ``on_deliver`` or ``on_eval``, before this observer writes).
Each metrics record carries the counts of the rounds since the previous record, summed
per key: a key appears only when its sum is not zero, unless declared
(``run.counters.declare(key)``: then it is in every record, 0 included). summary.json's
``incidents`` holds the sums over the whole run (when any count is not zero), and the
checkpoint keeps the counts (``incidents``), so a resumed run writes what an unbroken
one does.
"""

from __future__ import annotations

from typing import Any

from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Counters"]


class Counters(Observer):
    """Round -> key -> count; writes them (module docstring)."""

    def __init__(self) -> None:
        self.by_round: dict[int, dict[str, int]] = {}
        self.declared: set[str] = set()

    def declare(self, *keys: str) -> None:
        """``keys`` go in every metrics record, 0 when nothing was counted."""
        self.declared.update(keys)

    def add(self, round: int, key: str, n: int = 1) -> None:
        if n:
            per = self.by_round.setdefault(int(round), {})
            per[key] = per.get(key, 0) + int(n)

    def record(self, since: int, upto: int) -> dict[str, int]:
        """The counts of rounds ``since < r <= upto`` (round 0: the evaluation before
        training): declared keys and nonzero sums, sorted."""
        rec: dict[str, int] = dict.fromkeys(self.declared, 0)
        for r in range(since + 1, upto + 1):
            for k, v in self.by_round.get(r, {}).items():
                rec[k] = rec.get(k, 0) + v
        return dict(sorted(rec.items()))

    # -- hooks ------------------------------------------------------------------------------
    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        # the first record holds round 0's counts too (refused replies to the round-0 evaluation)
        rec.update(self.record(run.metrics[-1]["round"] if run.metrics else -1, rnd.number))

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self.by_round:
            summary["incidents"] = self.record(-1, run.exp.rounds)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"incidents": {str(k): v for k, v in self.by_round.items()}} if self.by_round else {}

    def restore(self, ckpt: dict[str, Any]) -> None:
        self.by_round = {int(r): {str(k): int(v) for k, v in per.items()}
                         for r, per in ckpt.get("incidents", {}).items()}
