"""Console output: log levels and the progress bar of several runs (seeds, sweeps).

lowband logs to the ``"lowband"`` logger; the CLI sets its level from ``-v`` (debug),
``-q`` (warnings only, no progress bars) or ``--log-level``. Messages go to stderr,
looked up when written, so a live rich progress bar (which redirects stderr) keeps them
above the bar, and pytest's capture sees them.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Optional

log = logging.getLogger("lowband")

LEVELS = ("debug", "info", "warning", "error")


class _StderrHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def setup_logging(level: str | int = "info") -> int:
    """Send the ``lowband`` logger's records at ``level`` and above to stderr; returns the level."""
    lvl = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(lvl, int):
        raise ValueError(f"--log-level {level!r}: choose one of {', '.join(LEVELS)}")
    log.setLevel(lvl)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(h)
    log.propagate = False
    return lvl


def quiet() -> bool:
    """True when the logger shows warnings only (``-q``): no progress bars then."""
    return log.getEffectiveLevel() > logging.INFO


class BatchProgress:
    """One bar over all the rounds a batch of runs still has to do, with an ETA for the
    whole batch, the runs finished, and the latest round's main metric and MB."""

    def __init__(self, title: str, total_rounds: int, total_runs: int, *, enabled: bool = True):
        self.total_runs, self.done_runs = total_runs, 0
        self.latest = ""
        self.t0 = time.perf_counter()
        self._bar: Any = None
        if enabled and total_rounds > 0:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("rounds, {task.fields[runs]}"), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), _eta_column(), transient=False)
            self._task = self._bar.add_task(title, total=total_rounds, runs=self._runs(), info="")
            self._bar.start()

    def _runs(self) -> str:
        return f"{self.done_runs}/{self.total_runs} runs"

    def advance(self, rounds: int = 0, info: Optional[str] = None) -> None:
        if info is not None:
            self.latest = info
        if self._bar is not None:
            self._bar.update(self._task, advance=rounds, runs=self._runs(), info=self.latest)

    def run_done(self) -> None:
        self.done_runs += 1
        self.advance(0)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def eta_seconds(elapsed: Optional[float], completed: float, total: Optional[float]) -> Optional[float]:
    """Seconds left at the mean pace so far (elapsed / completed per unit), None before the
    first unit is done. rich's own remaining-time column estimates the speed from the last
    30 s only, so a round slower than 30 s showed ``-:--:--`` for the whole run."""
    if not elapsed or completed <= 0 or total is None:
        return None
    return max(total - completed, 0) * elapsed / completed


def _eta_column() -> Any:
    """A rich column: ``eta H:MM:SS`` from :func:`eta_seconds` (``eta -:--:--`` until a round is done)."""
    import datetime

    from rich.progress import ProgressColumn
    from rich.text import Text

    class EtaColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            left = eta_seconds(task.elapsed, task.completed, task.total)
            txt = "-:--:--" if left is None else str(datetime.timedelta(seconds=int(round(left))))
            return Text(f"eta {txt}", style="progress.remaining")

    return EtaColumn()


def round_info(label: str, r: int, rec: dict[str, Any], main: str) -> str:
    """``label r5 acc=81.2% 3.1 MB``: the latest round of a run, for progress lines."""
    acc = rec.get(main)
    mb = ((rec.get("bytes/total", 0) or 0) + (rec.get("declared/total", 0) or 0)) / 1e6
    s = f"{label} r{r}"
    if acc is not None:
        s += f" {main.split('/')[-1]}={100 * acc:.2f}%"
    return s + f" {mb:.2f} MB"


__all__ = ["BatchProgress", "LEVELS", "eta_seconds", "log", "quiet", "round_info", "setup_logging"]


class RunProgress:
    """A rich progress bar of one run showing round, main accuracy and MB sent so far
    (``lowband run``, ``lowband demo``, ``lb.run(progress=True)``)."""

    def __init__(self, title: str, main: str, total: int, quiet: bool = False):
        self.main, self.quiet, self.total = main, quiet, total
        self._bar = None
        if not quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), _eta_column(),
                                 transient=False)
            self._task = self._bar.add_task(title, total=total, info="")
            self._bar.start()

    def __call__(self, r: int, total: int, rec: dict[str, Any]) -> None:
        log.debug("%s", round_info("round", r, rec, self.main))
        if self._bar is None:
            return
        acc = rec.get(self.main)
        mb = (rec.get("bytes/total", 0) or 0) / 1e6
        decl = (rec.get("declared/total", 0) or 0) / 1e6
        info = f"{self.main}={100 * acc:.2f}%  " if acc is not None else ""
        info += f"{mb:.2f} MB" + (f" (+{decl:.1f} MB declared)" if decl else "")
        self._bar.update(self._task, completed=r, info=info)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
