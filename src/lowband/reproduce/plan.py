"""What ``lowband reproduce`` does with each run folder (:func:`run_action`: run, resume,
restart, reuse or skip; :class:`Planned`) and running one config (:func:`run_config`)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from lowband.config.schema import Experiment
from lowband.config.resolve import load_experiment
from lowband.engine.runlog import config_change_text, config_diff
from lowband.reproduce.cells import config_seed, seed_overrides


#: what ``lowband reproduce`` does with one run folder (:func:`run_action`)
Action = Literal["reuse", "resume", "restart", "run", "skip"]


def _read_json(path: Path) -> Optional[dict]:
    """The JSON object in ``path`` (None: no file, unreadable, or not an object)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


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
    reproduce's ``--threads``, not a rerun); None when it is ``exp``'s. The test :func:`run_action`
    applies before it reuses a folder."""
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


def run_action(config: str, overrides: list[str], seed: Optional[int] = None) -> Planned:
    """Decide what :func:`run_config` does with ``config`` (with ``seed``: in that seed's
    folder, see :func:`seed_overrides`), reading the run folder and writing nothing, so a
    dry run and a real run cannot disagree: ``reuse`` a finished run (summary.json with
    enough rounds), ``resume`` one with a checkpoint, ``restart`` one with a config.toml
    and no checkpoint (killed before its first one: it runs again from round 0), ``run`` a
    new one, and ``skip`` a folder lowband would refuse (a run of another config, files it did not
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
    if not started:
        return Planned("run", exp, rd)
    # (restart: killed before its first checkpoint, or run without checkpoints)
    return Planned("resume" if log.ckpt_path.exists() else "restart", exp, rd, log.completed_rounds())


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


def run_config(config: str, overrides: list[str], *, quiet: bool = True, seed: Optional[int] = None) -> Optional[str]:
    """Run, resume or reuse one config (with ``seed``: in that seed's folder, see
    :func:`seed_overrides`), as :func:`run_action` decides; returns its run folder (None
    when it was skipped).

    A finished run (``summary.json`` with enough rounds) is reused; one with a checkpoint
    resumes from it (``--rounds`` may extend it); one killed before its first checkpoint
    restarts from round 0 in the same folder (the rounds it had logged are deterministic
    and come out identical). A folder saved with another config is left alone (skipped,
    with the reason on stderr), before any data is loaded."""
    from lowband.engine.runlog import RunDirError
    from lowband.engine.simulator import Simulation

    plan = run_action(config, overrides, seed)
    name = run_name(config, seed)
    if plan.action == "reuse":
        print(f"  reuse   {name} -> {plan.dir} ({plan.done} rounds)")
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
