"""``lowband reproduce PAPER --verify CELL``: re-run a cell's config and compare it with the
store's record, metric by metric and round by round.

The run goes to a scratch folder (nothing in the store or the run folders changes), for the
record's rounds or the first ``--rounds N``. Each metric of each round compares as *equal*
(the same float), *within tolerance* (relative difference under :data:`REL_TOL`: the last
bits of a float sum) or *different*; the report names the commits of both sides, so a
difference made by other code says which code. A cell with no measured record, only a value
imported from an earlier page, is compared at the cell's value as the page printed it."""

from __future__ import annotations

import argparse
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lowband.config.schema import ConfigError
from lowband.config.resolve import load_experiment
from lowband.results.rundata import Cell, run_of_record, value
from lowband.results.record import Record, build_record, code_commit, loads, dumps
from lowband.results.store import Store

#: relative difference under which two floats count as "within tolerance"
REL_TOL = 1e-6


@dataclass(frozen=True)
class Comparison:
    """Per metric key: the rounds equal, within tolerance, different (with the first
    difference: round, recorded, now)."""

    key: str
    equal: int
    close: int
    different: int
    first: Optional[tuple[int, Any, Any]] = None
    #: the largest relative difference among the rounds within tolerance
    worst: float = 0.0

    @property
    def verdict(self) -> str:
        return "different" if self.different else "within tolerance" if self.close else "equal"


def _kind(a: Any, b: Any) -> str:
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return "equal"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=REL_TOL):
        return "close"
    return "different"


def compare(old: Record, new: Record, rounds: int) -> list[Comparison]:
    """Every metric of every evaluated round up to ``rounds`` that both records hold."""
    before = {m["round"]: m for m in old.metrics if m["round"] <= rounds}
    now = {m["round"]: m for m in new.metrics if m["round"] <= rounds}
    keys = sorted({k for m in before.values() for k in m} - {"round"})
    out = []
    for k in keys:
        counts = {"equal": 0, "close": 0, "different": 0}
        first, worst = None, 0.0
        for r in sorted(set(before) & set(now)):
            a, b = before[r].get(k), now[r].get(k)
            kind = _kind(a, b)
            counts[kind] += 1
            if kind == "close":
                worst = max(worst, abs(a - b) / max(abs(a), abs(b)))
            if kind == "different" and first is None:
                first = (r, a, b)
        out.append(Comparison(k, counts["equal"], counts["close"], counts["different"], first, worst))
    return out


def _commits(rec: Record) -> str:
    return ", ".join(c[:7] + ("+dirty" if c.endswith("+dirty") else "") if c else "not recorded"
                     for c in rec.commits) or "not recorded"


def rerun(cell: Cell, seed: int, rounds: int, overrides: list[str]) -> Record:
    """Run ``cell``'s config with ``seed`` for ``rounds`` rounds in a scratch folder; its record."""
    from lowband.engine.simulator import Simulation

    with tempfile.TemporaryDirectory(prefix="lowband-verify-") as tmp:
        exp = load_experiment(cell.config, [*overrides, f"seed={seed}", f"rounds={rounds}",
                                            f'out_dir="{Path(tmp) / "run"}"'])
        Simulation(exp).run()
        return loads(dumps(build_record(Path(tmp) / "run")))


def report(cell: Cell, seed: int, old: Record, new: Record, rounds: int) -> tuple[list[str], bool]:
    """The lines ``--verify`` prints, and whether every metric is equal (or within tolerance)."""
    cmp = compare(old, new, rounds)
    lines = [f"verify {cell.id} seed {seed}, rounds 1-{rounds}: record {old.path} made by {_commits(old)}; "
             f"re-run here by {_commits(new)}"]
    for c in cmp:
        line = f"  {c.verdict:<16} {c.key} ({c.equal} equal, {c.close} within {REL_TOL:g}, {c.different} different)"
        if c.first:
            line += f": first at round {c.first[0]}: recorded {c.first[1]!r}, now {c.first[2]!r}"
        elif c.close:
            line += f": largest relative difference {c.worst:.2g}"
        lines.append(line)
    same = not any(c.different for c in cmp)
    n_diff = sum(c.verdict == "different" for c in cmp)
    lines.append(f"  {'REPRODUCED' if same else 'DIFFERENT'}: {len(cmp) - n_diff} of {len(cmp)} metrics "
                 + ("equal to the digit" if not any(c.close for c in cmp) and same else "equal or within tolerance")
                 + ("" if old.commits == new.commits else
                    f"; the record was made by other code ({_commits(old)}; here {_commits(new)})"))
    return lines, same


def verify_imported(cell: Cell, store: Store, seed: int, overrides: list[str]) -> tuple[list[str], bool]:
    """A cell known only by an imported value: re-run its rounds and compare the cell's value."""
    imp = store.imported().get(cell.id)
    if imp is None:
        raise ConfigError(f"--verify {cell.id}: the store ({store.dir}) holds no record of it; run it first "
                          f"(lowband reproduce {store.paper} --only {cell.id})")
    exp = load_experiment(cell.config, overrides)
    new = rerun(cell, seed, exp.rounds, overrides)
    text = value(cell, run_of_record(new, exp), None)[1]
    same = text == imp.ours
    prov = imp.provenance
    return [f"verify {cell.id} seed {seed}: imported value {imp.ours!r} ({prov['page']} at commit "
            f"{prov['commit'][:7]}, {prov['date']}; the code that made it is older and not recorded); re-run here by "
            f"{(code_commit() or 'not recorded')[:7]}: {text!r}: {'equal' if same else 'different'}"], same


def cmd_verify(args: argparse.Namespace, cells: list[Cell], store: Store) -> int:
    """Verify ``args.verify``'s cell: 0 when it reproduces, 1 when a metric differs."""
    from lowband.reproduce.cells import _overrides, config_seed

    match = [c for c in cells if c.id == args.verify]
    if not match:
        raise ConfigError(f"--verify {args.verify!r} is no cell id of {store.paper} (ids look like {cells[0].id!r})")
    cell = match[0]
    overrides = [o for o in _overrides(args) if not o.startswith("rounds=")]
    seed = config_seed(cell.config, overrides)
    recs = store.records(cell.config)
    if seed not in recs:
        lines, same = verify_imported(cell, store, seed, overrides)
    else:
        old = recs[seed]
        done = int(old.header.get("rounds_done") or 0)
        rounds = min(args.rounds or done, done)
        threads = old.header.get("threads")
        extra = [f"threads={threads}"] if threads and not args.threads else []
        new = rerun(cell, seed, rounds, overrides + extra)
        lines, same = report(cell, seed, old, new, rounds)
    print("\n".join(lines))
    return 0 if same else 1
