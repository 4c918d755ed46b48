"""``lowband reproduce PAPER``: run a paper's table cells and write paper-vs-ours tables.

A paper's cells are listed in ``experiments/PAPER/reproduce.toml``::

    paper = "spark"

    [[run]]
    id = "table1/a0.1/spark"          # unique cell id (``--only`` matches it)
    table = "table1"                  # section of the output
    row = "SPARK"                     # optional label
    config = "experiments/spark/spark_a0.1.toml"
    metric = "rounds_to_target"       # see below
    round = 50                        # optional: the value at this round, not the last one
    paper = 6                         # the paper's number (or text such as "200+")
    paper_unit = "rounds"             # optional: "%", "GB", "MB", "rounds", "s"
    reference = "experiments/..."     # comm_reduction only: the baseline config
    seeds = [0, 1, 2]                 # optional: run the config once per seed

Metrics: any key of ``metrics.jsonl`` (accuracies shown in %, cumulative ``bytes/...`` in GB
unless ``paper_unit`` says MB); ``rounds_to_target`` (first evaluated round whose main
metric reaches the config's ``eval.target``); ``bytes_per_round`` (encoded + declared bytes
per round, MB); ``comm_reduction`` (``100 (1 - bytes_per_round / reference's)``, %);
``time/elapsed_s`` and ``time/round_s`` (mean) from ``timing.jsonl``.

Seeds: ``seeds = [...]`` at the top of reproduce.toml (every cell) or in a ``[[run]]``
(that cell), or ``--seeds 0,1,2`` (every selected cell), runs the config once per seed.
The config's own seed (``seed``, default 0) runs in the config's run folder ``R`` as
before; seed ``s`` runs in ``R/seed-<s>/`` (as ``lowband run CONFIG seed=s
out_dir=R/seed-<s>``). A folder ``R`` made by ``lowband run CONFIG --seeds ...`` (every
seed in ``R/seed-<s>/``, nothing run in ``R`` itself) is read and extended the same way.
A cell's value is then ``mean ± std (n=...)`` over every seed run found for its config
(also seeds no cell asked for), and the per-seed values are listed below its table.

Where the papers are: ``--experiments DIR`` if given, else ``./experiments`` when it holds
``PAPER/reproduce.toml`` (a source checkout, or your own papers), else the copy shipped in
the package (``lowband/experiments``, package data), so an installed lowband reproduces in
any folder. A ``config`` path ``experiments/X/Y.toml`` is read from that folder.

Every config runs once however many cells use it, in its own run folder (the config's
``out_dir``, else ``runs/<name>``, relative to the current folder): a finished run is
reused, an interrupted one is resumed from its checkpoint (or restarted from round 0 when
it was killed before its first checkpoint; each seed likewise), and ``--rounds N``
shortens (or extends) runs;
the table says how many rounds each number comes from, reading every run up to the rounds
asked (the config's, or ``--rounds``), also a run extended past them. ``--collect`` only
tabulates what exists; a folder whose logs or saved config are damaged (:func:`run_data_at`)
is left out, with one line on stderr saying which file and what to do, and rounds without
timing are said to be untimed, not counted as free.
``--dry-run`` runs and writes nothing: for every run it says what a real run would do
with its folder (:func:`run_action`, which :func:`run_config` acts on) and the CPU-hours it
still needs, timed on the folder's own rounds or on the config's other seed runs
(:func:`estimate`), then the totals. The table goes to ``--out`` (a folder, or a ``.md`` file; default
``results/PAPER_table.md``; nothing is written under ``docs/`` unless ``--out`` says so)
and its header states the compute its runs took (including the compute recorded for
cells kept from the previous table).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
import time
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, get_args

from lowband.config import ConfigError, Experiment, load_experiment, load_toml
from lowband.engine.checks import DECAY_DROP, DECAY_WINDOW, DecayWatch

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


def packaged_experiments() -> Optional[Path]:
    """The experiments folder shipped with the package (``lowband/experiments``), if any."""
    try:
        p = Path(str(resources.files("lowband") / "experiments"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - a zipped install
        return None
    return p if p.is_dir() else None


def experiment_roots(experiments: Optional[Path] = None) -> list[Path]:
    """Where papers are looked up, in order: ``experiments`` if given, else
    ``./experiments`` and then the packaged copy."""
    if experiments is not None:
        return [Path(experiments)]
    roots = [Path("experiments")]
    shipped = packaged_experiments()
    if shipped is not None and shipped.resolve() != roots[0].resolve():
        roots.append(shipped)
    return roots


def locate(paper: str, experiments: Optional[Path] = None) -> Path:
    """The experiments folder that holds ``PAPER/reproduce.toml`` (one-line ConfigError)."""
    roots = experiment_roots(experiments)
    for root in roots:
        if (root / paper / "reproduce.toml").is_file():
            return root
    known = sorted({p.parent.name for r in roots for p in r.glob("*/reproduce.toml")})
    where = " or ".join(str(r / paper / "reproduce.toml") for r in roots)
    raise ConfigError(f"no {where}; papers with a reproduce.toml: {', '.join(known) or 'none'}")


def resolve_config(ref: str, experiments: Path, paper_dir: Path) -> str:
    """The file a ``config``/``reference`` entry names: ``experiments/X/Y.toml`` inside the
    experiments folder in use; another relative path relative to the paper's folder."""
    p = Path(ref)
    if p.is_absolute():
        return str(p)
    if p.parts and p.parts[0] == "experiments":
        return str(experiments.joinpath(*p.parts[1:]))
    return str(paper_dir / p)


def load_cells(paper: str, root: Optional[Path] = None, *, experiments: Optional[Path] = None) -> list[Cell]:
    """The cells of ``PAPER/reproduce.toml`` with their config paths resolved (one-line
    ConfigError on problems). ``root``: a folder holding ``experiments/`` (a checkout);
    else ``experiments`` or the default lookup (:func:`locate`)."""
    exp_dir = locate(paper, Path(root) / "experiments" if root is not None else experiments)
    path = exp_dir / paper / "reproduce.toml"
    raw = load_toml(path)
    bad_top = set(raw) - {"paper", "run", "seeds"}
    if bad_top:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(bad_top)}; allowed: paper, run, seeds")
    default_seeds = _seeds(raw["seeds"], f"{path}: seeds") if "seeds" in raw else None
    cells, seen = [], set()
    allowed = set(Cell.__dataclass_fields__)
    for i, r in enumerate(raw.get("run", [])):
        bad = set(r) - allowed
        if bad:
            raise ConfigError(f"{path}: run #{i + 1}: unknown key(s) {sorted(bad)}; allowed: {sorted(allowed)}")
        for key in ("id", "table", "config", "metric"):
            if key not in r:
                raise ConfigError(f"{path}: run #{i + 1} has no {key!r}")
        if r["id"] in seen:
            raise ConfigError(f"{path}: duplicate id {r['id']!r}")
        if r.get("paper_unit") not in (None, *UNITS):
            raise ConfigError(f"{path}: {r['id']}: paper_unit must be one of {UNITS}")
        if r["metric"] == "comm_reduction" and not r.get("reference"):
            raise ConfigError(f"{path}: {r['id']}: comm_reduction needs reference = <config path>")
        seen.add(r["id"])
        for key in ("config", "reference"):
            if r.get(key):
                r[key] = resolve_config(r[key], exp_dir, path.parent)
        r["seeds"] = _seeds(r["seeds"], f"{path}: {r['id']}: seeds") if "seeds" in r else default_seeds
        cells.append(Cell(**r))
    if not cells:
        raise ConfigError(f"{path}: no [[run]] entries")
    return cells


