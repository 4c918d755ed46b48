"""Reading run folders for the table: what a run logged (:class:`RunData`, :func:`run_data_at`,
every seed of a config: :func:`seed_data`), the folders left out (damaged, or made by another
config: :func:`_not_a_run_of`, :func:`left_out_seeds`), and a cell's value from a run
(:func:`value`, :func:`number_text`, with its decay mark: :func:`unlearned_text`)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lowband.config.resolve import load_experiment
from lowband.engine.checks import ChanceWatch, DecayWatch
from lowband.engine.runlog import config_change_text, config_diff, rounds_to_target
from lowband.reproduce.cells import Cell


def _read_json(path: Path) -> Optional[dict]:
    """The JSON object in ``path`` (None: no file, unreadable, or not an object)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _jsonl(path: Path) -> list[dict]:
    """A run's JSON-lines log, strictly (:meth:`RunLog.read_jsonl`: a damaged one raises
    :class:`~lowband.engine.runlog.DamagedLogError`, a ValueError naming the line)."""
    from lowband.engine.runlog import RunLog

    return RunLog.read_jsonl(path)


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
        its sessions, where ``elapsed_s`` restarts with each)."""
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


def run_data_at(exp: Any, rd: Path) -> Optional[RunData]:
    """What run folder ``rd`` holds of a run of ``exp``, read up to ``exp.rounds`` (the
    config's rounds, or ``--rounds``: a run extended past them is read where the config's
    other runs are, so it neither reads as that config's result at another round nor marks
    them as behind); threads, seed and device as saved in its config.toml. None when it
    logged no round, or (said on stderr, with what to do) when its logs or saved config
    cannot be trusted."""
    path = rd / "metrics.jsonl"
    try:
        metrics = _jsonl(path)
    except (OSError, ValueError) as exc:
        return _leave_out(f"{path} is damaged ({_problem(exc)})", "restore the file, or move the folder away and run the "
                                                        "cell again")
    lost = _lost_rounds(rd, metrics)
    if lost:
        return _leave_out(f"{path} {lost}", "restore the file, or move the folder away and run the cell again")
    if not metrics:
        return None
    foreign = _not_a_run_of(exp, rd)
    if foreign:
        return _leave_out(*foreign)
    threads, seed, device = exp.threads, exp.seed, "cpu"
    workers, executor = exp.engine.workers, exp.executor
    saved = rd / "config.toml"
    if saved.exists():
        import tomllib

        cfg = tomllib.loads(saved.read_text())  # (readable: checked above)
        threads = cfg.get("threads", threads)
        seed = int(cfg.get("seed", seed))
        device = str(cfg.get("device", "cpu"))
        workers = (cfg.get("engine") or {}).get("workers", "auto")
        executor = cfg.get("executor", "serial")
    main = exp.eval.main or "consensus/acc"
    n = exp.rounds
    classes = (_read_json(rd / "summary.json") or {}).get("num_classes")
    return RunData(rd, [m for m in metrics if m["round"] <= n], [t for t in _timing(rd) if t["round"] <= n], n,
                   exp.eval.target, main, int(threads) if threads else None, seed, device,
                   int(classes) if isinstance(classes, int) else None,
                   pooled=executor != "ray" and str(workers) != "1")


def _leave_out(why: str, fix: str) -> None:
    """Say on stderr, in one line, that a run folder is left out of the table, why and how to
    fix it (returns None, what :func:`run_data_at` then returns)."""
    print(f"  warning: {why}; left out of the table: {fix}", file=sys.stderr)


def _lost_rounds(rd: Path, metrics: list[dict]) -> Optional[str]:
    """What is missing when ``rd``'s summary.json says the run completed more rounds than its
    ``metrics`` hold (None: it does not, or there is no summary): a finished run whose log
    lost its end (a torn copy) must not read as a run still under way at an earlier round.
    Fewer is normal: a finished run extended by a resume keeps its summary until it ends."""
    done = (_read_json(rd / "summary.json") or {}).get("rounds_completed")
    last = metrics[-1]["round"] if metrics else 0
    if not isinstance(done, int) or isinstance(done, bool) or done <= last:
        return None
    held = f"ends at round {last}" if metrics else "holds no round"
    return f"{held} but summary.json says {done} rounds were completed"


def _problem(exc: Exception) -> str:
    """What is wrong with a log that could not be read: a damaged line's description
    (:class:`~lowband.engine.runlog.DamagedLogError`), else the error."""
    return getattr(exc, "problem", None) or f"{type(exc).__name__}: {exc}"


def _timing(rd: Path) -> list[dict]:
    """The records of ``rd``'s timing.jsonl; a damaged one is said on stderr and read as
    none: the run's values stand, and its rounds count as untimed (:attr:`RunData.untimed`)."""
    path = rd / "timing.jsonl"
    try:
        return _jsonl(path)
    except (OSError, ValueError) as exc:
        print(f"  warning: {path} is damaged ({_problem(exc)}); the run's rounds count as untimed (its compute is "
              f"unknown): restore the file to count them", file=sys.stderr)
        return []


