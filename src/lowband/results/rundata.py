"""A run as the table reads it (:class:`RunData`, from a store record: :func:`run_of_record`)
and a cell's value from it (:func:`value`, :func:`number_text`, with its decay and chance
marks: :func:`unlearned_text`, :func:`chance_text`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lowband.engine.checks import ChanceWatch, DecayWatch
from lowband.engine.runlog import rounds_to_target
from lowband.results.record import Record

UNITS = ("%", "GB", "MB", "rounds", "s", "")


@dataclass
class Cell:
    id: str
    table: str
    config: str
    metric: str
    paper: Any = None
    paper_unit: Optional[str] = None
    row: str = ""
    round: Optional[int] = None
    reference: Optional[str] = None
    #: seeds to run (None: the config's own seed only); the table shows every seed found
    seeds: Optional[list[int]] = None


def on_cpu(device: str) -> bool:
    """Whether a ``device`` spec is the CPU's, whose seconds count as CPU-hours (a GPU's
    count as GPU-hours); ``"auto"`` counts as the CPU (the spec, not the device it resolved
    to, is saved)."""
    return not device.lower().startswith(("cuda", "mps"))


@dataclass
class RunData:
    dir: Path
    metrics: list[dict]
    timing: list[dict]
    rounds_planned: int
    target: Optional[float]
    main: str
    threads: Optional[int] = None
    seed: int = 0
    #: the run's ``device`` as saved ("cpu" unless it ran on a GPU): its seconds are then
    #: GPU-hours, not CPU-hours (a table must not count a GPU's time as a core's)
    device: str = "cpu"
    #: the dataset's number of classes as the run's summary.json records it (None: a run
    #: before the record, or not finished): what :func:`chance_text` compares with
    classes: Optional[int] = None
    #: the saved config let the engine start worker processes (``engine.workers`` not 1,
    #: executor not Ray): a round logged without its ``workers`` may have used several
    pooled: bool = False

    @property
    def on_cpu(self) -> bool:
        """Not on a GPU by its saved spec (:func:`on_cpu`)."""
        return on_cpu(self.device)

    @property
    def rounds_done(self) -> int:
        return int(self.metrics[-1]["round"]) if self.metrics else 0

    @property
    def seconds(self) -> float:
        """Wall-clock seconds of the rounds that are in the log: the sum of each round's
        training and evaluation time (``timing.jsonl``; a resumed run's lines add up across
        its resumptions, where ``elapsed_s`` restarts with each)."""
        return float(sum(_wall_s(t) for t in self.timing))

    @property
    def untimed(self) -> int:
        """Rounds 1..:attr:`rounds_done` without a line in ``timing.jsonl`` (the file missing,
        torn or damaged): their time is unknown, so :attr:`seconds` leaves them out and the
        table says so instead of counting them as free."""
        timed = {t.get("round") for t in self.timing}
        return sum(r not in timed for r in range(1, self.rounds_done + 1))

    @property
    def unmetered(self) -> int:
        """Timed rounds without a measured CPU time (``cpu_s``: runs before it was recorded,
        Ray runs): :attr:`cpu_hours` counts them as wall-clock x threads x workers."""
        return sum(t.get("cpu_s") is None for t in self.timing)

    @property
    def uncounted_workers(self) -> bool:
        """Rounds of a pooled run logged before timing.jsonl recorded the engine's workers:
        their worker processes are not in :attr:`cpu_hours`, a lower bound then."""
        return self.on_cpu and self.pooled and any("workers" not in t for t in self.timing)

    @property
    def cpu_hours(self) -> float:
        """The CPU time of the logged rounds, in hours: per round the measured ``cpu_s`` (this
        process and its engine workers, :mod:`lowband.engine.cputime`), else its wall-clock
        seconds times the run's ``threads`` (1 where unset) times its engine ``workers`` (1
        where not recorded: older runs, whose worker processes are then not counted); 0 for a
        run on a GPU (its time is :attr:`gpu_hours`)."""
        if not self.on_cpu:
            return 0.0
        per_core = self.threads or 1
        return sum(t["cpu_s"] if t.get("cpu_s") is not None else
                   _wall_s(t) * per_core * int(t.get("workers") or 1)
                   for t in self.timing) / 3600

    @property
    def gpu_hours(self) -> float:
        """Wall-clock hours of a run on a GPU (one device), 0 for a CPU run."""
        return 0.0 if self.on_cpu else self.seconds / 3600


def _wall_s(line: dict) -> float:
    """A timing.jsonl line's wall-clock seconds: training and evaluation."""
    return (line.get("round_s") or 0.0) + (line.get("eval_s") or 0.0)


def run_of_record(rec: Record, exp: Any) -> RunData:
    """What the store's record ``rec`` holds of a run of ``exp``, read up to ``exp.rounds``
    (the config's rounds, or ``--rounds``): threads, seed and device as the run saved them."""
    cfg = rec.header.get("config") or {}
    n = int(exp.rounds)
    workers = (cfg.get("engine") or {}).get("workers", "auto")
    classes = (rec.header.get("summary") or {}).get("num_classes")
    threads = cfg.get("threads")
    return RunData(rec.path or Path("."), [m for m in rec.metrics if m["round"] <= n],
                   [t for t in rec.timing if t["round"] <= n], n, exp.eval.target, exp.eval.main or "consensus/acc",
                   int(threads) if threads else None, rec.seed, str(cfg.get("device", "cpu")),
                   int(classes) if isinstance(classes, int) else None,
                   pooled=cfg.get("executor", "serial") != "ray" and str(workers) != "1")


