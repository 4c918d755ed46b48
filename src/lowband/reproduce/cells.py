"""A paper's table cells: reading ``PAPER/reproduce.toml`` (:func:`load_cells`; where papers
are found: :func:`locate`), choosing them (``--only``, ``--seeds``) and planning the (config,
seed) runs they need, each in its run folder (:func:`run_plan`, :func:`seed_overrides`).

Each ``[[run]]`` is one cell: ``id`` (unique; ``--only`` matches it), ``table`` (its section),
``row`` (a label), ``config`` (``experiments/X/Y.toml``: read from the experiments folder in
use), ``metric``, ``round`` (the value at this round, not the last), ``paper`` (the paper's
number or text) and ``paper_unit`` (one of :data:`~lowband.results.rundata.UNITS`),
``reference`` (``comm_reduction``'s baseline config), ``seeds`` (also at the top: every cell).
Metrics: a key of metrics.jsonl (accuracies in %, cumulative ``bytes/...`` in GB, or MB with
``paper_unit = "MB"``), ``rounds_to_target`` (first evaluated round whose main metric reaches
``eval.target``), ``bytes_per_round`` (MB), ``comm_reduction`` (``100 (1 - bytes_per_round /
reference's)``, %), ``time/elapsed_s`` and ``time/round_s`` (mean)."""

from __future__ import annotations

import argparse
import fnmatch
import re
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from lowband.config.schema import ConfigError
from lowband.config.resolve import load_experiment
from lowband.config.loading import load_toml
from lowband.results.rundata import UNITS, Cell

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
    if getattr(args, "device", None):
        out.append(f"device={_quote(args.device)}")
    if args.data_dir:
        out.append('data.data_dir="' + str(args.data_dir).replace("\\", "\\\\").replace('"', '\\"') + '"')
    return out


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _batch_layout(rd: Path) -> bool:
    """``rd`` holds seed folders and no run of its own (made by ``lowband run CONFIG --seeds
    ...``, or seeds run before the config's own): the config's own seed goes to
    ``rd/seed-<s>/`` too (lowband never writes a run into a folder holding other files). A
    seed folder counts before its run has written its config (a run in its first seconds
    holds only its lock there): :meth:`~lowband.engine.runlog.RunLog.check` refuses ``rd``
    then too."""
    from lowband.batch import SEED_PREFIX

    return (rd.is_dir() and not (rd / "config.toml").exists()
            and any(p.is_dir() and re.fullmatch(re.escape(SEED_PREFIX) + r"\d+", p.name) for p in rd.iterdir()))


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


def config_seed(config: str, overrides: list[str]) -> int:
    """The seed ``config`` runs under (its ``seed``, default 0): the seed of its run folder ``R``."""
    return int(load_experiment(config, overrides).seed)