def _unreadable_config(rd: Path) -> Optional[str]:
    """Why ``rd``'s saved config.toml or hyperparams.json cannot be read, as ``"NAME cannot be
    read (ERROR)"`` (None: both can, or are absent): a torn or hand-edited file must not pass
    as a run of today's config (nothing could be compared) nor as one of another config
    (nothing says so). An absent hyperparams.json is a run made before lowband saved them
    (:func:`lowband.engine.runlog.saved_hyperparams`); an unreadable one is not."""
    import tomllib

    from lowband.engine.runlog import HYPERPARAMS_NAME

    for name, parse in (("config.toml", tomllib.loads), (HYPERPARAMS_NAME, _json_object)):
        path = rd / name
        if not path.exists():
            continue
        try:
            parse(path.read_text())
        except (OSError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            return f"{name} cannot be read ({type(exc).__name__}{': ' + first if first else ''})"
    return None


def _json_object(text: str) -> dict:
    """``text`` parsed as a JSON object (ValueError if it is not JSON, or not an object)."""
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError(f"not a JSON object but {type(obj).__name__}")
    return obj


def _not_a_run_of(exp: Any, rd: Path) -> Optional[tuple[str, str]]:
    """(why, what to do) when the run saved in ``rd`` cannot count as a run of ``exp``: its
    saved config cannot be read (:func:`_unreadable_config`) or says another config
    (:func:`~lowband.engine.runlog.config_diff`; where only ``threads`` differs, the fix is
    reproduce's ``--threads``, not a rerun); None when it is ``exp``'s. The one test both the
    table (which leaves such a folder out) and :func:`run_action` (which will not reuse it)
    apply."""
    unreadable = _unreadable_config(rd)
    if unreadable:
        return (f"{rd}/{unreadable}, so which config made this run cannot be told",
                "restore the file or move the folder away and run the cell again")
    try:
        diff = config_diff(rd, exp, ignore=("seed", "out_dir", "name"))
    except (OSError, ValueError):
        return None
    if not diff:
        return None
    why = f"{rd} was made by another config than today's ({config_change_text(diff)})"
    if set(diff) == {"threads"}:  # only the flag reproduce sets: the fix is the flag, not a rerun
        then = diff["threads"][0]
        flag = f"--threads {then}" if isinstance(then, int) else "no --threads"
        return why, f"collect or run with {flag}, as the run was made, to use it"
    return why, "move it away and run the cell again"


def run_data(config: str, overrides: list[str]) -> Optional[RunData]:
    """The run in ``config``'s own run folder (the config's seed)."""
    exp = load_experiment(config, overrides)
    return run_data_at(exp, exp.run_dir())


def seed_data(config: str, overrides: list[str]) -> dict[int, RunData]:
    """seed -> run of every seed of ``config`` found: its run folder ``R`` (the seed saved
    there) and ``R/seed-<s>/`` (the seed saved in each), sorted by seed. A second folder
    with a seed already found is left out (with a warning)."""
    from lowband.batch import seed_runs

    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    found: dict[int, RunData] = {}
    for folder in [rd, *seed_runs(rd)]:
        d = run_data_at(exp, folder)
        if d is None:
            continue
        if d.seed in found:
            print(f"  warning: {folder} repeats seed {d.seed} of {found[d.seed].dir}; left out", file=sys.stderr)
            continue
        found[d.seed] = d
    return dict(sorted(found.items()))


def left_out_seeds(config: str, overrides: list[str], runs: dict[int, RunData]) -> dict[int, Path]:
    """seed -> folder of ``config``'s run folders that hold a log but are not in ``runs``
    (:func:`seed_data` left them out: damaged, or made by another config; the warning said
    why), the seed read from the folder's name (``R``: the config's own seed). Their cells
    must not keep an earlier table's value as if the folder were gone: what is on disk now
    contradicts or cannot confirm it."""
    from lowband.batch import seed_runs

    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    loaded = {d.dir.resolve() for d in runs.values()}
    out: dict[int, Path] = {}
    for folder in [rd, *seed_runs(rd)]:
        log = folder / "metrics.jsonl"
        if folder.resolve() in loaded or not log.is_file() or log.stat().st_size == 0:
            continue
        m = re.fullmatch(r"seed-(\d+)", folder.name)
        out[int(m.group(1)) if m and folder != rd else int(exp.seed)] = folder
    return out


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


def value(cell: Cell, d: RunData, ref: Optional[RunData]) -> tuple[Optional[float], str]:
    """(number, formatted) of ``cell`` from run ``d``. A run with no round done (only the
    initial model's evaluation, e.g. one that has just started) measures nothing yet: its
    round-0 accuracy must not read as a result."""
    m = cell.metric
    if d.rounds_done < 1 and not m.startswith("time/"):
        return None, f"not measured yet (round 0 of {d.rounds_planned})"
    if m == "rounds_to_target":
        if d.target is None:
            return None, "no target"
        hit = rounds_to_target(d.metrics, d.main, d.target)
        if hit is not None:
            return float(hit["round"]), number_text(cell, float(hit["round"]))
        return None, f"> {d.rounds_done}"
    if m == "bytes_per_round":
        b = bytes_per_round(d)
        return (None, "n/a") if b is None else (b / 1e6, number_text(cell, b / 1e6))
    if m == "comm_reduction":
        b = bytes_per_round(d)
        rb = bytes_per_round(ref) if ref is not None else None
        if b is None or not rb:
            return None, "n/a (reference not run)"
        v = 100 * (1 - b / rb)
        return v, number_text(cell, v)
    if m.startswith("time/"):
        key = m.split("/", 1)[1]
        if key == "elapsed_s" and d.untimed:
            return None, f"n/a ({d.untimed} of {d.rounds_done} rounds untimed)"
        if key == "elapsed_s":
            v = d.seconds if d.timing else None
        else:
            vals = [t.get(key) for t in d.timing if t.get(key) is not None]
            v = sum(vals) / len(vals) if vals else None
        return (None, "n/a") if v is None else (float(v), number_text(cell, float(v)))
    if cell.round is not None and d.rounds_done < cell.round:
        return None, ""  # the run has not reached the cell's round yet
    recs = d.metrics if cell.round is None else [r for r in d.metrics if r["round"] <= cell.round]
    if not recs or recs[-1].get(m) is None:
        return None, "n/a"
    v = float(recs[-1][m])
    if "acc" in m:
        v *= 100
    elif m.startswith(("bytes/", "declared/")):
        v /= 1e6 if cell.paper_unit == "MB" else 1e9
    return v, number_text(cell, v) + unlearned_text(cell, recs) + chance_text(cell, recs, d.classes)


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