def bytes_per_round(d: RunData) -> Optional[float]:
    last = d.metrics[-1]
    if not d.rounds_done:
        return None
    return ((last.get("bytes/total") or 0) + (last.get("declared/total") or 0)) / d.rounds_done


def number_text(cell: Cell, v: float, *, mean: bool = False) -> str:
    """``v`` (a :func:`value` number, or a mean or std of them) as the table writes it."""
    m = cell.metric
    if m == "rounds_to_target":
        return f"{v:.1f}" if mean else f"{v:.0f}"
    if m == "bytes_per_round":
        return f"{v:,.2f}"
    if m == "comm_reduction":
        return f"{v:.2f}"
    if m.startswith("time/"):
        return f"{v:.1f}"
    if "acc" in m:
        return f"{v:.2f}"
    if m.startswith(("bytes/", "declared/")):
        return f"{v:,.1f}" if cell.paper_unit == "MB" else f"{v:,.3f}"
    return f"{v:.4g}"


Value = tuple[Optional[float], str]


def _number(cell: Cell, v: Optional[float], missing: str = "n/a") -> Value:
    return (None, missing) if v is None else (float(v), number_text(cell, float(v)))


def _rounds_to_target(cell: Cell, d: RunData, ref: Optional[RunData]) -> Value:
    if d.target is None:
        return None, "no target"
    hit = rounds_to_target(d.metrics, d.main, d.target)
    return (None, f"> {d.rounds_done}") if hit is None else _number(cell, float(hit["round"]))


def _bytes_per_round(cell: Cell, d: RunData, ref: Optional[RunData]) -> Value:
    b = bytes_per_round(d)
    return _number(cell, None if b is None else b / 1e6)


def _comm_reduction(cell: Cell, d: RunData, ref: Optional[RunData]) -> Value:
    b, rb = bytes_per_round(d), bytes_per_round(ref) if ref is not None else None
    return _number(cell, None if b is None or not rb else 100 * (1 - b / rb), "n/a (reference not run)")


def _time(cell: Cell, d: RunData, ref: Optional[RunData]) -> Value:
    key = cell.metric.split("/", 1)[1]
    if key == "elapsed_s":
        if d.untimed:
            return None, f"n/a ({d.untimed} of {d.rounds_done} rounds untimed)"
        return _number(cell, d.seconds if d.timing else None)
    vals = [t[key] for t in d.timing if t.get(key) is not None]
    return _number(cell, sum(vals) / len(vals) if vals else None)


def _logged(cell: Cell, d: RunData, ref: Optional[RunData]) -> Value:
    """A metrics.jsonl key at the cell's round (or the last), in the table's unit, with its
    decay and chance marks."""
    m = cell.metric
    if cell.round is not None and d.rounds_done < cell.round:
        return None, ""  # the run has not reached the cell's round yet
    recs = d.metrics if cell.round is None else [r for r in d.metrics if r["round"] <= cell.round]
    if not recs or recs[-1].get(m) is None:
        return None, "n/a"
    scale = 100 if "acc" in m else 1 / (1e6 if cell.paper_unit == "MB" else 1e9) \
        if m.startswith(("bytes/", "declared/")) else 1
    v = float(recs[-1][m]) * scale
    return v, number_text(cell, v) + unlearned_text(cell, recs) + chance_text(cell, recs, d.classes)


_DERIVED = {"rounds_to_target": _rounds_to_target, "bytes_per_round": _bytes_per_round,
            "comm_reduction": _comm_reduction}


def value(cell: Cell, d: RunData, ref: Optional[RunData]) -> Value:
    """(number, formatted) of ``cell`` from run ``d`` (``ref``: the reference's run, for
    ``comm_reduction``). A run with no round done (only the initial model's evaluation, e.g.
    one that has just started) measures nothing yet: its round-0 accuracy must not read as a
    result."""
    timed = cell.metric.startswith("time/")
    if d.rounds_done < 1 and not timed:
        return None, f"not measured yet (round 0 of {d.rounds_planned})"
    return (_time if timed else _DERIVED.get(cell.metric, _logged))(cell, d, ref)


def chance_text(cell: Cell, recs: list[dict], classes: Optional[int]) -> str:
    """`` (at chance: 1/C = X)`` when every evaluation of the cell's accuracy up to its round
    (round 0 left out) was within :data:`~lowband.engine.checks.CHANCE_MARGIN` of guessing
    among the run's ``classes``, else ``""``: such a number is a run that learned nothing,
    not a measurement of the method (the run-time warning's rule,
    :class:`~lowband.engine.checks.ChanceWatch`)."""
    watch = ChanceWatch(cell.metric, classes, rounds=1)
    for r in recs:
        watch.check(r, quiet=True)
    if not watch.at_chance or watch.chance is None:
        return ""
    return f" (at chance: 1/{classes} = {number_text(cell, 100 * watch.chance)})"


def unlearned_text(cell: Cell, recs: list[dict]) -> str:
    """`` (unlearned: best X at rN)`` when the cell's accuracy ``recs`` fell from what the
    run reached and stayed there, by the rule of the run-time warning
    (:class:`lowband.engine.checks.DecayWatch`, replayed quietly), else ``""``. A table
    reports the value at the cell's round; for a run that unlearned that value alone
    hides what the method reached (SPARK at paper size under the spec's schedule: 48.01
    at round 30, 77.76 at round 13)."""
    if "acc" not in cell.metric:
        return ""
    watch = DecayWatch(cell.metric)
    for r in recs:
        watch.check(r, quiet=True)
    if not watch.down or watch.peak is None:
        return ""  # never fell, or fell and recovered by the cell's round
    return f" (unlearned: best {number_text(cell, 100 * watch.peak[0])} at r{watch.peak[1]})"
