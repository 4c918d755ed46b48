"""``lowband reproduce --dry-run``: what each planned run would do with its folder and the
hours it still needs (:class:`Estimate`, :func:`estimate`), one line each and the totals
(:func:`dry_run`); it runs and writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, get_args

from lowband.reproduce.plan import Action, Planned, run_action, run_name
from lowband.results.rundata import RunData, on_cpu


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


def estimate(plan: Planned, runs: dict[int, RunData]) -> Estimate:
    """What ``plan`` still costs (:class:`Estimate`), timed on the store's records of its
    config (``runs``: seed -> run, see :func:`lowband.results.table.store_runs`), counting
    only runs made on the kind of device ``plan`` runs on: a GPU's rounds say nothing of a
    core's."""
    gpu = not on_cpu(plan.exp.device)
    timed = [d for d in runs.values() if d.timing and d.on_cpu != gpu]
    if not timed:
        other = any(d.timing for d in runs.values())
        return Estimate(None, gpu, f"this config is recorded only on {'the CPU' if gpu else 'a GPU'}" if other
                        else "no record of this config in the store")
    per_round = sum(d.gpu_hours if gpu else d.cpu_hours for d in timed) / sum(len(d.timing) for d in timed)
    seeds = sorted(d.seed for d in timed)
    many = "s" if len(seeds) > 1 else ""
    note = f"timed on the record{many} of seed{many} {', '.join(str(s) for s in seeds)}"
    return Estimate(rounds_to_go(plan) * per_round, gpu, note, not gpu and any(not d.threads for d in timed))


def _hours(h: float) -> str:
    """Hours as an estimate is worth: two significant digits, whole hours from 100."""
    return f"{h:.2g}" if h < 100 else f"{h:.0f}"


def dry_run_line(plan: Planned, name: str, est: Optional[Estimate]) -> str:
    """One ``--dry-run`` line: ``would ACTION NAME -> FOLDER (done/planned rounds; cost)``
    (``est``: see :func:`estimate`; a skip gives its reason instead)."""
    head = f"  would {plan.action:<7} {name} -> {plan.dir}"
    if plan.action == "skip":
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
            runs_of: Callable[[str], dict[int, RunData]]) -> list[str]:
    """The lines ``--dry-run`` prints: for each planned (config, seed), what a real run would
    do with it (:func:`run_action`, the decision :func:`run_config` acts on), its rounds and
    the hours it still needs (:func:`estimate` on ``runs_of(config)``, the store's records);
    then one line with the count of each action and the total estimate. Writes nothing."""
    counts: dict[str, int] = dict.fromkeys(get_args(Action), 0)
    cpu_h = gpu_h = 0.0
    unknown = one_core = 0
    lines = []
    for cfg, seed in plan:
        p = run_action(cfg, overrides, seed)
        counts[p.action] += 1
        est = None
        if p.action in ("run", "resume", "restart"):
            est = estimate(p, runs_of(cfg))
            unknown += est.hours is None
            gpu_h += est.hours or 0.0 if est.gpu else 0.0
            cpu_h += 0.0 if est.gpu else est.hours or 0.0
            one_core += est.one_core
        lines.append(dry_run_line(p, run_name(cfg, seed), est))
    to_make = counts["run"] + counts["resume"] + counts["restart"]
    total = (f"in all: run {counts['run']}, resume {counts['resume']}, restart {counts['restart']}, "
             f"reuse {counts['reuse']}, skip {counts['skip']}: about {_hours(cpu_h)} CPU-h still needed")
    if gpu_h:
        total += f" and {_hours(gpu_h)} GPU-h on a GPU (not counted as CPU-h)"
    total += f" by the {to_make - unknown} runs with an estimate"
    if one_core:
        total += f" ({one_core} timed on runs without `threads`, counted as one core)"
    total += f"; {unknown} of the {to_make} runs to make {'has' if unknown == 1 else 'have'} none" if unknown else ""
    return [*lines, total]
