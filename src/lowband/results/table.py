"""The paper-vs-lowband table, rendered from the results store only (:func:`table_markdown`):
a pure function of the store's records, the paper's cells and today's configs, so the same
store renders the same page on any machine, with or without run folders.

A cell's value comes from the config's measured records (:func:`measured_row`: one seed's
value, or mean ± std over seeds, with the commits that made them and how their code differs);
where the store has none that reach the cell's round, from the value imported from an earlier
page (:func:`imported_row`, marked *imported* with where it was read); else the cell is not
run."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from lowband.config.schema import ConfigError
from lowband.config.resolve import load_experiment
from lowband.engine.checks import CHANCE_MARGIN, DECAY_DROP, DECAY_WINDOW
from lowband.results.rundata import Cell, RunData, number_text, run_of_record, value
from lowband.results.record import Record
from lowband.results.store import Imported, Store


@dataclass(frozen=True)
class Row:
    """One table row's *ours*, *rounds* and *run* columns, and its per-seed line (or "")."""

    ours: str
    rounds: str
    run: str
    seeds: str = ""


class Tabulator:
    """What a table reads, each once: the store's records of a config as runs, the rounds
    asked of it (its ``rounds``, or ``--rounds``) and today's config fingerprint."""

    def __init__(self, store: Store, overrides: list[str]):
        self.store, self.overrides = store, overrides
        self._runs: dict[str, tuple[dict[int, RunData], dict[int, Record]]] = {}
        self.imported = store.imported()

    def records(self, config: str) -> dict[int, Record]:
        return self._load(config)[1]

    def runs(self, config: str) -> dict[int, RunData]:
        """seed -> the config's measured runs in the store, read to the rounds asked."""
        return self._load(config)[0]

    def _load(self, config: str) -> tuple[dict[int, RunData], dict[int, Record]]:
        if config not in self._runs:
            try:
                exp = load_experiment(config, self.overrides)
            except ConfigError as e:
                print(f"  warning: {config}: {e}", file=sys.stderr)
                self._runs[config] = ({}, {})
                return self._runs[config]
            recs = self.store.records(config)
            self._runs[config] = ({s: run_of_record(r, exp) for s, r in recs.items()}, recs)
        return self._runs[config]

    def asked(self, config: str) -> int:
        return int(load_experiment(config, self.overrides).rounds)

    def fingerprint(self, config: str, extra: Optional[list[str]] = None) -> str:
        """Today's fingerprint of ``config`` with the table's overrides and ``extra``."""
        return _fingerprint(config, tuple(self.overrides + (extra or [])))


@lru_cache(maxsize=None)
def _fingerprint(config: str, overrides: tuple[str, ...]) -> str:
    """Today's fingerprint of ``config`` (:func:`lowband.results.record.fingerprint`)."""
    from lowband.results.record import fingerprint

    return fingerprint(load_experiment(config, list(overrides)).to_toml())


def config_fingerprint(config: str, overrides: list[str]) -> str:
    """A short digest of what makes ``config``'s runs comparable (see
    :func:`lowband.results.record.fingerprint`): a record whose fingerprint differs was
    made by another config."""
    return _fingerprint(config, tuple(overrides))


def _short(commit: Optional[str]) -> str:
    if not commit:
        return "commit not recorded"
    head, _, dirty = commit.partition("+")
    return head[:7] + (f"+{dirty}" if dirty else "")


def _seed_list(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(str(s) for s in seeds)}"


def commits_text(recs: dict[int, Record]) -> str:
    """Which code made the records: ``commit abc1234`` when one commit made every round,
    else each commit with its seeds and, where recorded, the size of the change between
    them (``code_change``: ``git diff --shortstat`` under src/)."""
    by: dict[Optional[str], list[int]] = {}
    for s, r in recs.items():
        for c in r.commits or [None]:
            by.setdefault(c, []).append(s)
    if len(by) == 1:
        only = next(iter(by))
        return f"commit {_short(only)}" if only else _short(only)
    parts = [f"{_short(c)} ({_seed_list(s)})" for c, s in by.items()]
    changes = sorted({f"{_short(old)}..{_short(c)}: {stat}" for r in recs.values() for c in r.commits[:1]
                      for old, stat in (r.header.get("code_change") or {}).items() if stat})
    return "made by different code: " + ", ".join(parts) + "".join(f"; {x}" for x in changes)


def _rounds_text(cell: Cell, runs: list[RunData]) -> str:
    done = sorted({d.rounds_done for d in runs})
    planned = max(d.rounds_planned for d in runs)
    text = f"{done[0]}/{planned}" if len(done) == 1 else f"{done[0]}-{done[-1]}/{planned}"
    return text + (f" (at {cell.round})" if cell.round is not None else "")


def _seed_value(cell: Cell, d: RunData, ref: Optional[RunData], furthest: int) -> tuple[Optional[float], str]:
    """One seed's (number, text); a seed behind the others at a final cell has none."""
    if cell.round is None and d.rounds_done < furthest:
        return None, f"behind (round {d.rounds_done} of {furthest})"
    return value(cell, d, ref)