def _seeds(value: Any, where: str) -> list[int]:
    """A ``seeds`` entry (a list of distinct non-negative integers, or ``"0-2"`` text)."""
    from lowband.batch import parse_seeds

    if isinstance(value, bool) or not isinstance(value, (list, str)) or (
            isinstance(value, list) and not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"{where} must be a list of seeds, e.g. [0, 1, 2]")
    try:
        return parse_seeds(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {str(exc).split(': ', 1)[-1]}") from None


def with_seeds(cells: list[Cell], seeds: Optional[str]) -> list[Cell]:
    """``--seeds 0,1,2``: every cell runs these seeds (instead of its own ``seeds``)."""
    if not seeds:
        return cells
    from lowband.batch import parse_seeds

    chosen = parse_seeds(seeds)
    return [replace(c, seeds=list(chosen)) for c in cells]


def select(cells: list[Cell], only: Optional[str]) -> list[Cell]:
    """Cells whose id matches one of the comma-separated glob patterns (or prefixes)."""
    if not only:
        return cells
    pats = [p.strip() for p in only.split(",") if p.strip()]
    out = [c for c in cells if any(fnmatch.fnmatchcase(c.id, p) or c.id.startswith(p) for p in pats)]
    if not out:
        raise ConfigError(f"--only {only!r} matches no cell id (ids look like {cells[0].id!r})")
    return out


def _overrides(args: argparse.Namespace) -> list[str]:
    out = []
    if args.rounds is not None:
        out.append(f"rounds={int(args.rounds)}")
    if args.threads is not None:
        out.append(f"threads={int(args.threads)}")
    if args.data_dir:
        out.append('data.data_dir="' + str(args.data_dir).replace("\\", "\\\\").replace('"', '\\"') + '"')
    return out


# --------------------------------------------------------------------------- running


def short(path: str) -> str:
    """``path`` relative to the current folder when inside it, else its last two parts."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(*p.parts[-2:]))


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _batch_layout(rd: Path) -> bool:
    """``rd`` holds seed folders and no run of its own (made by ``lowband run CONFIG --seeds
    ...``, or seeds run before the config's own): the config's own seed goes to
    ``rd/seed-<s>/`` too (lowband never writes a run into a folder holding other files)."""
    from lowband.batch import seed_runs

    return not (rd / "config.toml").exists() and bool(seed_runs(rd))


def seed_overrides(config: str, overrides: list[str], seed: Optional[int]) -> list[str]:
    """The overrides that run ``config`` with ``seed`` in its seed folder: none for the
    config's own seed (its run folder ``R``, unless ``R`` holds seed folders and no run of
    its own: then ``R/seed-<s>/``), else ``seed=s`` and ``out_dir=R/seed-<s>`` (what
    ``lowband run CONFIG seed=s out_dir=R/seed-<s>`` does, so runs made that way are
    reused and resumed). ``seed`` None: the config's own seed."""
    from lowband.batch import seed_dir

    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    seed = exp.seed if seed is None else seed
    if seed == exp.seed and not _batch_layout(rd):
        return list(overrides)
    return [*overrides, f"seed={int(seed)}", f"out_dir={_quote(str(seed_dir(rd, seed)))}"]


def run_plan(cells: list[Cell], overrides: Optional[list[str]] = None) -> list[tuple[str, Optional[int]]]:
    """(config, seed) pairs to run, each run folder once: a cell's config with its
    ``seeds`` (None: the config's own seed), and each ``reference`` with its own seed."""
    pairs: dict[tuple[str, Optional[int]], None] = {}
    for c in cells:
        for s in (c.seeds or [None]):
            pairs[(c.config, s)] = None
    for c in cells:
        if c.reference:
            pairs[(c.reference, None)] = None
    out: dict[str, tuple[str, Optional[int]]] = {}
    for cfg, s in pairs:
        rd = load_experiment(cfg, seed_overrides(cfg, overrides or [], s)).run_dir()
        out.setdefault(str(rd.resolve()), (cfg, s))
    return list(out.values())


#: what ``lowband reproduce`` does with one run folder (:func:`run_action`)
Action = Literal["reuse", "resume", "restart", "run", "keep", "skip"]


@dataclass(frozen=True)
class Recorded:
    """What the table being replaced holds of one seed run of a config: the round its
    values are from (``rounds``, of ``planned``) and its CPU-hours where recorded. Read by
    :func:`recorded_runs` for runs whose folders are gone."""

    rounds: int
    planned: int
    cpu_hours: Optional[float] = None


def recorded_runs(previous: dict[str, tuple[str, str, str]], cells: list["Cell"], config: str,
                  overrides: list[str]) -> dict[int, Recorded]:
    """seed -> :class:`Recorded` for each seed of ``config`` that every cell of ``config``
    among ``cells`` holds a value of in ``previous`` (the table at ``--out``; see
    :func:`previous_cells`), from ``config``'s own run folder. A cell added since, or one
    without a value for the seed, leaves the seed out: it has something to measure."""
    mine = [c for c in cells if c.config == config]
    if mine and changed_since(previous, config, overrides):
        return {}  # its values were measured under another config: they are no reason not to run it
    found: list[dict[int, KeptSeed]] = []
    planned = 0
    for c in mine:
        if c.id not in previous or not _same_run(previous[c.id][2], config, overrides):
            return {}
        ours, rounds, where = previous[c.id]
        note = previous.get(f"seeds/{c.id}", ("", "", ""))[2]
        if not note and " seeds " not in where.split("`")[-1]:
            note = f"{config_seed(config, overrides)}: {ours}{_one_seed_compute(where)}"
        ks = kept_seeds(note, rounds, set())
        spent = _CPU_H.search(where)
        if ks and spent and "GPU-h" not in where and all(k.cpu_hours is None for k in ks.values()):
            # a table from before per-seed compute: the cell's hours shared evenly (for estimates)
            held = _HELD.search(where)
            total = float(spent.group(2)) + (float(held.group(3)) if held and held.group(3) else 0.0)
            ks = {s: replace(k, cpu_hours=total / len(ks)) for s, k in ks.items()}
        found.append(ks)
        of = re.match(r"(?:\d+-)?\d+/(\d+)", rounds.strip())
        planned = max(planned, int(of.group(1)) if of else 0)
    if not found:
        return {}
    common = set.intersection(*(set(k) for k in found))
    return {s: Recorded(min(k[s].rounds for k in found), planned,
                        next((k[s].cpu_hours for k in found if k[s].cpu_hours is not None), None))
            for s in sorted(common)}


@dataclass(frozen=True)
class Planned:
    """One (config, seed) run as :func:`run_action` found it: what would be done
    (``action``), the experiment and its run folder, the rounds the folder has completed
    (``done``: summary.json's for ``reuse``, the last round logged otherwise, 0 for a new
    folder) and, for ``skip``, why (the refusal a real run would print)."""

    action: Action
    exp: Experiment
    dir: Path
    done: int = 0
    reason: str = ""


def run_action(config: str, overrides: list[str], seed: Optional[int] = None,
               recorded: Optional[Recorded] = None) -> Planned:
    """Decide what :func:`run_config` does with ``config`` (with ``seed``: in that seed's
    folder, see :func:`seed_overrides`), reading the run folder and writing nothing, so a
    dry run and a real run cannot disagree: ``reuse`` a finished run (summary.json with
    enough rounds), ``resume`` one with a checkpoint, ``restart`` one with a config.toml
    and no checkpoint (killed before its first one: it runs again from round 0), ``run`` a
    new one, ``keep`` one whose folder is gone while the table being replaced holds its
    values at the rounds asked (``recorded``: see :func:`recorded_runs`; the table keeps
    them, so making the run again would spend its hours on cells that have their number),
    and ``skip`` a folder lowband would refuse (a run of another config, files it did not
    write): :meth:`RunLog.check`, the check a run makes before it writes."""
    from lowband.engine.runlog import RunDirError, RunLog

    exp = load_experiment(config, seed_overrides(config, overrides, seed))
    rd = exp.run_dir()
    done = (_read_json(rd / "summary.json") or {}).get("rounds_completed")
    if done is not None and done >= exp.rounds:
        # a finished run of another config must not pass as this one's: the table would leave
        # it out, and the cell would never be run
        foreign = _not_a_run_of(exp, rd)
        if foreign:
            return Planned("skip", exp, rd, int(done), reason=f"{rd} holds a finished run of another config "
                                                              f"({foreign[0]}); move it away to run this one")
        return Planned("reuse", exp, rd, int(done))
    started = (rd / "config.toml").exists()
    try:
        log = RunLog.check(exp, resume=started)
    except RunDirError as exc:
        return Planned("skip", exp, rd, reason=str(exc))
    if not started and _keeps(recorded, exp):
        return Planned("keep", exp, rd, recorded.rounds,
                       reason=f"the table holds its values at round {recorded.rounds} from a run folder no longer here "
                              f"(--remake-kept makes it again)")
    if not started:
        return Planned("run", exp, rd)
    # (restart: killed before its first checkpoint, or run without checkpoints)
    return Planned("resume" if log.ckpt_path.exists() else "restart", exp, rd, log.completed_rounds())


def kept_runs(previous: dict[str, tuple[str, str, str]], cells: list["Cell"], configs: list[str],
              overrides: list[str]) -> dict[str, dict[int, Recorded]]:
    """config -> :func:`recorded_runs` for every config of ``cells``, where a config that
    other cells use as their ``reference`` keeps nothing while any such cell's own config
    is measured again (:func:`_measured_again`: a run of it on disk, or one to make): the
    table then computes that cell from its runs, each divided by the reference's run (its
    own seed serves every seed), and a kept reference would leave it "n/a"."""
    out = {cfg: recorded_runs(previous, cells, cfg, overrides) for cfg in configs}
    changed = True
    while changed:  # a reference made again may itself be another cell's config: to a fixed point
        changed = False
        for cfg in configs:
            if out[cfg] and any(_measured_again(cells, c.config, out.get(c.config, {}), overrides)
                                for c in cells if c.reference == cfg):
                out[cfg], changed = {}, True
    return out


def _keeps(recorded: Optional[Recorded], exp: Experiment) -> bool:
    """Whether the table's ``recorded`` values of a run are those of ``exp`` at its rounds:
    from the rounds asked, no fewer (a run under way) and no more (a run folder extended
    past them is read at them too, :func:`run_data_at`; ``--rounds`` shorter than the
    table's measures another number)."""
    return recorded is not None and recorded.rounds == exp.rounds


def _measured_again(cells: list["Cell"], config: str, recorded: dict[int, Recorded], overrides: list[str]) -> bool:
    """Whether the table computes ``config``'s cells from runs rather than keeping them:
    a run folder of it holds a log, or a run of it planned is not kept (``recorded``)."""
    if left_out_seeds(config, overrides, {}):  # (every folder with a log, none loaded)
        return True
    for cfg, seed in run_plan([c for c in cells if c.config == config], overrides):
        if cfg == config:
            exp = load_experiment(cfg, seed_overrides(cfg, overrides, seed))
            if not _keeps(recorded.get(_seed_of(cfg, overrides, seed)), exp):
                return True
    return False


def _seed_of(config: str, overrides: list[str], seed: Optional[int]) -> int:
    """The seed a planned run uses: ``seed``, or the config's own where the plan gives none."""
    return config_seed(config, overrides) if seed is None else seed


def run_name(config: str, seed: Optional[int]) -> str:
    """How a run is named in the progress lines: the config (see :func:`short`) and its seed."""
    return short(config) + ("" if seed is None else f" seed {seed}")


def run_config(config: str, overrides: list[str], *, quiet: bool = True, seed: Optional[int] = None,
               recorded: Optional[Recorded] = None) -> Optional[str]:
    """Run, resume or reuse one config (with ``seed``: in that seed's folder, see
    :func:`seed_overrides`), as :func:`run_action` decides; returns its run folder (None
    when it was skipped).

    A finished run (``summary.json`` with enough rounds) is reused; one with a checkpoint
    resumes from it (``--rounds`` may extend it); one killed before its first checkpoint
    restarts from round 0 in the same folder (the rounds it had logged are deterministic
    and come out identical). A folder saved with another config is left alone (skipped,
    with the reason on stderr), before any data is loaded. A run whose folder is gone while
    the table keeps its values (``recorded``) is kept, not made again."""
    from lowband.engine.runlog import RunDirError
    from lowband.engine.simulator import Simulation

    plan = run_action(config, overrides, seed, recorded)
    name = run_name(config, seed)
    if plan.action == "reuse":
        print(f"  reuse   {name} -> {plan.dir} ({plan.done} rounds)")
        return str(plan.dir)
    if plan.action == "keep":
        print(f"  keep    {name}: {plan.reason}")
        return str(plan.dir)
    if plan.action == "skip":
        print(f"  skip    {name}: {plan.reason}", file=sys.stderr, flush=True)
        return None
    print(f"  {plan.action:<7} {name} -> {plan.dir} ({plan.exp.rounds} rounds)", flush=True)
    t0 = time.perf_counter()
    try:
        Simulation(plan.exp, resume=plan.action != "run").run()
    except RunDirError as exc:  # what only opening the folder tells (an unreadable checkpoint)
        print(f"  skip    {name}: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"  done    {name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return str(plan.dir)


# --------------------------------------------------------------------------- collecting


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
        return float(sum((t.get("round_s") or 0.0) + (t.get("eval_s") or 0.0) for t in self.timing))

    @property
    def untimed(self) -> int:
        """Rounds 1..:attr:`rounds_done` without a line in ``timing.jsonl`` (the file missing,
        torn or damaged): their time is unknown, so :attr:`seconds` leaves them out and the
        table says so instead of counting them as free."""
        timed = {t.get("round") for t in self.timing}
        return sum(r not in timed for r in range(1, self.rounds_done + 1))

    @property
    def cpu_hours(self) -> float:
        """:attr:`seconds` times the run's ``threads`` (1 where unset), in hours; 0 for a
        run on a GPU (its time is :attr:`gpu_hours`)."""
        return self.seconds * (self.threads or 1) / 3600 if self.on_cpu else 0.0

    @property
    def gpu_hours(self) -> float:
        """Wall-clock hours of a run on a GPU (one device), 0 for a CPU run."""
        return 0.0 if self.on_cpu else self.seconds / 3600


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
    saved = rd / "config.toml"
    if saved.exists():
        import tomllib

        cfg = tomllib.loads(saved.read_text())  # (readable: checked above)
        threads = cfg.get("threads", threads)
        seed = int(cfg.get("seed", seed))
        device = str(cfg.get("device", "cpu"))
    main = exp.eval.main or "consensus/acc"
    n = exp.rounds
    return RunData(rd, [m for m in metrics if m["round"] <= n], [t for t in _timing(rd) if t["round"] <= n], n,
                   exp.eval.target, main, int(threads) if threads else None, seed, device)


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
    (:func:`_stale`); None when it is ``exp``'s. The one test both the table (which leaves
    such a folder out) and :func:`run_action` (which will not reuse it) apply."""
    unreadable = _unreadable_config(rd)
    if unreadable:
        return (f"{rd}/{unreadable}, so which config made this run cannot be told",
                "restore the file or move the folder away and run the cell again")
    stale = _stale(exp, rd)
    if stale:
        return f"{rd} was made by another config than today's ({stale})", "move it away and run the cell again"
    return None


def _stale(exp: Any, rd: Path) -> Optional[str]:
    """Why the run in ``rd`` is not a run of ``exp`` (None: it is, or cannot be told): its
    saved config or hyperparameters differ beyond what a resume may change, the seed and
    the folder (a seed run is the config with ``seed`` and ``out_dir`` set)."""
    from lowband.engine.runlog import config_change

    try:
        return config_change(rd, exp, ignore=("seed", "out_dir", "name"))
    except (OSError, ValueError):
        return None


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
        for rec in d.metrics:
            v = rec.get(d.main)
            if v is not None and v >= d.target:
                return float(rec["round"]), number_text(cell, float(rec["round"]))
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
    return v, number_text(cell, v) + unlearned_text(cell, recs)


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


@dataclass(frozen=True)
class KeptSeed:
    """One seed's value kept from the previous table because its run folder is gone while
    other seeds of the same config are on disk: ``value`` (None where the text holds no
    number, e.g. ``> 30``), its ``text`` as that table wrote it, and ``rounds`` (how far
    that table's runs had got)."""

    value: Optional[float]
    text: str
    rounds: int
    cpu_hours: Optional[float] = None  #: the seed's compute as that table recorded it, if it did
    spent: str = ""  #: that compute as the table wrote it (`` (0.81 CPU-h)``, `` (0.1 GPU-h)``)


_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
_SEED_CPU_H = re.compile(r" \(([0-9.eE+-]+) ([CG])PU-h\)$")


def seed_compute(d: RunData) -> str:
    """The suffix a seed's entry in a per-seed list carries: its own compute (`` (0.81
    CPU-h)``, GPU-hours for a run on a GPU; nothing for an untimed run). A later table that
    keeps the seed after its folder is gone reads its CPU-hours back from there, so the
    compute the header states stays that seed's and does not drift between collects."""
    if d.gpu_hours:
        return f" ({d.gpu_hours:.3g} GPU-h)"
    return f" ({d.cpu_hours:.3g} CPU-h)" if d.cpu_hours else ""


def kept_seeds(note: str, rounds: str, on_disk: set[int]) -> dict[int, KeptSeed]:
    """Seeds of a previous table's per-seed list ``note`` (``"0: 79.43, 1: behind (round 0
    of 30)"``) that have a value there and no run folder now (``on_disk``): a cleaned
    ``runs/`` must not erase a seed that was measured when the other seeds are rerun.
    ``rounds`` is that table's *rounds* column (``"0-30/30"``): the kept values are from
    its furthest round. A seed that was behind, or had no value, is not kept (``> 30``, a
    target not reached, is a value)."""
    done = re.match(r"(?:\d+-)?(\d+)/\d+", rounds.strip())
    furthest = int(done.group(1)) if done else 0
    out: dict[int, KeptSeed] = {}
    for m in re.finditer(r"(?:^|, )(\d+): (.*?)(?=, \d+: |$)", note):
        s, text = int(m.group(1)), m.group(2).strip()
        if s in on_disk or text in ("", "-") or text.startswith("behind"):
            continue
        spent = _SEED_CPU_H.search(text)
        text = text[:spent.start()] if spent else text
        num = _NUMBER.match(text)
        if num is None and not text.startswith(">"):  # "n/a (reference not run)": nothing measured
            continue
        out[s] = KeptSeed(float(num.group(0).replace(",", "")) if num else None, text, furthest,
                          float(spent.group(1)) if spent and spent.group(2) == "C" else None,
                          spent.group(0) if spent else "")
    return out


def seeds_value(cell: Cell, runs: dict[int, RunData], refs: dict[int, RunData],
                kept: Optional[dict[int, KeptSeed]] = None) -> tuple[str, list[str]]:
    """(*ours*, per-seed texts) of ``cell`` over its config's seed ``runs`` (and the
    ``kept`` seeds whose folders are gone): the one run's text for a single seed, else
    ``mean ± std (n=k)`` over the seeds with a number (``of N`` when some have none, e.g.
    a target not reached); ``refs`` are the reference's runs (paired by seed, else its
    first)."""
    from lowband.batch import stats

    kept = kept or {}
    # a cell read at the run's end (no ``round``) pools only the seeds that got furthest: a
    # seed still under way would mix round 3 into a round-30 mean (it counts as "n=k of N")
    furthest = max([d.rounds_done for d in runs.values()] + [k.rounds for k in kept.values()])
    per = []
    for s in sorted({*runs, *kept}):
        d, k = runs.get(s), kept.get(s)
        done = d.rounds_done if d is not None else k.rounds
        if cell.round is None and done < furthest:
            per.append((s, None, f"behind (round {done} of {furthest})"))
        elif d is not None:
            ref = refs.get(s) or next(iter(refs.values()), None)
            per.append((s, *value(cell, d, ref)))
        else:
            per.append((s, k.value, k.text))
    texts = [f"{s}: {t or '-'}" for s, _, t in per]
    if len(per) == 1:
        return per[0][2], texts
    nums = [v for _, v, _ in per if v is not None]
    if not nums:
        distinct = list(dict.fromkeys(t for _, _, t in per if not t.startswith("behind")))
        return (distinct[0] if len(distinct) == 1 else "; ".join(t or "-" for t in distinct)), texts
    st = stats(nums)
    ours = number_text(cell, st["mean"], mean=True)
    if st["std"] is not None:
        ours += f" ± {number_text(cell, st['std'], mean=True)}"
    ours += f" (n={len(nums)}" + (f" of {len(per)})" if len(nums) < len(per) else ")")
    fell = sum("unlearned" in (t or "") for _, _, t in per)
    if fell:
        ours += f" ({fell} of {len(per)} unlearned)"
    return ours, texts


_CPU_H = re.compile(r"`([^`]+)`[^`]*?\(([0-9.eE+-]+) CPU-h[);]")


def _one_seed_compute(where: str) -> str:
    """The per-seed suffix (:func:`seed_compute`) of the one run of a one-seed cell, read
    from its *run* column ``where``: its GPU-hours where it ran on a GPU (the column's CPU-h
    are then 0, not its compute), else its CPU-hours; "" where neither is recorded."""
    gpu = re.search(r"; ([0-9.eE+-]+) GPU-h for 1 run on a GPU", where)
    if gpu:
        return f" ({gpu.group(1)} GPU-h)"
    spent = _CPU_H.search(where)
    return f" ({spent.group(2)} CPU-h)" if spent else ""


_HELD = re.compile(r"`([^`]+)`.*\(seeds? ([0-9, ]+) kept from the previous table: run folder not found"
                   r"(?:; ([0-9.eE+-]+) CPU-h)?(?:, (\d+) not recorded)?(; compute not recorded)?\)")


def _held_compute(held: dict[int, KeptSeed]) -> str:
    """What a cell's *run* column says of the compute of its seeds kept from the previous
    table (``held``): their recorded CPU-hours, and how many have none recorded."""
    known = [k.cpu_hours for k in held.values() if k.cpu_hours is not None]
    if not known:
        return "; compute not recorded"
    unknown = len(held) - len(known)
    return f"; {sum(known):.3g} CPU-h" + (f", {unknown} not recorded" if unknown else "")


def compute_line(runs: list[Optional[RunData]], configs: Optional[int] = None,
                 kept: Optional[dict[str, str]] = None) -> str:
    """The compute the table's runs took: CPU-hours = the sum over runs (every seed) of
    their logged per-round training and evaluation seconds times their ``threads`` (1 where
    unset), plus the CPU-hours recorded in the *run* column of cells kept from the previous
    table (``kept``: cell id -> that column)."""
    made = {d.dir.resolve(): d for d in runs if d is not None}
    cpu_h = sum(d.cpu_hours for d in made.values())
    wall_h = sum(d.seconds for d in made.values()) / 3600
    unset = sum(1 for d in made.values() if not d.threads and d.on_cpu)
    note = f"; {unset} without `threads` counted as one core" if unset else ""
    untimed = [d for d in made.values() if d.untimed]
    if untimed:
        note += (f"; {len(untimed)} runs have {sum(d.untimed for d in untimed)} rounds without timing.jsonl lines, "
                 f"not counted (their compute is unknown: the hours are a lower bound)")
    gpu = [d for d in made.values() if not d.on_cpu]
    if gpu:
        note += (f"; {len(gpu)} runs on a GPU ({', '.join(sorted({d.device for d in gpu}))}) add "
                 f"{sum(d.gpu_hours for d in gpu):.3g} GPU-hours, not counted as CPU-hours")
    line = (f"**Compute: {cpu_h:.3g} CPU-hours** ({wall_h:.3g} h wall-clock) in the {len(made)} runs made of "
            f"{len(runs) if configs is None else configs} configs: the sum of each run's per-round training and "
            f"evaluation times (timing.jsonl) times its `threads`{note}.")
    if kept:
        recorded: dict[str, float] = {}
        missing: set[str] = set()
        for cell, where in kept.items():
            held = _HELD.search(where)
            if held:  # seeds kept beside runs on disk (those are counted above), or inside a kept cell
                key = f"{held.group(1)} seeds {held.group(2)}"
                if held.group(3):
                    recorded.setdefault(key, float(held.group(3)))
                # each seed without recorded hours (none said: a table from before per-seed compute)
                unknown = int(held.group(4)) if held.group(4) else 0 if held.group(3) else len(
                    re.findall(r"\d+", held.group(2)))
                missing.update(f"{key} #{i}" for i in range(unknown))
                if cell.endswith("#kept-seeds"):
                    continue
            hits = _CPU_H.findall(where)
            if not hits:
                folder = re.search(r"`([^`]+)`", where)
                missing.add(folder.group(1) if folder else where)
            for folder, h in hits:
                recorded.setdefault(folder, float(h))
        if recorded:
            line += (f" Cells kept from the previous table add {sum(recorded.values()):.3g} CPU-hours "
                     f"(recorded for {len(recorded)} runs)")
            missing -= set(recorded)  # one cell of a config said "not recorded", another recorded it
            line += f"; {len(missing)} of their runs have no recorded compute." if missing else "."
        elif missing:
            line += (f" The {len(missing)} runs of cells kept from the previous table have no recorded compute "
                     f"(not counted).")
    return line


#: the key prefix under which :func:`previous_cells` returns a run folder's config fingerprint
FINGERPRINT = "fingerprint/"


def config_fingerprint(config: str, overrides: list[str]) -> str:
    """A short digest of what makes ``config``'s runs comparable (its settings with every
    hyperparameter resolved, less what a resume may change, the seed and the folder: the
    comparison :func:`_stale` makes). A table records it for each run folder whose values
    it holds, so a value kept after its folder is gone is kept only while the config is
    still the one that measured it."""
    import hashlib

    from lowband.engine.runlog import _comparable

    exp = load_experiment(config, overrides)
    d = json.loads(_comparable(exp.to_toml()))
    for key in ("seed", "out_dir", "name"):
        d.pop(key, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def changed_since(previous: dict[str, tuple[str, str, str]], config: str, overrides: list[str]) -> bool:
    """Whether the table being replaced (``previous``) recorded ``config``'s run folder under
    another config fingerprint than today's (False where it recorded none: a table from
    before fingerprints)."""
    then = previous.get(f"{FINGERPRINT}{load_experiment(config, overrides).run_dir().name}")
    return then is not None and then[2] != config_fingerprint(config, overrides)


def previous_cells(path: Path) -> dict[str, tuple[str, str, str]]:
    """cell id -> (ours, rounds, run) of the rows of an earlier table at ``path`` that hold
    a value (empty when there is none), with their per-seed values (``seeds/<id>`` ->
    ("", "", the list)). Rows kept from an even earlier table keep their note."""
    out: dict[str, tuple[str, str, str]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(errors="replace").splitlines():
        fp = re.fullmatch(r"<!-- lowband config fingerprints: (\{.*\}) -->", line.strip())
        if fp:
            try:
                prints = json.loads(fp.group(1))
            except ValueError:
                prints = {}
            for folder, digest in (prints.items() if isinstance(prints, dict) else ()):
                if isinstance(folder, str) and isinstance(digest, str):
                    out[f"{FINGERPRINT}{folder}"] = ("", "", digest)
            continue
        m = re.match(r"- `([^`]+)`: (.+)$", line.strip())
        if m:
            out[f"seeds/{m.group(1)}"] = ("", "", m.group(2))
            continue
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 7 and cols[4] and cols[0] not in ("cell", "---"):
            out[cols[0]] = (cols[4], cols[5], cols[6])
    return out


def _same_run(where: str, config: str, overrides: list[str]) -> bool:
    """Whether a previous table's *run* column (```R` ...``) names ``config``'s run folder:
    a cell whose config changed must not keep a value another config measured."""
    m = re.match(r"`([^`]+)`", where)
    if m is None:
        return False
    try:
        rd = load_experiment(config, overrides).run_dir()
    except ConfigError:
        return False
    return Path(m.group(1)).name == Path(rd).name


def config_seed(config: str, overrides: list[str]) -> int:
    """The seed ``config`` runs under (its ``seed``, default 0): the seed of its run folder ``R``."""
    return int(load_experiment(config, overrides).seed)


def _rounds_text(cell: Cell, runs: list[RunData], kept: Optional[dict[int, KeptSeed]] = None) -> str:
    kept = kept or {}
    done = sorted({d.rounds_done for d in runs} | {k.rounds for k in kept.values()})
    planned = max(d.rounds_planned for d in runs)
    text = f"{done[0]}/{planned}" if len(done) == 1 else f"{done[0]}-{done[-1]}/{planned}"
    return text + (f" (at {cell.round})" if cell.round is not None else "")


def table_markdown(paper: str, cells: list[Cell], overrides: list[str], command: str,
                   previous: Optional[dict[str, tuple[str, str, str]]] = None) -> str:
    """The paper-vs-lowband table. A cell whose run folders are all gone keeps its value
    from ``previous`` (the table being replaced), marked as kept, instead of going blank: a
    cleaned ``runs/`` must not erase results that were measured. A cell with several seed
    runs shows mean ± std and lists its per-seed values under its table."""
    previous = previous or {}
    cache: dict[str, dict[int, RunData]] = {}

    def data(cfg: str) -> dict[int, RunData]:
        if cfg not in cache:
            try:
                cache[cfg] = seed_data(cfg, overrides)
            except ConfigError as e:
                print(f"  warning: {cfg}: {e}", file=sys.stderr)
                cache[cfg] = {}
        return cache[cfg]

    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    tables: dict[str, list[Cell]] = {}
    for c in cells:
        tables.setdefault(c.table, []).append(c)
    kept: dict[str, str] = {}
    prints: dict[str, str] = {}
    body: list[str] = []
    # a seed's compute as any cell of its config recorded it (every cell of a config lists
    # the same runs; a table written before per-seed compute existed may have it in one)
    seed_hours: dict[tuple[str, int], float] = {}
    for c in cells:
        for s, k in kept_seeds(previous.get(f"seeds/{c.id}", ("", "", ""))[2], "", set()).items():
            if k.cpu_hours is not None:
                seed_hours.setdefault((c.config, s), k.cpu_hours)
    for t, cs in tables.items():
        body += [f"## {t}", "", "| cell | row | metric | paper | ours | rounds | run |", "|---|---|---|---|---|---|---|"]
        notes = []
        for c in cs:
            runs = data(c.config)
            refs = data(c.reference) if c.reference else {}
            unit = c.paper_unit or ("%" if "acc" in c.metric else "")
            paper_s = "" if c.paper is None else f"{c.paper}{' ' + unit if unit and unit != 'rounds' else ''}"
            left_out = left_out_seeds(c.config, overrides, runs)
            if not runs and left_out:
                ours, rounds, where = "", "", f"left out: `{next(iter(left_out.values()))}` (see the warning)"
            elif not runs and c.id in previous and not _same_run(previous[c.id][2], c.config, overrides):
                print(f"  warning: {c.id}: the previous table's value came from another run folder than "
                      f"{c.config}'s; not kept", file=sys.stderr)
                ours, rounds, where = "", "", "not run"
            elif not runs and c.id in previous and changed_since(previous, c.config, overrides):
                print(f"  warning: {c.id}: the previous table's value was measured under another version of "
                      f"{c.config} (its settings changed since); not kept", file=sys.stderr)
                ours, rounds, where = "", "", "not run (the config changed since the value the table had)"
            elif not runs and c.id in previous:
                ours, rounds, where = previous[c.id]
                if "kept from the previous table" not in where:
                    where = f"{where} (kept from the previous table: run folder not found)"
                kept[c.id] = where
                if f"seeds/{c.id}" in previous:
                    notes.append(f"- `{c.id}`: {previous[f'seeds/{c.id}'][2]}")
            elif not runs:
                ours, rounds, where = "", "", "not run"
            else:
                held = {}
                if c.id in previous and _same_run(previous[c.id][2], c.config, overrides) \
                        and changed_since(previous, c.config, overrides):
                    gone = kept_seeds(previous.get(f"seeds/{c.id}", ("", "", ""))[2] or
                                      f"{config_seed(c.config, overrides)}: {previous[c.id][0]}",
                                      previous[c.id][1], set(runs) | set(left_out))
                    if gone:
                        print(f"  warning: {c.id}: the previous table's value of seed "
                              f"{', '.join(str(s) for s in gone)} was measured under another version of {c.config} "
                              f"(its settings changed since); not kept", file=sys.stderr)
                elif c.id in previous and _same_run(previous[c.id][2], c.config, overrides):
                    note = previous.get(f"seeds/{c.id}", ("", "", ""))[2]
                    if not note and " seeds " not in previous[c.id][2].split("`")[-1]:
                        # one seed then (no per-seed list): the config's own seed, its compute the cell's
                        note = f"{config_seed(c.config, overrides)}: {previous[c.id][0]}" \
                               f"{_one_seed_compute(previous[c.id][2])}"
                    held = {s: k if k.cpu_hours is not None else replace(k, cpu_hours=seed_hours.get((c.config, s)))
                            for s, k in kept_seeds(note, previous[c.id][1], set(runs) | set(left_out)).items()}
                ours, per_seed = seeds_value(c, runs, refs, held)
                rounds = _rounds_text(c, list(runs.values()), held)
                base = next(iter(runs.values())).dir
                base = base.parent if re.fullmatch(r"seed-\d+", base.name) else base
                every = sorted({*runs, *held})
                seeds = "" if len(every) == 1 else f" seeds {', '.join(str(s) for s in every)}"
                cpu_h = sum(d.cpu_hours for d in runs.values())
                gpu_h = sum(d.gpu_hours for d in runs.values())
                on_gpu = sum(not d.on_cpu for d in runs.values())
                untimed = sum(d.untimed for d in runs.values())
                where = f"`{base}`{seeds} ({cpu_h:.3g} CPU-h" + (
                    f"; {gpu_h:.3g} GPU-h for {on_gpu} run{'s' if on_gpu > 1 else ''} on a GPU" if on_gpu else "") + (
                    f"; {untimed} rounds untimed, not counted)" if untimed else ")")
                if held:
                    names = ", ".join(str(s) for s in held)
                    where += f" (seed {names} kept from the previous table: run folder not found{_held_compute(held)})"
                if len(every) > 1 and ours:
                    spent = {s: seed_compute(d) for s, d in runs.items()} | {
                        s: k.spent or (f" ({k.cpu_hours:.3g} CPU-h)" if k.cpu_hours is not None else "")
                        for s, k in held.items()}
                    notes.append(f"- `{c.id}`: {', '.join(t + spent[s] for s, t in zip(sorted(every), per_seed))}")
            if _HELD.search(where):
                kept[f"{c.id}#kept-seeds"] = where  # the held seeds' compute, read by compute_line
            if ours:  # the config its values are of: today's for runs on disk, the earlier table's for kept ones
                folder = load_experiment(c.config, overrides).run_dir().name
                then = previous.get(f"{FINGERPRINT}{folder}")
                if runs:
                    prints[folder] = config_fingerprint(c.config, overrides)
                elif then:  # a value kept from a table without fingerprints stays of an unknown config
                    prints[folder] = then[2]
            body.append(f"| {c.id} | {c.row} | {c.metric} | {paper_s} | {ours} | {rounds} | {where} |")
        if notes:
            body += ["", "Per seed (seed: value) of the cells with several seeds:", "", *notes]
        body.append("")
    lines = [f"# {paper}: paper vs lowband", "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M')}. One row per table cell of "
             f"experiments/{paper}/reproduce.toml; *rounds* is the number of rounds the value comes from "
             f"(of the config's planned rounds); an empty *ours* means the run has not been made. Where a "
             f"config has several seed runs, *ours* is mean ± std over them (n seeds) and each seed's value is "
             f"listed under the table; *run* gives each cell's CPU-hours (and the GPU-hours of runs made on a GPU). \"unlearned: best X at rN\" marks a "
             f"run whose accuracy is, at the cell's round, more than {100 * DECAY_DROP:g} points under what it "
             f"reached (the median of its last {DECAY_WINDOW} evaluations against the best such median: the "
             f"run-time warning's rule): *ours* is still the value at the cell's round.", "",
             compute_line([d for cfg in configs for d in data(cfg).values()], len(configs), kept), "", *body]
    if prints:  # read back by the next collect (previous_cells), invisible where the page is rendered
        lines.append(f"<!-- lowband config fingerprints: {json.dumps(dict(sorted(prints.items())))} -->")
    return "\n".join(lines)


# --------------------------------------------------------------------------- dry run


@dataclass(frozen=True)
class Estimate:
    """The hours a planned run still needs: its rounds to go times the mean per-round time
    (training + evaluation, as :attr:`RunData.seconds` counts them) of the runs it is timed
    on, times their ``threads``: CPU-hours, or GPU-hours (``gpu``) for a run on a GPU.
    ``hours`` None: nothing to time it on (``note`` says why); else ``note`` names the
    other seeds it was timed on ("" for its own rounds), and ``one_core`` says that a run
    timed had no ``threads`` set and counts as one core (as in the table's compute line)."""

    hours: Optional[float]
    gpu: bool
    note: str = ""
    one_core: bool = False


def rounds_to_go(plan: Planned) -> int:
    """The rounds ``plan`` still runs: a resume continues after its logged rounds; a
    restart (no checkpoint) and a new run run them all."""
    if plan.action in ("reuse", "skip"):
        return 0
    return max(plan.exp.rounds - plan.done, 0) if plan.action == "resume" else plan.exp.rounds


def estimate(plan: Planned, runs: dict[int, RunData], recorded: Optional[dict[int, Recorded]] = None) -> Estimate:
    """What ``plan`` still costs (:class:`Estimate`), timed on its own folder's logged
    rounds (a resume or restart), else on the other seed runs of its config (``runs``, from
    :func:`seed_data`), counting only runs made on the kind of device ``plan`` runs on: a
    GPU's rounds say nothing of a core's; else (a CPU run) on the CPU-hours the table being
    replaced records for the config's runs whose folders are gone (``recorded``)."""
    gpu = not on_cpu(plan.exp.device)
    here = plan.dir.resolve()
    own = [d for d in runs.values() if d.dir.resolve() == here]
    others = [d for d in runs.values() if d.dir.resolve() != here]
    for timed in (own, others):
        timed = [d for d in timed if d.timing and d.on_cpu != gpu]
        if not timed:
            continue
        per_round = sum(d.gpu_hours if gpu else d.cpu_hours for d in timed) / sum(len(d.timing) for d in timed)
        seeds = sorted(d.seed for d in timed)
        note = "" if timed[0].dir.resolve() == here else \
            f"timed on seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s) for s in seeds)}"
        return Estimate(rounds_to_go(plan) * per_round, gpu, note, not gpu and any(not d.threads for d in timed))
    if any(d.timing for d in runs.values()):
        return Estimate(None, gpu, f"this config has run here only on {'the CPU' if gpu else 'a GPU'}")
    timed_r = {s: r for s, r in (recorded or {}).items() if r.cpu_hours is not None and r.rounds}
    if timed_r and not gpu:
        per_round = sum(r.cpu_hours or 0.0 for r in timed_r.values()) / sum(r.rounds for r in timed_r.values())
        seeds = ", ".join(str(s) for s in timed_r)
        return Estimate(rounds_to_go(plan) * per_round, gpu,
                        f"timed on the table's record of seed{'s' if len(timed_r) > 1 else ''} {seeds}")
    return Estimate(None, gpu, "nothing of this config has run here")


def _hours(h: float) -> str:
    """Hours as an estimate is worth: two significant digits, whole hours from 100."""
    return f"{h:.2g}" if h < 100 else f"{h:.0f}"


def dry_run_line(plan: Planned, name: str, est: Optional[Estimate]) -> str:
    """One ``--dry-run`` line: ``would ACTION NAME -> FOLDER (done/planned rounds; cost)``
    (``est``: see :func:`estimate`; a skip gives its reason instead)."""
    head = f"  would {plan.action:<7} {name} -> {plan.dir}"
    if plan.action in ("skip", "keep"):
        return f"{head}: {plan.reason}"
    planned = plan.exp.rounds
    if plan.action == "reuse":
        return f"{head} ({plan.done}/{planned} rounds)"
    rounds = f"{planned} rounds" if plan.action == "run" else f"{plan.done}/{planned} rounds"
    if plan.action == "restart":
        rounds += ", none checkpointed: from round 0"
    if est is None or est.hours is None:
        cost = "no estimate" + (f": {est.note}" if est else "")
    else:
        cost = f"about {_hours(est.hours)} {'GPU' if est.gpu else 'CPU'}-h left" + (f", {est.note}" if est.note else "")
    return f"{head} ({rounds}; {cost})"


def dry_run(plan: list[tuple[str, Optional[int]]], overrides: list[str],
            recorded: Optional[dict[str, dict[int, Recorded]]] = None, remake_kept: bool = False) -> list[str]:
    """The lines ``--dry-run`` prints: for each planned (config, seed), what a real run would
    do with it (:func:`run_action`, the decision :func:`run_config` acts on; ``recorded``:
    config -> :func:`recorded_runs`, used for ``keep`` unless ``remake_kept``), its rounds
    and the hours it still needs (:func:`estimate`); then one line with the count of each
    action and the total estimate. Reads the run folders, writes nothing."""
    recorded = recorded or {}
    cache: dict[str, dict[int, RunData]] = {}
    counts: dict[str, int] = dict.fromkeys(get_args(Action), 0)
    cpu_h = gpu_h = 0.0
    unknown = one_core = 0
    lines = []
    for cfg, seed in plan:
        rec = recorded.get(cfg, {})
        p = run_action(cfg, overrides, seed, None if remake_kept else rec.get(_seed_of(cfg, overrides, seed)))
        counts[p.action] += 1
        est = None
        if p.action in ("run", "resume", "restart"):
            if cfg not in cache:
                cache[cfg] = seed_data(cfg, overrides)
            est = estimate(p, cache[cfg], rec)
            if est.hours is None:
                unknown += 1
            elif est.gpu:
                gpu_h += est.hours
            else:
                cpu_h += est.hours
                one_core += est.one_core
        lines.append(dry_run_line(p, run_name(cfg, seed), est))
    to_make = counts["run"] + counts["resume"] + counts["restart"]
    total = (f"in all: run {counts['run']}, resume {counts['resume']}, restart {counts['restart']}, "
             f"reuse {counts['reuse']}, keep {counts['keep']}, skip {counts['skip']}: about {_hours(cpu_h)} CPU-h "
             f"still needed")
    if gpu_h:
        total += f" and {_hours(gpu_h)} GPU-h on a GPU (not counted as CPU-h)"
    total += f" by the {to_make - unknown} runs with an estimate"
    if one_core:
        total += f" ({one_core} timed on runs without `threads`, counted as one core)"
    total += f"; {unknown} of the {to_make} runs to make {'has' if unknown == 1 else 'have'} none" if unknown else ""
    return [*lines, total]


# --------------------------------------------------------------------------- command


def output_path(out: Optional[str], paper: str) -> Path:
    """``--out``: a ``.md`` file, or a folder that gets ``PAPER_table.md`` (default
    ``results/``; never under ``docs/`` unless asked)."""
    if out and out.endswith(".md"):
        return Path(out)
    return Path(out or "results") / f"{paper}_table.md"


def cmd_reproduce(args: argparse.Namespace) -> int:
    experiments = Path(args.experiments) if args.experiments else None
    cells = with_seeds(select(load_cells(args.paper, experiments=experiments), args.only),
                       getattr(args, "seeds", None))
    overrides = _overrides(args)
    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    plan = run_plan(cells, overrides)
    for cfg, seed in plan:  # validate everything before anything runs
        load_experiment(cfg, seed_overrides(cfg, overrides, seed))
    where = locate(args.paper, experiments)
    extra = len(plan) - len(configs)
    print(f"lowband reproduce {args.paper}: {len(cells)} cells from {len(configs)} configs"
          + (f" ({len(plan)} runs with the seeds)" if extra else "")
          + f" ({where / args.paper / 'reproduce.toml'})")
    out = output_path(args.out, args.paper)
    previous = previous_cells(out)
    # the runs whose values the table at --out keeps from folders no longer here
    recorded = {} if args.remake_kept else kept_runs(previous, cells, configs, overrides)
    if args.dry_run:
        print("\n".join(dry_run(plan, overrides, recorded)))
        return 0
    skipped = 0
    if not args.collect:
        for cfg, seed in plan:
            rec = recorded.get(cfg, {}).get(_seed_of(cfg, overrides, seed))
            skipped += run_config(cfg, overrides, seed=seed, recorded=rec) is None
    command = "lowband reproduce " + " ".join(a for a in sys.argv[2:]) if sys.argv[1:2] == ["reproduce"] \
        else f"lowband reproduce {args.paper}"
    md = table_markdown(args.paper, cells, overrides, command, previous)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md + "\n")
    print(md)
    print(f"wrote {out}")
    if skipped:
        print(f"{skipped} run(s) skipped (see above)", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Register ``lowband reproduce`` on the CLI's subparsers."""
    p = sub.add_parser("reproduce", help="run a paper's table cells (PAPER/reproduce.toml, shipped with lowband "
                                         "or under ./experiments) and write paper-vs-ours tables")
    p.add_argument("paper", help="a paper with a reproduce.toml (spark, fedcspack, fol, kta)")
    p.add_argument("--only", help="comma-separated glob patterns or prefixes of cell ids, e.g. 'table1/a0.1/*'")
    p.add_argument("--rounds", type=int, help="override every config's rounds (shorter runs; said in the table)")
    p.add_argument("--seeds", help="run every selected cell's config once per seed (e.g. 0,1,2 or 0-2; instead "
                                   "of the cells' own `seeds`); tables show mean ± std over the seeds found")
    p.add_argument("--threads", type=int, help="torch threads per run")
    p.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    p.add_argument("--collect", action="store_true", help="run nothing; tabulate the runs that exist")
    p.add_argument("--dry-run", action="store_true", help="run nothing; say what each run would do (run, resume, "
                                                          "restart, reuse or skip), its rounds and the CPU-hours left")
    p.add_argument("--remake-kept", action="store_true",
                   help="run again the runs whose values the table at --out keeps from run folders no longer here "
                        "(by default they are kept, and only what the table lacks is run)")
    p.add_argument("--out", help="folder for PAPER_table.md, or a .md file (default results/; "
                                 "e.g. --out docs/results to update a checkout's results pages)")
    p.add_argument("--experiments", help="folder of papers to use instead of ./experiments and the shipped copy")
    p.set_defaults(fn=cmd_reproduce)


__all__ = ["Cell", "add_parser", "cmd_reproduce", "load_cells", "locate", "packaged_experiments", "run_plan",
           "kept_seeds", "seed_data", "seed_overrides", "select", "table_markdown", "value", "with_seeds"]
