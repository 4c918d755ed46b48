"""The paper-vs-ours markdown table (:func:`table_markdown`): a cell's value over its seeds
(:func:`seeds_value`), seeds and cells kept from the previous table (:class:`KeptSeed`,
:func:`kept_seeds`, :func:`previous_cells`), the compute line (:func:`compute_line`) and the
config fingerprints that say whether a kept value is still of today's config
(:func:`config_fingerprint`, :func:`changed_since`)."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from lowband.config.schema import ConfigError
from lowband.config.resolve import load_experiment
from lowband.engine.checks import CHANCE_MARGIN, DECAY_DROP, DECAY_WINDOW
from lowband.reproduce.cells import Cell, config_seed
from lowband.reproduce.rundata import RunData, left_out_seeds, number_text, seed_data, value


@dataclass(frozen=True)
class KeptSeed:
    """One seed's value kept from the previous table because its run folder is gone while
    other seeds of the same config are on disk: ``value`` (None where the text holds no
    number, e.g. ``> 30``), its ``text`` as that table wrote it, and ``rounds`` (how far
    that table's runs had got)."""

    value: Optional[float]
    text: str
    rounds: int
    cpu_hours: Optional[float] = None  #: the seed's compute as that table recorded it, if it did
    spent: str = ""  #: that compute as the table wrote it (`` (0.81 CPU-h)``, `` (0.1 GPU-h)``)


_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
_SEED_CPU_H = re.compile(r" \(([0-9.eE+-]+) ([CG])PU-h\)$")


def seed_compute(d: RunData) -> str:
    """The suffix a seed's entry in a per-seed list carries: its own compute (`` (0.81
    CPU-h)``, GPU-hours for a run on a GPU; nothing for an untimed run). A later table that
    keeps the seed after its folder is gone reads its CPU-hours back from there, so the
    compute the header states stays that seed's and does not drift between collects."""
    if d.gpu_hours:
        return f" ({d.gpu_hours:.3g} GPU-h)"
    return f" ({d.cpu_hours:.3g} CPU-h)" if d.cpu_hours else ""


def kept_seeds(note: str, rounds: str, on_disk: set[int]) -> dict[int, KeptSeed]:
    """Seeds of a previous table's per-seed list ``note`` (``"0: 79.43, 1: behind (round 0
    of 30)"``) that have a value there and no run folder now (``on_disk``): a cleaned
    ``runs/`` must not erase a seed that was measured when the other seeds are rerun.
    ``rounds`` is that table's *rounds* column (``"0-30/30"``): the kept values are from
    its furthest round. A seed that was behind, or had no value, is not kept (``> 30``, a
    target not reached, is a value)."""
    furthest = _furthest(rounds)
    out: dict[int, KeptSeed] = {}
    for m in re.finditer(r"(?:^|, )(\d+): (.*?)(?=, \d+: |$)", note):
        s, text = int(m.group(1)), m.group(2).strip()
        if s in on_disk or text in ("", "-") or text.startswith("behind"):
            continue
        spent = _SEED_CPU_H.search(text)
        text = text[:spent.start()] if spent else text
        num = _NUMBER.match(text)
        if num is None and not text.startswith(">"):  # "n/a (reference not run)": nothing measured
            continue
        out[s] = KeptSeed(float(num.group(0).replace(",", "")) if num else None, text, furthest,
                          float(spent.group(1)) if spent and spent.group(2) == "C" else None,
                          spent.group(0) if spent else "")
    return out


def seeds_value(cell: Cell, runs: dict[int, RunData], refs: dict[int, RunData],
                kept: Optional[dict[int, KeptSeed]] = None) -> tuple[str, list[str]]:
    """(*ours*, per-seed texts) of ``cell`` over its config's seed ``runs`` (and the
    ``kept`` seeds whose folders are gone): the one run's text for a single seed, else
    ``mean ± std (n=k)`` over the seeds with a number (``of N`` when some have none, e.g.
    a target not reached); ``refs`` are the reference's runs (paired by seed, else its
    first)."""
    from lowband.batch import stats

    kept = kept or {}
    # a cell read at the run's end (no ``round``) pools only the seeds that got furthest: a
    # seed still under way would mix round 3 into a round-30 mean (it counts as "n=k of N")
    furthest = max([d.rounds_done for d in runs.values()] + [k.rounds for k in kept.values()])
    per = []
    for s in sorted({*runs, *kept}):
        d, k = runs.get(s), kept.get(s)
        done = d.rounds_done if d is not None else k.rounds
        if cell.round is None and done < furthest:
            per.append((s, None, f"behind (round {done} of {furthest})"))
        elif d is not None:
            ref = refs.get(s) or next(iter(refs.values()), None)
            per.append((s, *value(cell, d, ref)))
        else:
            per.append((s, k.value, k.text))
    texts = [f"{s}: {t or '-'}" for s, _, t in per]
    if len(per) == 1:
        return per[0][2], texts
    nums = [v for _, v, _ in per if v is not None]
    if not nums:
        distinct = list(dict.fromkeys(t for _, _, t in per if not t.startswith("behind")))
        return (distinct[0] if len(distinct) == 1 else "; ".join(t or "-" for t in distinct)), texts
    st = stats(nums)
    ours = number_text(cell, st["mean"], mean=True)
    if st["std"] is not None:
        ours += f" ± {number_text(cell, st['std'], mean=True)}"
    ours += f" (n={len(nums)}" + (f" of {len(per)})" if len(nums) < len(per) else ")")
    fell = sum("unlearned" in (t or "") for _, _, t in per)
    if fell:
        ours += f" ({fell} of {len(per)} unlearned)"
    blind = sum("at chance" in (t or "") for _, _, t in per)
    if blind:
        ours += f" ({blind} of {len(per)} at chance)"
    return ours, texts


_CPU_H = re.compile(r"`([^`]+)`[^`]*?\(([0-9.eE+-]+) CPU-h[);]")


def _one_seed_compute(where: str) -> str:
    """The per-seed suffix (:func:`seed_compute`) of the one run of a one-seed cell, read
    from its *run* column ``where``: its GPU-hours where it ran on a GPU (the column's CPU-h
    are then 0, not its compute), else its CPU-hours; "" where neither is recorded."""
    gpu = re.search(r"; ([0-9.eE+-]+) GPU-h for 1 run on a GPU", where)
    if gpu:
        return f" ({gpu.group(1)} GPU-h)"
    spent = _CPU_H.search(where)
    return f" ({spent.group(2)} CPU-h)" if spent else ""


_HELD = re.compile(r"`([^`]+)`.*\(seeds? ([0-9, ]+) kept from the previous table: run folder not found"
                   r"(?:; ([0-9.eE+-]+) CPU-h)?(?:, (\d+) not recorded)?(; compute not recorded)?\)")


def _held_compute(held: dict[int, KeptSeed]) -> str:
    """What a cell's *run* column says of the compute of its seeds kept from the previous
    table (``held``): their recorded CPU-hours, and how many have none recorded."""
    known = [k.cpu_hours for k in held.values() if k.cpu_hours is not None]
    if not known:
        return "; compute not recorded"
    unknown = len(held) - len(known)
    return f"; {sum(known):.3g} CPU-h" + (f", {unknown} not recorded" if unknown else "")


def compute_line(runs: list[Optional[RunData]], configs: Optional[int] = None,
                 kept: Optional[dict[str, str]] = None) -> str:
    """The compute the table's runs took: CPU-hours = the sum over runs (every seed) of
    their logged per-round CPU time (:attr:`RunData.cpu_hours`: measured, else wall-clock x
    ``threads`` x engine workers), plus the CPU-hours recorded in the *run* column of cells
    kept from the previous table (``kept``: cell id -> that column)."""
    made = {d.dir.resolve(): d for d in runs if d is not None}
    cpu_h = sum(d.cpu_hours for d in made.values())
    wall_h = sum(d.seconds for d in made.values()) / 3600
    unset = sum(1 for d in made.values() if not d.threads and d.on_cpu)
    note = f"; {unset} without `threads` counted as one core" if unset else ""
    untimed = [d for d in made.values() if d.untimed]
    if untimed:
        note += (f"; {len(untimed)} runs have {sum(d.untimed for d in untimed)} rounds without timing.jsonl lines, "
                 f"not counted (their compute is unknown: the hours are a lower bound)")
    unmetered = [d for d in made.values() if d.on_cpu and d.unmetered]
    if unmetered:
        note += (f"; {len(unmetered)} runs have {sum(d.unmetered for d in unmetered)} rounds logged without their "
                 f"CPU time (before it was recorded, or on Ray), counted as wall-clock x `threads` x engine workers")
    pooled = [d for d in made.values() if d.uncounted_workers]
    if pooled:
        note += (f"; {len(pooled)} of them ran with `engine.workers` other than 1 before the workers were recorded, "
                 f"counted as one process each (their hours are a lower bound, by up to the worker count)")
    gpu = [d for d in made.values() if not d.on_cpu]
    if gpu:
        note += (f"; {len(gpu)} runs on a GPU ({', '.join(sorted({d.device for d in gpu}))}) add "
                 f"{sum(d.gpu_hours for d in gpu):.3g} GPU-hours, not counted as CPU-hours")
    line = (f"**Compute: {cpu_h:.3g} CPU-hours** ({wall_h:.3g} h wall-clock) in the {len(made)} runs made of "
            f"{len(runs) if configs is None else configs} configs: the sum of each run's per-round CPU time "
            f"(timing.jsonl: its process and the engine's workers){note}.")
    if kept:
        recorded: dict[str, float] = {}
        missing: set[str] = set()
        for cell, where in kept.items():
            held = _HELD.search(where)
            if held:  # seeds kept beside runs on disk (those are counted above), or inside a kept cell
                key = f"{held.group(1)} seeds {held.group(2)}"
                if held.group(3):
                    recorded.setdefault(key, float(held.group(3)))
                # each seed without recorded hours (none said: a table from before per-seed compute)
                unknown = int(held.group(4)) if held.group(4) else 0 if held.group(3) else len(
                    re.findall(r"\d+", held.group(2)))
                missing.update(f"{key} #{i}" for i in range(unknown))
                if cell.endswith("#kept-seeds"):
                    continue
            hits = _CPU_H.findall(where)
            if not hits:
                folder = re.search(r"`([^`]+)`", where)
                missing.add(folder.group(1) if folder else where)
            for folder, h in hits:
                recorded.setdefault(folder, float(h))
        if recorded:
            line += (f" Cells kept from the previous table add {sum(recorded.values()):.3g} CPU-hours "
                     f"(recorded for {len(recorded)} runs)")
            missing -= set(recorded)  # one cell of a config said "not recorded", another recorded it
            line += f"; {len(missing)} of their runs have no recorded compute." if missing else "."
        elif missing:
            line += (f" The {len(missing)} runs of cells kept from the previous table have no recorded compute "
                     f"(not counted).")
    return line


#: the key prefix under which :func:`previous_cells` returns a run folder's config fingerprint
FINGERPRINT = "fingerprint/"


def config_fingerprint(config: str, overrides: list[str]) -> str:
    """A short digest of what makes ``config``'s runs comparable (its settings with every
    hyperparameter resolved, less what a resume may change, the seed and the folder: the
    comparison :func:`~lowband.engine.runlog.config_diff` makes). A table records it for each run folder whose values
    it holds, so a value kept after its folder is gone is kept only while the config is
    still the one that measured it."""
    import hashlib

    from lowband.engine.runlog import _comparable

    exp = load_experiment(config, overrides)
    d = json.loads(_comparable(exp.to_toml()))
    for key in ("seed", "out_dir", "name"):
        d.pop(key, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def seed_note(previous: dict[str, tuple[str, str, str]], cell_id: str, config: str, overrides: list[str]) -> str:
    """The per-seed list (``"0: 81.97 (1.06 CPU-h), 1: ..."``) the table being replaced
    (``previous``) holds for ``cell_id``; for a cell it measured with one seed (no list), that
    seed's entry built from its row: the config's own seed, its value and the compute of the
    row's *run* column (:func:`_one_seed_compute`). "" when there is neither."""
    note = previous.get(f"seeds/{cell_id}", ("", "", ""))[2]
    if note or cell_id not in previous:
        return note
    ours, _, where = previous[cell_id]
    if " seeds " in where.split("`")[-1]:
        return ""
    return f"{config_seed(config, overrides)}: {ours}{_one_seed_compute(where)}"


def changed_since(previous: dict[str, tuple[str, str, str]], config: str, overrides: list[str]) -> bool:
    """Whether the table being replaced (``previous``) recorded ``config``'s run folder under
    another config fingerprint than today's (False where it recorded none: a table from
    before fingerprints)."""
    then = _print_of(previous, load_experiment(config, overrides).run_dir())
    return then is not None and then[2] != config_fingerprint(config, overrides)


def _print_of(previous: dict[str, tuple[str, str, str]], run_dir: Path) -> Optional[tuple[str, str, str]]:
    """The fingerprint the table being replaced recorded for ``run_dir``: under its path (as
    the *run* column writes it), else under its last name (tables written before the path
    was the key; two configs whose folders share a name were indistinguishable there)."""
    return previous.get(f"{FINGERPRINT}{Path(run_dir).as_posix()}") or previous.get(f"{FINGERPRINT}{Path(run_dir).name}")


def previous_cells(path: Path) -> dict[str, tuple[str, str, str]]:
    """cell id -> (ours, rounds, run) of the rows of an earlier table at ``path`` that hold
    a value (empty when there is none), with their per-seed values (``seeds/<id>`` ->
    ("", "", the list)). Rows kept from an even earlier table keep their note."""
    out: dict[str, tuple[str, str, str]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(errors="replace").splitlines():
        fp = re.fullmatch(r"<!-- lowband config fingerprints: (\{.*\}) -->", line.strip())
        if fp:
            try:
                prints = json.loads(fp.group(1))
            except ValueError:
                prints = {}
            for folder, digest in (prints.items() if isinstance(prints, dict) else ()):
                if isinstance(folder, str) and isinstance(digest, str):
                    out[f"{FINGERPRINT}{folder}"] = ("", "", digest)
            continue
        m = re.match(r"- `([^`]+)`: (.+)$", line.strip())
        if m:
            out[f"seeds/{m.group(1)}"] = ("", "", m.group(2))
            continue
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 7 and cols[4] and cols[0] not in ("cell", "---"):
            out[cols[0]] = (cols[4], cols[5], cols[6])
    return out


def _same_run(where: str, config: str, overrides: list[str]) -> bool:
    """Whether a previous table's *run* column (```R` ...``) names ``config``'s run folder (the
    whole path, not only its last name: ``runs/fol/cpu/x`` is not ``runs/fol/x``): a cell
    whose config changed must not keep a value another config measured."""
    m = re.match(r"`([^`]+)`", where)
    if m is None:
        return False
    try:
        rd = load_experiment(config, overrides).run_dir()
    except ConfigError:
        return False
    then, now = Path(m.group(1)).parts, Path(rd).parts
    n = min(len(then), len(now))  # one may be absolute: compare the trailing parts both have
    return then[-n:] == now[-n:]


def _furthest(rounds: str) -> int:
    """How far a previous table's runs had got, from its *rounds* column (``"0-30/30"``)."""
    done = re.match(r"(?:\d+-)?(\d+)/\d+", rounds.strip())
    return int(done.group(1)) if done else 0


def _past_asked(cell: Cell, furthest: int, asked: int) -> bool:
    """Whether a value kept from a previous table whose runs had got to round ``furthest``
    is not ``cell``'s value at the rounds asked now (``asked``: the config's rounds, or
    ``--rounds``): a cell read at the run's end kept from more rounds than asked would stand
    for a round-``asked`` value (and turn the seeds on disk, read at ``asked``, into
    "behind"); a cell read at a fixed round within ``asked`` is the same value either way."""
    return furthest > asked and (cell.round is None or cell.round > asked)


def _rounds_text(cell: Cell, runs: list[RunData], kept: Optional[dict[int, KeptSeed]] = None) -> str:
    kept = kept or {}
    done = sorted({d.rounds_done for d in runs} | {k.rounds for k in kept.values()})
    planned = max(d.rounds_planned for d in runs)
    text = f"{done[0]}/{planned}" if len(done) == 1 else f"{done[0]}-{done[-1]}/{planned}"
    return text + (f" (at {cell.round})" if cell.round is not None else "")


def table_markdown(paper: str, cells: list[Cell], overrides: list[str], command: str,
                   previous: Optional[dict[str, tuple[str, str, str]]] = None) -> str:
    """The paper-vs-lowband table. A cell whose run folders are all gone keeps its value
    from ``previous`` (the table being replaced), marked as kept, instead of going blank: a
    cleaned ``runs/`` must not erase results that were measured. A cell with several seed
    runs shows mean ± std and lists its per-seed values under its table."""
    previous = previous or {}
    cache: dict[str, dict[int, RunData]] = {}

    def data(cfg: str) -> dict[int, RunData]:
        if cfg not in cache:
            try:
                cache[cfg] = seed_data(cfg, overrides)
            except ConfigError as e:
                print(f"  warning: {cfg}: {e}", file=sys.stderr)
                cache[cfg] = {}
        return cache[cfg]

    rounds_of: dict[str, int] = {}

    def asked(cfg: str) -> int:  # the rounds the table is of: the config's, or --rounds (loaded once a config)
        if cfg not in rounds_of:
            rounds_of[cfg] = int(load_experiment(cfg, overrides).rounds)
        return rounds_of[cfg]

    configs = list(dict.fromkeys([c.config for c in cells] + [c.reference for c in cells if c.reference]))
    tables: dict[str, list[Cell]] = {}
    for c in cells:
        tables.setdefault(c.table, []).append(c)
    kept: dict[str, str] = {}
    prints: dict[str, str] = {}
    body: list[str] = []
    # a seed's compute as any cell of its config recorded it (every cell of a config lists
    # the same runs; a table written before per-seed compute existed may have it in one)
    seed_hours: dict[tuple[str, int], float] = {}
    for c in cells:
        for s, k in kept_seeds(previous.get(f"seeds/{c.id}", ("", "", ""))[2], "", set()).items():
            if k.cpu_hours is not None:
                seed_hours.setdefault((c.config, s), k.cpu_hours)
    for t, cs in tables.items():
        body += [f"## {t}", "", "| cell | row | metric | paper | ours | rounds | run |", "|---|---|---|---|---|---|---|"]
        notes = []
        for c in cs:
            runs = data(c.config)
            refs = data(c.reference) if c.reference else {}
            unit = c.paper_unit or ("%" if "acc" in c.metric else "")
            paper_s = "" if c.paper is None else f"{c.paper}{' ' + unit if unit and unit != 'rounds' else ''}"
            left_out = left_out_seeds(c.config, overrides, runs)
            if not runs and left_out:
                ours, rounds, where = "", "", f"left out: `{next(iter(left_out.values()))}` (see the warning)"
            elif not runs and c.id in previous and not _same_run(previous[c.id][2], c.config, overrides):
                print(f"  warning: {c.id}: the previous table's value came from another run folder than "
                      f"{c.config}'s; not kept", file=sys.stderr)
                ours, rounds, where = "", "", "not run"
            elif not runs and c.id in previous and changed_since(previous, c.config, overrides):
                print(f"  warning: {c.id}: the previous table's value was measured under another version of "
                      f"{c.config} (its settings changed since); not kept", file=sys.stderr)
                ours, rounds, where = "", "", "not run (the config changed since the value the table had)"
            elif not runs and c.id in previous and _past_asked(c, _furthest(previous[c.id][1]), asked(c.config)):
                n = asked(c.config)
                print(f"  warning: {c.id}: the previous table's value is from round {_furthest(previous[c.id][1])}, "
                      f"past the {n} rounds asked; not kept", file=sys.stderr)
                ours, rounds, where = "", "", f"not run (the previous table's value is of more rounds than {n})"
            elif not runs and c.id in previous:
                ours, rounds, where = previous[c.id]
                if "kept from the previous table" not in where:
                    where = f"{where} (kept from the previous table: run folder not found)"
                kept[c.id] = where
                if f"seeds/{c.id}" in previous:
                    notes.append(f"- `{c.id}`: {previous[f'seeds/{c.id}'][2]}")
            elif not runs:
                ours, rounds, where = "", "", "not run"
            else:
                held = {}
                if c.id in previous and _same_run(previous[c.id][2], c.config, overrides) \
                        and changed_since(previous, c.config, overrides):
                    gone = kept_seeds(seed_note(previous, c.id, c.config, overrides), previous[c.id][1],
                                      set(runs) | set(left_out))
                    if gone:
                        print(f"  warning: {c.id}: the previous table's value of seed "
                              f"{', '.join(str(s) for s in gone)} was measured under another version of {c.config} "
                              f"(its settings changed since); not kept", file=sys.stderr)
                elif c.id in previous and _same_run(previous[c.id][2], c.config, overrides):
                    note = seed_note(previous, c.id, c.config, overrides)
                    held = {s: k if k.cpu_hours is not None else replace(k, cpu_hours=seed_hours.get((c.config, s)))
                            for s, k in kept_seeds(note, previous[c.id][1], set(runs) | set(left_out)).items()}
                    past = [s for s, k in held.items() if _past_asked(c, k.rounds, asked(c.config))]
                    if past:
                        print(f"  warning: {c.id}: the previous table's value of seed {', '.join(map(str, past))} is "
                              f"from round {held[past[0]].rounds}, past the {asked(c.config)} rounds asked; not kept",
                              file=sys.stderr)
                        held = {s: k for s, k in held.items() if s not in past}
                ours, per_seed = seeds_value(c, runs, refs, held)
                rounds = _rounds_text(c, list(runs.values()), held)
                base = next(iter(runs.values())).dir
                base = base.parent if re.fullmatch(r"seed-\d+", base.name) else base
                every = sorted({*runs, *held})
                seeds = "" if len(every) == 1 else f" seeds {', '.join(str(s) for s in every)}"
                cpu_h = sum(d.cpu_hours for d in runs.values())
                gpu_h = sum(d.gpu_hours for d in runs.values())
                on_gpu = sum(not d.on_cpu for d in runs.values())
                untimed = sum(d.untimed for d in runs.values())
                where = f"`{base}`{seeds} ({cpu_h:.3g} CPU-h" + (
                    f"; {gpu_h:.3g} GPU-h for {on_gpu} run{'s' if on_gpu > 1 else ''} on a GPU" if on_gpu else "") + (
                    f"; {untimed} rounds untimed, not counted)" if untimed else ")")
                if held:
                    names = ", ".join(str(s) for s in held)
                    where += f" (seed {names} kept from the previous table: run folder not found{_held_compute(held)})"
                if len(every) > 1 and ours:
                    spent = {s: seed_compute(d) for s, d in runs.items()} | {
                        s: k.spent or (f" ({k.cpu_hours:.3g} CPU-h)" if k.cpu_hours is not None else "")
                        for s, k in held.items()}
                    notes.append(f"- `{c.id}`: {', '.join(t + spent[s] for s, t in zip(sorted(every), per_seed))}")
            if _HELD.search(where):
                kept[f"{c.id}#kept-seeds"] = where  # the held seeds' compute, read by compute_line
            if ours:  # the config its values are of: today's for runs on disk, the earlier table's for kept ones
                rd = load_experiment(c.config, overrides).run_dir()
                folder, then = rd.as_posix(), _print_of(previous, rd)
                if runs:
                    prints[folder] = config_fingerprint(c.config, overrides)
                elif then:  # a value kept from a table without fingerprints stays of an unknown config
                    prints[folder] = then[2]
            body.append(f"| {c.id} | {c.row} | {c.metric} | {paper_s} | {ours} | {rounds} | {where} |")
        if notes:
            body += ["", "Per seed (seed: value) of the cells with several seeds:", "", *notes]
        body.append("")
    lines = [f"# {paper}: paper vs lowband", "",
             f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M')}. One row per table cell of "
             f"experiments/{paper}/reproduce.toml; *rounds* is the number of rounds the value comes from "
             f"(of the config's planned rounds); an empty *ours* means the run has not been made. Where a "
             f"config has several seed runs, *ours* is mean ± std over them (n seeds) and each seed's value is "
             f"listed under the table; *run* gives each cell's CPU-hours (and the GPU-hours of runs made on a GPU). \"unlearned: best X at rN\" marks a "
             f"run whose accuracy is, at the cell's round, more than {100 * DECAY_DROP:g} points under what it "
             f"reached (the median of its last {DECAY_WINDOW} evaluations against the best such median: the "
             f"run-time warning's rule): *ours* is still the value at the cell's round. \"at chance: 1/C = X\" "
             f"marks a run whose accuracy was never more than {100 * CHANCE_MARGIN:g} points above guessing among "
             f"its C classes up to the cell's round: it learned nothing.", "",
             compute_line([d for cfg in configs for d in data(cfg).values()], len(configs), kept), "", *body]
    if prints:  # read back by the next collect (previous_cells), invisible where the page is rendered
        lines.append(f"<!-- lowband config fingerprints: {json.dumps(dict(sorted(prints.items())))} -->")
    return "\n".join(lines)
