"""The privacy a run spends, written beside its bytes: ``dp/*`` in every metrics record and
in summary.json (docs/privacy.md).

The mechanisms themselves are not here: central DP and secure aggregation wrap the
algorithm, local DP is the senders' transform before the codec (built by
:func:`lowband.privacy.build.build_privacy`, one step of the driver's construction). This
observer only accounts:

- central and distributed DP: the epsilon of each round comes from the track planned
  before the run (``dp/epsilon``, ``dp/delta``), so a record's epsilon is the accountant's
  for that round, whatever happened in it;
- local DP: each round's releases are read from the ledger (every message a node sent,
  :func:`~lowband.privacy.transforms.releases_from_ledger`) and composed per node; the
  record holds the worst node's ``dp/local_epsilon`` and ``dp/local_releases``, and
  ``dp/releases`` (all the round's releases) is a per-round count;
- secure aggregation: the protocol's bytes so far (``secagg/bytes``, every ``secagg_*``
  kind of the ledger).

Resume: the local track is rebuilt from the restored ledger (the ledger is checkpointed;
the track is a function of it), the planned track needs nothing, so a resumed run writes
what an unbroken one does.
"""

from __future__ import annotations

from typing import Any, Optional

from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Privacy"]


def secagg_bytes(ledger: Any) -> int:
    """Encoded bytes of every SecAgg protocol message in ``ledger`` so far."""
    return int(sum(v["encoded"] for k, v in ledger.by_kind().items() if str(k).startswith("secagg_")))


class Privacy(Observer):
    """Writes a run's privacy accounting (module docstring). ``setup``: the run's
    :class:`~lowband.privacy.build.PrivacySetup`."""

    def __init__(self, setup: Any) -> None:
        self.setup = setup
        self.track = setup.track
        self.local = setup.local

    def _observe(self, run: Run, r: int) -> dict[int, int]:
        from lowband.privacy.transforms import releases_from_ledger

        got = releases_from_ledger(run.sim.ledger, r)
        self.local.observe(r, got)
        return got

    def on_run_start(self, run: Run) -> None:
        if self.local is not None:  # a resumed run: compose the releases of the rounds done, from the ledger
            for r in range(1, run.start + 1):
                self._observe(run, r)

    def on_deliver(self, run: Run, rnd: Round) -> None:
        if self.local is not None:
            got = self._observe(run, rnd.number)
            run.counters.add(rnd.number, "dp/releases", sum(got.values()))

    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        if self.track is not None:
            rec.update(self.track.metrics(rnd.number))
        if self.local is not None:
            rec.update(self.local.metrics(rnd.number))
        if self.setup.secagg:
            rec["secagg/bytes"] = secagg_bytes(run.sim.ledger)

    def on_run_end(self, run: Run, summary: dict[str, Any]) -> None:
        summary["dp/mechanism"] = self.setup.mechanism
        if self.track is not None:
            summary.update(self.track.summary())
        if self.local is not None:
            summary.update(self.local.summary())
        if self.setup.secagg:
            summary["secagg/bytes"] = secagg_bytes(run.sim.ledger)


def privacy_observer(setup: Optional[Any]) -> list[Observer]:
    """The observer of a run with privacy (none without)."""
    return [Privacy(setup)] if setup is not None and setup.active else []
