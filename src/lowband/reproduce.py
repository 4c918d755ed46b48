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

Where the papers are: ``--experiments DIR`` if given, else ``./experiments`` when it holds
``PAPER/reproduce.toml`` (a source checkout, or your own papers), else the copy shipped in
the package (``lowband/experiments``, package data), so an installed lowband reproduces in
any folder. A ``config`` path ``experiments/X/Y.toml`` is read from that folder.

Every config runs once however many cells use it, in its own run folder (the config's
``out_dir``, else ``runs/<name>``, relative to the current folder): a finished run is
reused, an interrupted one is resumed from its checkpoint (or restarted from round 0 when
it was killed before its first checkpoint), and ``--rounds N`` shortens (or extends) runs;
the table says how many rounds each number comes from. ``--collect`` only tabulates what
exists. The table goes to ``--out`` (a folder, or a ``.md`` file; default
``results/PAPER_table.md``; nothing is written under ``docs/`` unless ``--out`` says so)
and its header states the compute its runs took.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from dataclasses import dataclass
from importlib import resources
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


def short(path: str) -> str:
    """``path`` relative to the current folder when inside it, else its last two parts."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(*p.parts[-2:]))


def run_config(config: str, overrides: list[str], *, quiet: bool = True) -> Optional[str]:
    """Run, resume or reuse one config; returns its run folder (None when it was skipped).

    A finished run (``summary.json`` with enough rounds) is reused; one with a checkpoint
    resumes from it (``--rounds`` may extend it); one killed before its first checkpoint
    restarts from round 0 in the same folder (the rounds it had logged are deterministic
    and come out identical). A folder saved with another config is left alone (skipped,
    with the reason on stderr)."""
    from lowband.engine.runlog import RunDirError
    from lowband.engine.simulator import Simulation

    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    summary = _read_json(rd / "summary.json")
    done = (summary or {}).get("rounds_completed")
    name = short(config)
    if done is not None and done >= exp.rounds:
        print(f"  reuse   {name} -> {rd} ({done} rounds)")
        return str(rd)
    started = (rd / "config.toml").exists()
    if (rd / "checkpoint.pt").exists():
        what = "resume "
    elif started:
        what = "restart"  # killed before its first checkpoint (or run without checkpoints)
    else:
        what = "run    "
    print(f"  {what} {name} -> {rd} ({exp.rounds} rounds)", flush=True)
    t0 = time.perf_counter()
    try:
        Simulation(exp, resume=started).run()
    except RunDirError as exc:
        print(f"  skip    {name}: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"  done    {name} in {time.perf_counter() - t0:.0f} s", flush=True)
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
    threads: Optional[int] = None

    @property
    def rounds_done(self) -> int:
        return int(self.metrics[-1]["round"]) if self.metrics else 0

    @property
    def seconds(self) -> float:
        """Wall-clock seconds of the rounds that are in the log: the sum of each round's
        training and evaluation time (``timing.jsonl``; a resumed run's lines add up across
        its sessions, where ``elapsed_s`` restarts with each)."""
        return float(sum((t.get("round_s") or 0.0) + (t.get("eval_s") or 0.0) for t in self.timing))


def run_data(config: str, overrides: list[str]) -> Optional[RunData]:
    exp = load_experiment(config, overrides)
    rd = exp.run_dir()
    metrics = _jsonl(rd / "metrics.jsonl")
    if not metrics:
        return None
    saved = rd / "config.toml"
    planned, threads = exp.rounds, exp.threads
    if saved.exists():
        import tomllib

        cfg = tomllib.loads(saved.read_text())
        planned = int(cfg.get("rounds", planned))
        threads = cfg.get("threads", threads)
    main = exp.eval.main or "consensus/acc"
    return RunData(rd, metrics, _jsonl(rd / "timing.jsonl"), max(planned, exp.rounds), exp.eval.target, main,
                   int(threads) if threads else None)


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
            v = d.seconds if d.timing else None
        else:
            vals = [t.get(key) for t in d.timing if t.get(key) is not None]
            v = sum(vals) / len(vals) if vals else None
        return (None, "n/a") if v is None else (float(v), f"{v:.1f}")
    if cell.round is not None and d.rounds_done < cell.round:
        return None, ""  # the run has not reached the cell's round yet
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


def compute_line(runs: list[Optional[RunData]]) -> str:
    """The compute the table's runs took: CPU-hours = the sum over runs of their logged
    per-round training and evaluation seconds times their ``threads`` (1 where unset)."""
    made = {d.dir.resolve(): d for d in runs if d is not None}
    cpu_h = sum(d.seconds * (d.threads or 1) for d in made.values()) / 3600
    wall_h = sum(d.seconds for d in made.values()) / 3600
    unset = sum(1 for d in made.values() if not d.threads)
    note = f"; {unset} without `threads` counted as one core" if unset else ""
    return (f"**Compute: {cpu_h:.3g} CPU-hours** ({wall_h:.3g} h wall-clock) in the {len(made)} runs made of "
            f"{len(runs)} configs: the sum of each run's per-round training and evaluation times "
            f"(timing.jsonl) times its `threads`{note}.")


def previous_cells(path: Path) -> dict[str, tuple[str, str, str]]:
    """cell id -> (ours, rounds, run) of the rows of an earlier table at ``path`` that hold
    a value (empty when there is none). Rows kept from an even earlier table keep their
    note."""
    out: dict[str, tuple[str, str, str]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(errors="replace").splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 7 and cols[4] and cols[0] not in ("cell", "---"):
            out[cols[0]] = (cols[4], cols[5], cols[6])
    return out


def table_markdown(paper: str, cells: list[Cell], overrides: list[str], command: str,
                   previous: Optional[dict[str, tuple[str, str, str]]] = None) -> str:
    """The paper-vs-lowband table. A cell whose run folder is gone keeps its value from
    ``previous`` (the table being replaced), marked as kept, instead of going blank: a
    cleaned ``runs/`` must not erase results that were measured."""
    previous = previous or {}
    cache: dict[str, Optional[RunData]] = {}

    def data(cfg: str) -> Optional[RunData]:
        if cfg not in cache:
            try:
                cache[cfg] = run_data(cfg, overrides)
            except ConfigError as e:
                print(f"  warning: {cfg}: {e}", file=sys.stderr)
                cache[cfg] = None
        return cache[cfg]

    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    lines = [f"# {paper}: paper vs lowband", "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M')}. One row per table cell of "
             f"experiments/{paper}/reproduce.toml; *rounds* is the number of rounds the value comes from "
             f"(of the config's planned rounds); an empty *ours* means the run has not been made.", "",
             compute_line([data(cfg) for cfg in configs]), ""]
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
            if d is None and c.id in previous:
                ours, rounds, where = previous[c.id]
                if "kept from the previous table" not in where:
                    where = f"{where} (kept from the previous table: run folder not found)"
            elif d is None:
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


def output_path(out: Optional[str], paper: str) -> Path:
    """``--out``: a ``.md`` file, or a folder that gets ``PAPER_table.md`` (default
    ``results/``; never under ``docs/`` unless asked)."""
    if out and out.endswith(".md"):
        return Path(out)
    return Path(out or "results") / f"{paper}_table.md"


def cmd_reproduce(args: argparse.Namespace) -> int:
    experiments = Path(args.experiments) if args.experiments else None
    cells = select(load_cells(args.paper, experiments=experiments), args.only)
    overrides = _overrides(args)
    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    for cfg in configs:  # validate everything before anything runs
        load_experiment(cfg, overrides)
    where = locate(args.paper, experiments)
    print(f"lowband reproduce {args.paper}: {len(cells)} cells from {len(configs)} configs "
          f"({where / args.paper / 'reproduce.toml'})")
    if args.dry_run:
        for cfg in configs:
            print(f"  would run {short(cfg)}")
        return 0
    skipped = 0
    if not args.collect:
        for cfg in configs:
            skipped += run_config(cfg, overrides) is None
    command = "lowband reproduce " + " ".join(a for a in sys.argv[2:]) if sys.argv[1:2] == ["reproduce"] \
        else f"lowband reproduce {args.paper}"
    out = output_path(args.out, args.paper)
    md = table_markdown(args.paper, cells, overrides, command, previous_cells(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md + "\n")
    print(md)
    print(f"wrote {out}")
    if skipped:
        print(f"{skipped} config(s) skipped (see above)", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Register ``lowband reproduce`` on the CLI's subparsers."""
    p = sub.add_parser("reproduce", help="run a paper's table cells (PAPER/reproduce.toml, shipped with lowband "
                                         "or under ./experiments) and write paper-vs-ours tables")
    p.add_argument("paper", help="a paper with a reproduce.toml (spark, fedcspack, fol, kta)")
    p.add_argument("--only", help="comma-separated glob patterns or prefixes of cell ids, e.g. 'table1/a0.1/*'")
    p.add_argument("--rounds", type=int, help="override every config's rounds (shorter runs; said in the table)")
    p.add_argument("--threads", type=int, help="torch threads per run")
    p.add_argument("--data-dir", help="dataset folder (else $LOWBAND_DATA, else the user cache)")
    p.add_argument("--collect", action="store_true", help="run nothing; tabulate the runs that exist")
    p.add_argument("--dry-run", action="store_true", help="list the configs that would run")
    p.add_argument("--out", help="folder for PAPER_table.md, or a .md file (default results/; "
                                 "e.g. --out docs/results to update a checkout's results pages)")
    p.add_argument("--experiments", help="folder of papers to use instead of ./experiments and the shipped copy")
    p.set_defaults(fn=cmd_reproduce)


__all__ = ["Cell", "add_parser", "cmd_reproduce", "load_cells", "locate", "packaged_experiments", "select",
           "table_markdown", "value"]