def _mean_text(cell: Cell, nums: list[float], texts: list[str]) -> str:
    """``mean ± std (n=k[ of N])`` with the count of seeds marked unlearned or at chance."""
    from lowband.batch import stats

    st = stats(nums)
    ours = number_text(cell, st["mean"], mean=True)
    ours += f" ± {number_text(cell, st['std'], mean=True)}" if st["std"] is not None else ""
    ours += f" (n={len(nums)}" + (f" of {len(texts)})" if len(nums) < len(texts) else ")")
    for word in ("unlearned", "at chance"):
        n = sum(word in t for t in texts)
        ours += f" ({n} of {len(texts)} {word})" if n else ""
    return ours


def seeds_value(cell: Cell, runs: dict[int, RunData], refs: dict[int, RunData]) -> tuple[str, list[str]]:
    """(*ours*, per-seed texts) of ``cell`` over its config's seed ``runs``: the one run's
    text for a single seed, else ``mean ± std (n=k)`` over the seeds with a number (``of N``
    when some have none, e.g. a target not reached); ``refs`` are the reference's runs
    (paired by seed, else its first). A cell read at the run's end pools only the seeds that
    got furthest: a seed still under way is "behind"."""
    furthest = max(d.rounds_done for d in runs.values())
    per = {s: _seed_value(cell, d, refs.get(s) or next(iter(refs.values()), None), furthest) for s, d in runs.items()}
    texts = [f"{s}: {t or '-'}" for s, (_, t) in per.items()]
    nums = [v for v, _ in per.values() if v is not None]
    if len(per) == 1 or not nums:
        distinct = list(dict.fromkeys(t for _, t in per.values() if not t.startswith("behind")))
        return (distinct[0] if len(distinct) == 1 else "; ".join(t or "-" for t in distinct)), texts
    return _mean_text(cell, nums, [t or "" for _, t in per.values()]), texts


def _hours_text(runs: dict[int, RunData]) -> str:
    cpu_h = sum(d.cpu_hours for d in runs.values())
    gpu = [d for d in runs.values() if not d.on_cpu]
    untimed = sum(d.untimed for d in runs.values())
    return (f"{cpu_h:.3g} CPU-h"
            + (f"; {sum(d.gpu_hours for d in gpu):.3g} GPU-h on a GPU" if gpu else "")
            + (f"; {untimed} rounds untimed, not counted" if untimed else ""))


def _stale(config: str, recs: dict[int, Record], tab: Tabulator) -> list[int]:
    """The seeds whose record was made by another config than today's (a run's thread count
    is its own, float sums may differ by it: the record says it, the table does not flag it)."""
    return sorted(s for s, r in recs.items() if r.header.get("fingerprint") != tab.fingerprint(
        config, [f"threads={r.header['threads']}"] if r.header.get("threads") else []))


def measured_row(cell: Cell, tab: Tabulator) -> Optional[Row]:
    """The row of ``cell`` from its config's measured records (None: there are none, or,
    where a value was imported for the cell, none that reach the cell's round)."""
    runs = tab.runs(cell.config)
    need = cell.round or tab.asked(cell.config)
    if not runs or (cell.id in tab.imported and all(d.rounds_done < need for d in runs.values())):
        return None
    refs = tab.runs(cell.reference) if cell.reference else {}
    ours, per_seed = seeds_value(cell, runs, refs)
    recs = tab.records(cell.config)
    run = (f"record `{tab.store.key(cell.config)}` {_seed_list(list(runs))} ({_hours_text(runs)}; "
           f"{commits_text(recs)})")
    stale = _stale(cell.config, recs, tab)
    if stale:
        run += f" (made by another config than today's: {_seed_list(stale)})"
    imp = tab.imported.get(cell.id)
    if imp is not None:
        run += f" (imported before: {imp.ours} at {imp.rounds})"
    spent = [f" ({d.gpu_hours:.3g} GPU-h)" if d.gpu_hours else f" ({d.cpu_hours:.3g} CPU-h)" if d.cpu_hours else ""
             for d in runs.values()]
    seeds = f"- `{cell.id}`: {', '.join(t + h for t, h in zip(per_seed, spent))}" if len(runs) > 1 and ours else ""
    return Row(ours, _rounds_text(cell, list(runs.values())), run, seeds)


def imported_row(cell: Cell, imp: Imported, tab: Tabulator) -> Row:
    """The row of a cell whose value was imported from an earlier page: as printed there,
    marked *imported* with its run folder, seeds and recorded hours."""
    folder = imp.run.split("`")[1] if imp.run.count("`") >= 2 else "?"
    seeds = f" seeds {', '.join(str(s) for s in imp.seeds_list)}" if imp.seeds_list else ""
    hours = f"; {imp.cpu_h:.3g} CPU-h" if imp.cpu_h is not None else "; compute not recorded"
    then = imp.fingerprint  # (the page's runs were collected with its overrides, e.g. threads=1)
    now = tab.fingerprint(cell.config, imp.provenance.get("overrides", []))
    changed = " (made by another config than today's)" if then and then != now else ""
    note = f"- `{cell.id}` (imported): {', '.join(f'{s}: {t}' for s, t in imp.seeds.items())}" if imp.seeds else ""
    return Row(imp.ours, imp.rounds, f"*imported*: `{folder}`{seeds}{hours}{changed}", note)


