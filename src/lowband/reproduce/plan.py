"""What ``lowband reproduce`` does with each run folder (:func:`run_action`: run, resume,
restart, reuse, keep or skip; :class:`Planned`), the runs whose values the table being
replaced keeps (:class:`Recorded`, :func:`recorded_runs`, :func:`kept_runs`), and running one
config (:func:`run_config`)."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Optional

from lowband.config.schema import Experiment
from lowband.config.resolve import load_experiment
from lowband.reproduce.cells import Cell, config_seed, run_plan, seed_overrides
from lowband.reproduce.rundata import _not_a_run_of, _read_json, left_out_seeds
from lowband.reproduce.table import (_CPU_H, _HELD, KeptSeed, _same_run, changed_since, seed_note,
                                     kept_seeds)


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
        _, rounds, where = previous[c.id]
        ks = kept_seeds(seed_note(previous, c.id, config, overrides), rounds, set())
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
                                                              f"({foreign[0]}); {foreign[1]}")
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


def short(path: str) -> str:
    """``path`` relative to the current folder when inside it, else its last two parts."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(*p.parts[-2:]))


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
