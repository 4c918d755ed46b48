"""The ``lowband reproduce PAPER`` command: its options (:func:`add_parser`), where the table
goes (:func:`output_path`) and :func:`cmd_reproduce`, which plans, runs (or dry-runs) and
writes the table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from lowband.config.resolve import load_experiment
from lowband.engine.runlog import atomic_write_text
from lowband.reproduce.cells import _overrides, load_cells, locate, run_plan, seed_overrides, select, with_seeds
from lowband.reproduce.dryrun import dry_run
from lowband.reproduce.plan import _seed_of, kept_runs, run_config
from lowband.reproduce.table import previous_cells, table_markdown


def output_path(out: Optional[str], paper: str) -> Path:
    """``--out``: a ``.md`` file, or a folder that gets ``PAPER_table.md`` (default
    ``results/``; never under ``docs/`` unless asked)."""
    if out and out.endswith(".md"):
        return Path(out)
    return Path(out or "results") / f"{paper}_table.md"


def _check_device(spec: str, present: bool) -> None:
    """``--device`` is a device name and, where runs will start (``present``), one this
    machine has: checked before any run starts, so a missing GPU does not stop the
    campaign at its first cell; either is a one-line error (exit 2). A collect or a dry
    run only reads, so it needs no GPU here."""
    from lowband.config.schema import ConfigError
    from lowband.device import check_spec, resolve_device

    try:
        check_spec(spec)
        if present:
            resolve_device(spec)
    except ValueError as exc:
        raise ConfigError(f"--device: {exc}") from None


def cmd_reproduce(args: argparse.Namespace) -> int:
    experiments = Path(args.experiments) if args.experiments else None
    cells = with_seeds(select(load_cells(args.paper, experiments=experiments), args.only),
                       getattr(args, "seeds", None))
    if getattr(args, "device", None):
        _check_device(args.device, present=not (args.collect or args.dry_run))
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
    # whole or not at all: two reproduce side by side (one per core) each write it at their end
    atomic_write_text(out, md + "\n")
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
    p.add_argument("--device", help="where every run computes: cpu, cuda, cuda:N, mps or auto (the config key "
                                    "`device`); a run on a GPU counts GPU-hours, not CPU-hours, in the table, and "
                                    "its accuracies may differ from a CPU run's in the last digits")
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