def cell_row(cell: Cell, tab: Tabulator) -> Row:
    """A cell's row: measured if the store holds records for it, else imported, else not run."""
    row = measured_row(cell, tab)
    if row is not None:
        return row
    imp = tab.imported.get(cell.id)
    return imported_row(cell, imp, tab) if imp is not None else Row("", "", "not run")


def compute_line(cells: list[Cell], tab: Tabulator) -> str:
    """The compute behind the table: the measured records' CPU time (the sum of each run's
    per-round CPU time: measured, else wall-clock x ``threads`` x engine workers), and the
    CPU-hours the earlier pages recorded for the imported values (each run folder once)."""
    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    runs = [d for cfg in configs for d in tab.runs(cfg).values()]
    line = (f"**Compute: {sum(d.cpu_hours for d in runs):.3g} CPU-hours** "
            f"({sum(d.seconds for d in runs) / 3600:.3g} h wall-clock) in the {len(runs)} recorded runs of "
            f"{len(configs)} configs (the records' per-round CPU time: its process and the engine's workers)")
    gpu = [d for d in runs if not d.on_cpu]
    line += f"; {len(gpu)} runs on a GPU add {sum(d.gpu_hours for d in gpu):.3g} GPU-hours." if gpu else "."
    return line + _imported_hours(cells, tab)


def _imported_hours(cells: list[Cell], tab: Tabulator) -> str:
    """The CPU-hours the earlier pages recorded for the imported values shown (each run
    folder once), or "" when none is shown."""
    shown = {c.id for c in cells if measured_row(c, tab) is None} & set(tab.imported)
    folders: dict[str, Optional[float]] = {}
    for cid in sorted(shown):
        imp = tab.imported[cid]
        folders.setdefault(imp.run.split("`")[1] if "`" in imp.run else cid, imp.cpu_h)
    if not folders:
        return ""
    known = [h for h in folders.values() if h is not None]
    return (f" The imported values add {sum(known):.3g} CPU-hours as their page recorded them, for "
            f"{len(known)} of their {len(folders)} runs.")


def header_lines(paper: str, tab: Tabulator) -> list[str]:
    """The title and the paragraph that says how to read the table."""
    prov = next(iter(tab.imported.values())).provenance if tab.imported else None
    text = (f"Rendered from the records in [`records/{paper}/`](records/{paper}/) by `lowband reproduce {paper} "
            f"--render` (nothing else: a page rendered from the same records is the same page). One row per table "
            f"cell of experiments/{paper}/reproduce.toml; *rounds* is the number of rounds the value comes from "
            f"(of the config's planned rounds); an empty *ours* means the run has not been made. Where a config has "
            f"several seed records, *ours* is mean ± std over them (n seeds) and each seed's value is listed under "
            f"the table; *run* names the record, its CPU-hours and the commit of the code that made it (each commit "
            f"and the size of the change between them where the seeds were made by different code). "
            f"\"unlearned: best X at rN\" marks a run whose accuracy is, at the cell's round, more than "
            f"{100 * DECAY_DROP:g} points under what it reached (the median of its last {DECAY_WINDOW} evaluations "
            f"against the best such median: the run-time warning's rule): *ours* is still the value at the cell's "
            f"round. \"at chance: 1/C = X\" marks a run whose accuracy was never more than {100 * CHANCE_MARGIN:g} "
            f"points above guessing among its C classes up to the cell's round: it learned nothing.")
    if prov:
        text += (f" *imported* marks a value whose run folder is gone: it is shown as {prov['page']} printed it at "
                 f"commit {prov['commit'][:7]} ({prov['date']}), not measured from a record.")
    return [f"# {paper}: paper vs lowband", "", text, ""]


def table_markdown(paper: str, cells: list[Cell], store: Store, overrides: Optional[list[str]] = None) -> str:
    """The paper-vs-lowband table of ``cells``, rendered from ``store`` (and today's configs,
    for the rounds asked and the fingerprints) only."""
    tab = Tabulator(store, overrides or [])
    tables: dict[str, list[Cell]] = {}
    for c in cells:
        tables.setdefault(c.table, []).append(c)
    body: list[str] = []
    for t, cs in tables.items():
        body += [f"## {t}", "", "| cell | row | metric | paper | ours | rounds | run |", "|---|---|---|---|---|---|---|"]
        notes = []
        for c in cs:
            row = cell_row(c, tab)
            unit = c.paper_unit or ("%" if "acc" in c.metric else "")
            paper_s = "" if c.paper is None else f"{c.paper}{' ' + unit if unit and unit != 'rounds' else ''}"
            body.append(f"| {c.id} | {c.row} | {c.metric} | {paper_s} | {row.ours} | {row.rounds} | {row.run} |")
            notes += [row.seeds] if row.seeds else []
        if notes:
            body += ["", "Per seed (seed: value) of the cells with several seeds:", "", *notes]
        body.append("")
    return "\n".join([*header_lines(paper, tab), compute_line(cells, tab), "", *body])
