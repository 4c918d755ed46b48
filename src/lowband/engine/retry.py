"""A lost machine, said in one line, and the run continued on the machines left.

:class:`LostWorkerError` is what a distributed executor raises when a worker of the run is
gone (its machine, its process, an object it owned): one line naming what was lost and that
``--resume`` continues the run exactly. :func:`run_retrying` is the front doors' wrapper
(``lowband run``, ``lowband.run``): with ``engine.retries`` > 0 it builds the run again as
a resume (a new executor places every shard on the capacity the cluster still has) and
continues from the last checkpoint, as many times as ``engine.retries`` allows. No Ray import
here: the CLI names the error without loading the optional extra.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["LostWorkerError", "run_retrying"]


class LostWorkerError(RuntimeError):
    """A worker of the run was lost (its machine, its actor or an object it owned): one line,
    what was lost and how the run continues."""


def run_retrying(sim: Any, run_once: Callable[[Any], Any], remake: Callable[[], Any]) -> Any:
    """``run_once(sim)``; on a :class:`LostWorkerError`, while ``engine.retries`` allow and the
    run writes a folder (its checkpoint is what the retry continues from), ``remake()`` (the
    same experiment as a resume) and run that. A resume is exact, so the metrics are an
    uninterrupted run's."""
    from lowband.console import log

    left = int(getattr(getattr(sim.exp, "engine", None), "retries", 0) or 0)
    while True:
        try:
            return run_once(sim)
        except LostWorkerError as exc:
            if left <= 0 or not getattr(sim, "write", False):
                raise
            left -= 1
            log.warning("%s; retrying: the run continues from its last checkpoint on the machines left "
                        "(%d retr%s left)", str(exc).split(";")[0], left, "y" if left == 1 else "ies")
            sim = remake()
