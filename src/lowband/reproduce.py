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

Metrics: any key of ``metrics.jsonl`` (accuracies shown in %, cumulative ``bytes/...`` in GB
unless ``paper_unit`` says MB); ``rounds_to_target`` (first evaluated round whose main
metric reaches the config's ``eval.target``); ``bytes_per_round`` (encoded + declared bytes
per round, MB); ``comm_reduction`` (``100 (1 - bytes_per_round / reference's)``, %);
``time/elapsed_s`` and ``time/round_s`` (mean) from ``timing.jsonl``.

Every config runs once however many cells use it, in its own run folder
(``runs/<name>``): a finished run is reused, an interrupted one is resumed from its
checkpoint, and ``--rounds N`` shortens (or extends) runs; the table says how many rounds
each number comes from. ``--collect`` only tabulates what exists. The table goes to
``docs/results/PAPER_table.md``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lowband.config import ConfigError, load_experiment, load_toml

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


def load_cells(paper: str, root: Path = Path(".")) -> list[Cell]:
    """The cells of ``experiments/PAPER/reproduce.toml`` (one-line ConfigError on problems)."""
    path = root / "experiments" / paper / "reproduce.toml"
    if not path.is_file():
        known = sorted(p.parent.name for p in (root / "experiments").glob("*/reproduce.toml"))
        raise ConfigError(f"no {path}; papers with a reproduce.toml: {', '.join(known) or 'none'}")
    raw = load_toml(path)
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
        cells.append(Cell(**r))
    if not cells:
        raise ConfigError(f"{path}: no [[run]] entries")
    return cells


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


def run_config(config: str, overrides: list[str], *, quiet: bool = True) -> str:
    """Run (or resume, or reuse) one config; returns its run folder."""
    from lowband.engine.simulator import Simulation

    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    summary = _read_json(rd / "summary.json")
    done = (summary or {}).get("rounds_completed")
    if done is not None and done >= exp.rounds:
        print(f"  reuse   {config} -> {rd} ({done} rounds)")
        return str(rd)
    resume = (rd / "checkpoint.pt").exists()
    if not resume and (rd / "metrics.jsonl").exists():
        print(f"  skip    {config}: {rd} holds results without a checkpoint (delete it to rerun)")
        return str(rd)
    print(f"  {'resume' if resume else 'run   '}  {config} -> {rd} ({exp.rounds} rounds)", flush=True)
    t0 = time.perf_counter()
    Simulation(exp, resume=resume).run()
    print(f"  done    {config} in {time.perf_counter() - t0:.0f} s", flush=True)
    return str(rd)


# --------------------------------------------------------------------------- collecting


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _jsonl(path: Path) -> list[dict]:
    from lowband.engine.runlog import RunLog

    return RunLog.read_jsonl(path)


@dataclass
class RunData:
    dir: Path
    metrics: list[dict]
    timing: list[dict]
    rounds_planned: int
    target: Optional[float]
    main: str

    @property
    def rounds_done(self) -> int:
        return int(self.metrics[-1]["round"]) if self.metrics else 0


def run_data(config: str, overrides: list[str]) -> Optional[RunData]:
    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    metrics = _jsonl(rd / "metrics.jsonl")
    if not metrics:
        return None
    saved = rd / "config.toml"
    planned = exp.rounds
    if saved.exists():
        import tomllib

        planned = int(tomllib.loads(saved.read_text()).get("rounds", planned))
    main = exp.eval.main or "consensus/acc"
    return RunData(rd, metrics, _jsonl(rd / "timing.jsonl"), max(planned, exp.rounds), exp.eval.target, main)


def bytes_per_round(d: RunData) -> Optional[float]:
    last = d.metrics[-1]
    if not d.rounds_done:
        return None
    return ((last.get("bytes/total") or 0) + (last.get("declared/total") or 0)) / d.rounds_done


def value(cell: Cell, d: RunData, ref: Optional[RunData]) -> tuple[Optional[float], str]:
    """(number, formatted) of ``cell`` from run ``d``."""
    m = cell.metric
    if m == "rounds_to_target":
        if d.target is None:
            return None, "no target"
        for rec in d.metrics:
            v = rec.get(d.main)
            if v is not None and v >= d.target:
                return float(rec["round"]), str(rec["round"])
        return None, f"> {d.rounds_done}"
    if m == "bytes_per_round":
        b = bytes_per_round(d)
        return (None, "n/a") if b is None else (b / 1e6, f"{b / 1e6:,.2f}")
    if m == "comm_reduction":
        b = bytes_per_round(d)
        rb = bytes_per_round(ref) if ref is not None else None
        if b is None or not rb:
            return None, "n/a (reference not run)"
        v = 100 * (1 - b / rb)
        return v, f"{v:.2f}"
    if m.startswith("time/"):
        key = m.split("/", 1)[1]
        if key == "elapsed_s":
            vals = [t.get("elapsed_s") for t in d.timing if t.get("elapsed_s") is not None]
            v = vals[-1] if vals else None
        else:
            vals = [t.get(key) for t in d.timing if t.get(key) is not None]
            v = sum(vals) / len(vals) if vals else None
        return (None, "n/a") if v is None else (float(v), f"{v:.1f}")
    recs = d.metrics if cell.round is None else [r for r in d.metrics if r["round"] <= cell.round]
    if not recs or recs[-1].get(m) is None:
        return None, "n/a"
    v = float(recs[-1][m])
    if "acc" in m:
        return 100 * v, f"{100 * v:.2f}"
    if m.startswith(("bytes/", "declared/")):
        if cell.paper_unit == "MB":
            return v / 1e6, f"{v / 1e6:,.1f}"
        return v / 1e9, f"{v / 1e9:,.3f}"
    return v, f"{v:.4g}"


def table_markdown(paper: str, cells: list[Cell], overrides: list[str], command: str) -> str:
    cache: dict[str, Optional[RunData]] = {}

    def data(cfg: str) -> Optional[RunData]:
        if cfg not in cache:
            try:
                cache[cfg] = run_data(cfg, overrides)
            except ConfigError as e:
                print(f"  warning: {cfg}: {e}", file=sys.stderr)
                cache[cfg] = None
        return cache[cfg]

    lines = [f"# {paper}: paper vs lowband", "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M')}. One row per table cell of "
             f"experiments/{paper}/reproduce.toml; *rounds* is the number of rounds the value comes from "
             f"(of the config's planned rounds); an empty *ours* means the run has not been made.", ""]
    tables: dict[str, list[Cell]] = {}
    for c in cells:
        tables.setdefault(c.table, []).append(c)
    for t, cs in tables.items():
        lines += [f"## {t}", "", "| cell | row | metric | paper | ours | rounds | run |", "|---|---|---|---|---|---|---|"]
        for c in cs:
            d = data(c.config)
            ref = data(c.reference) if c.reference else None
            unit = c.paper_unit or ("%" if "acc" in c.metric else "")
            paper_s = "" if c.paper is None else f"{c.paper}{' ' + unit if unit and unit != 'rounds' else ''}"
            if d is None:
                ours, rounds, where = "", "", "not run"
            else:
                _, ours = value(c, d, ref)
                rounds = f"{d.rounds_done}/{d.rounds_planned}"
                if c.round is not None:
                    rounds += f" (at {c.round})"
                where = f"`{d.dir}`"
            lines.append(f"| {c.id} | {c.row} | {c.metric} | {paper_s} | {ours} | {rounds} | {where} |")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command


def cmd_reproduce(args: argparse.Namespace) -> int:
    cells = select(load_cells(args.paper), args.only)
    overrides = _overrides(args)
    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    for cfg in configs:  # validate everything before anything runs
        load_experiment(cfg, overrides)
    print(f"lowband reproduce {args.paper}: {len(cells)} cells from {len(configs)} configs")
    if args.dry_run:
        for cfg in configs:
            print(f"  would run {cfg}")
        return 0
    if not args.collect:
        for cfg in configs:
            run_config(cfg, overrides)
    command = "lowband reproduce " + " ".join(a for a in sys.argv[2:]) if sys.argv[1:2] == ["reproduce"] \
        else f"lowband reproduce {args.paper}"
    md = table_markdown(args.paper, cells, overrides, command)
    out = Path(args.out) if args.out else Path("docs") / "results" / f"{args.paper}_table.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md + "\n")
    print(md)
    print(f"wrote {out}")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``lowband reproduce`` on the CLI's subparsers."""
    p = sub.add_parser("reproduce", help="run a paper's table cells (experiments/PAPER/reproduce.toml) and "
                                         "write paper-vs-ours tables")
    p.add_argument("paper", help="folder under experiments/ with a reproduce.toml (e.g. spark)")
    p.add_argument("--only", help="comma-separated glob patterns or prefixes of cell ids, e.g. 'table1/a0.1/*'")
    p.add_argument("--rounds", type=int, help="override every config's rounds (shorter runs; said in the table)")
    p.add_argument("--threads", type=int, help="torch threads per run")
    p.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    p.add_argument("--collect", action="store_true", help="run nothing; tabulate the runs that exist")
    p.add_argument("--dry-run", action="store_true", help="list the configs that would run")
    p.add_argument("--out", help="output Markdown (default docs/results/PAPER_table.md)")
    p.set_defaults(fn=cmd_reproduce)


__all__ = ["Cell", "add_parser", "cmd_reproduce", "load_cells", "select", "table_markdown", "value"]
