"""The ``lowband reproduce PAPER`` command: its options (:func:`add_parser`), where the table
goes (:func:`output_path`) and :func:`cmd_reproduce`, which plans, runs (or dry-runs), records
each run in the store and renders the table from the store; ``--verify CELL`` re-runs a cell
and compares it with its record (:mod:`lowband.results.verify`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from lowband.config.resolve import load_experiment
from lowband.engine.runlog import atomic_write_text
from lowband.reproduce.cells import _overrides, load_cells, locate, run_plan, seed_overrides, select, with_seeds
from lowband.reproduce.dryrun import dry_run
from lowband.reproduce.plan import run_config
from lowband.results.table import Tabulator, table_markdown
from lowband.results.store import Store, default_root


def output_path(out: Optional[str], paper: str) -> Path:
    """``--out``: a ``.md`` file, or a folder that gets ``PAPER_table.md`` (default
    ``results/``; never under ``docs/`` unless asked)."""
    if out and out.endswith(".md"):
        return Path(out)
    return Path(out or "results") / f"{paper}_table.md"


def _check_device(spec: str, present: bool) -> None:
    """``--device`` is a device name and, where runs will start (``present``), one this
    machine has: checked before any run starts, so a missing GPU does not stop the
    campaign at its first cell; either is a one-line error (exit 2). A render or a dry
    run only reads, so it needs no GPU here."""
    from lowband.config.schema import ConfigError
    from lowband.device import check_spec, resolve_device

    try:
        check_spec(spec)
        if present:
            resolve_device(spec)
    except ValueError as exc:
        raise ConfigError(f"--device: {exc}") from None


def _record_runs(store: Store, made: list[tuple[str, str]]) -> int:
    """Put the record of each run folder made or reused (``(config, folder)``) in the store;
    returns how many were damaged (each said in one line on stderr, and not recorded)."""
    from lowband.engine.runlog import check_run

    damaged = 0
    for cfg, folder in made:
        if not (Path(folder) / "metrics.jsonl").is_file() and not (Path(folder) / "manifest.json").is_file():
            continue
        try:
            check_run(Path(folder))  # every file as the run wrote it (lowband.engine.runfiles)
            print(f"  record  {store.put(cfg, Path(folder))}")
        except (OSError, ValueError) as exc:  # a damaged file: its record would be another or a shorter run
            damaged += 1
            print(f"lowband: error: {exc if getattr(exc, 'path', None) else folder + ': ' + str(exc)} "
                  f"(not recorded)", file=sys.stderr)
    return damaged


def _present(config: str, overrides: list[str], seed: Optional[int]) -> list[str]:
    """``--collect``: the run folders of ``config`` on disk to record as they are: the one
    ``seed`` runs in and, for the config's own seed, every seed folder beside it (``lowband
    run --seeds`` makes them; their seeds count too). A folder of another config or one that
    cannot be read is said on stderr and left out."""
    from lowband.batch import seed_runs
    from lowband.reproduce.plan import _not_a_run_of, run_action

    from lowband.engine.runlog import DamagedFileError, check_run

    plan = run_action(config, overrides, seed)
    damaged = False
    if plan.action == "skip" and plan.dir.is_dir():
        try:
            check_run(plan.dir)
        except DamagedFileError:
            damaged = True  # said in one line, and counted, by _record_runs
    if plan.action == "skip" and not damaged:
        print(f"  warning: {plan.reason}; not recorded", file=sys.stderr)
    found = [plan.dir] if plan.action not in ("run", "skip") or damaged else []
    base = plan.dir.parent if plan.dir.name.startswith("seed-") else plan.dir
    for folder in ([] if seed is not None else seed_runs(base)):
        foreign = _not_a_run_of(plan.exp, folder) if folder not in found else None
        if foreign:
            print(f"  warning: {foreign[0]}; {foreign[1]}; not recorded", file=sys.stderr)
        elif folder not in found and (folder / "metrics.jsonl").is_file():
            found.append(folder)
    return [str(f) for f in found]


def _make(plan: list[tuple[str, Optional[int]]], overrides: list[str], store: Store, *,
          collect: bool) -> tuple[int, int]:
    """Run (or, ``collect``, find) the planned runs and record them in the store; the number
    of runs skipped and of folders found damaged (not recorded)."""
    made: list[tuple[str, str]] = []
    skipped = 0
    for cfg, seed in plan:
        if collect:
            made += [(cfg, f) for f in _present(cfg, overrides, seed)]
            continue
        folder = run_config(cfg, overrides, seed=seed)
        skipped += folder is None
        made += [(cfg, folder)] if folder else []
    return skipped, _record_runs(store, made)


def cmd_reproduce(args: argparse.Namespace) -> int:
    experiments = Path(args.experiments) if args.experiments else None
    cells = with_seeds(select(load_cells(args.paper, experiments=experiments), args.only),
                       getattr(args, "seeds", None))
    store = Store(Path(args.store) if args.store else default_root(), args.paper)
    if args.verify:
        from lowband.results.verify import cmd_verify

        return cmd_verify(args, cells, store)
    if getattr(args, "device", None):
        _check_device(args.device, present=not (args.render or args.collect or args.dry_run))
    overrides = _overrides(args)
    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    plan = run_plan(cells, overrides)
    for cfg, seed in plan:  # validate everything before anything runs
        load_experiment(cfg, seed_overrides(cfg, overrides, seed))
    where = locate(args.paper, experiments)
    extra = len(plan) - len(configs)
    print(f"lowband reproduce {args.paper}: {len(cells)} cells from {len(configs)} configs"
          + (f" ({len(plan)} runs with the seeds)" if extra else "")
          + f" ({where / args.paper / 'reproduce.toml'}); records in {store.dir}")
    if args.dry_run:
        print("\n".join(dry_run(plan, overrides, Tabulator(store, overrides).runs)))
        return 0
    skipped, damaged = (0, 0) if args.render else _make(plan, overrides, store, collect=args.collect)
    md = table_markdown(args.paper, cells, store, overrides)
    out = output_path(args.out, args.paper)
    out.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: two reproduce side by side (one per core) each write it at their end
    atomic_write_text(out, md + "\n")
    print(md)
    print(f"wrote {out}")
    if skipped:
        print(f"{skipped} run(s) skipped (see above)", file=sys.stderr)
    return 2 if damaged else 0


def add_parser(sub: Any) -> None:
    """Register ``lowband reproduce`` on the CLI's subparsers."""
    p = sub.add_parser("reproduce", help="run a paper's table cells (PAPER/reproduce.toml, shipped with lowband "
                                         "or under ./experiments), record them and render paper-vs-ours tables "
                                         "from the records")
    p.add_argument("paper", help="a paper with a reproduce.toml (spark, fedcspack, fol, kta)")
    p.add_argument("--only", help="comma-separated glob patterns or prefixes of cell ids, e.g. 'table1/a0.1/*'")
    p.add_argument("--rounds", type=int, help="override every config's rounds (shorter runs; said in the table)")
    p.add_argument("--seeds", help="run every selected cell's config once per seed (e.g. 0,1,2 or 0-2; instead "
                                   "of the cells' own `seeds`); tables show mean ± std over the seeds recorded")
    p.add_argument("--threads", type=int, help="torch threads per run")
    p.add_argument("--device", help="where every run computes: cpu, cuda, cuda:N, mps or auto (the config key "
                                    "`device`); a run on a GPU counts GPU-hours, not CPU-hours, in the table, and "
                                    "its accuracies may differ from a CPU run's in the last digits")
    p.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    p.add_argument("--render", action="store_true", help="run nothing; render the table from the store's records")
    p.add_argument("--collect", action="store_true", help="run nothing; record the run folders present (finished or "
                                                          "not) in the store, then render")
    p.add_argument("--dry-run", action="store_true", help="run nothing; say what each run would do (run, resume, "
                                                          "restart, reuse or skip), its rounds and the CPU-hours left")
    p.add_argument("--verify", metavar="CELL", help="re-run CELL's config (its first --rounds rounds, else all) in a "
                                                    "scratch folder and compare every metric of every round with "
                                                    "the store's record: equal, within float tolerance, different")
    p.add_argument("--store", help="the records folder (default docs/results/records in a checkout, else "
                                   "results/records); records go to STORE/PAPER/")
    p.add_argument("--out", help="folder for PAPER_table.md, or a .md file (default results/; "
                                 "e.g. --out docs/results to update a checkout's results pages)")
    p.add_argument("--experiments", help="folder of papers to use instead of ./experiments and the shipped copy")
    p.set_defaults(fn=cmd_reproduce)
