"""Seeds in ``lowband reproduce`` (issue 15 part 7, issue 16 part 2): each seed of a config
runs once in the layout the lead's runs use (the config's seed in ``runs/<name>/``, seed
``s`` in ``runs/<name>/seed-<s>/``) or in ``lowband run --seeds``'s (``seed-<s>/`` for every
seed); tables show mean ± std (n) with the per-seed values; ``lowband compare`` too."""

from __future__ import annotations

import re
import shutil
import statistics
import tomllib
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import digits_config
from lowband.config import ConfigError
from lowband.engine.runlog import RunLog


def _paper(root: Path, seeds: object = None, rounds: int = 2, seed: int = 0) -> Path:
    """A one-config paper ``toy`` (DFedAvg on digits, run folder runs/toy) with two cells;
    ``seeds`` on the first cell."""
    exp = root / "papers" / "toy"
    exp.mkdir(parents=True)
    cfg = digits_config(root, "dfedavg", rounds=rounds)
    cfg.update(seed=seed, out_dir="runs/toy")
    cfg["eval"] = {"protocols": ["consensus"], "main": "consensus/acc", "target": 0.05}
    (exp / "dfedavg.toml").write_text(tomli_w.dumps(cfg))
    acc = {"id": "t/acc", "table": "t", "config": "dfedavg.toml", "metric": "consensus/acc"}
    if seeds is not None:
        acc["seeds"] = seeds
    runs = [acc, {"id": "t/rounds", "table": "t", "config": "dfedavg.toml", "metric": "rounds_to_target"}]
    (exp / "reproduce.toml").write_text(tomli_w.dumps({"paper": "toy", "run": runs}))
    return root / "papers"


def _row(table: Path, cell: str) -> list[str]:
    line = next(x for x in table.read_text().splitlines() if x.startswith(f"| {cell} |"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _final_acc(run: Path) -> float:
    return 100 * RunLog.read_jsonl(run / "metrics.jsonl")[-1]["consensus/acc"]


def test_cell_seeds_run_once_each_in_the_leads_layout_and_show_mean_std(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1, 2])
    monkeypatch.chdir(tmp_path)
    # seeds 0 and 1 made beforehand as the lead makes them: reused, not run again
    cfg = str(papers / "toy" / "dfedavg.toml")
    assert main(["run", cfg, "--quiet"]) == 0
    assert main(["run", cfg, "seed=1", "out_dir=runs/toy/seed-1", "--quiet"]) == 0
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "reuse   papers/toy/dfedavg.toml seed 0 -> runs/toy (" in out
    assert "reuse   papers/toy/dfedavg.toml seed 1 -> runs/toy/seed-1" in out
    assert "run     papers/toy/dfedavg.toml seed 2 -> runs/toy/seed-2" in out
    runs = {0: tmp_path / "runs" / "toy", 1: tmp_path / "runs" / "toy" / "seed-1",
            2: tmp_path / "runs" / "toy" / "seed-2"}
    for s, d in runs.items():
        assert tomllib.loads((d / "config.toml").read_text())["seed"] == s
    accs = [_final_acc(d) for d in runs.values()]
    assert len(set(accs)) > 1  # the seeds really differ
    table = tmp_path / "out" / "toy_table.md"
    row = _row(table, "t/acc")
    m = re.fullmatch(r"([\d.]+) ± ([\d.]+) \(n=3\)", row[4])
    assert m, row
    assert float(m.group(1)) == pytest.approx(statistics.mean(accs), abs=0.006)
    assert float(m.group(2)) == pytest.approx(statistics.stdev(accs), abs=0.006)
    assert row[5] == "2/2" and row[6].startswith("`runs/toy` seeds 0, 1, 2 (") and "CPU-h)" in row[6]
    text = table.read_text()
    assert re.search(re.escape("- `t/acc`: ") + ", ".join(
        re.escape(f"{s}: {a:.2f}") + r" \([0-9.e-]+ CPU-h\)" for s, a in zip(runs, accs)), text)
    # a cell without seeds of the same config shows every seed found too
    assert _row(table, "t/rounds")[4].endswith("(n=3)")
    assert "in the 3 runs made of 1 configs" in text
    # again: every seed is reused, nothing runs
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("  reuse   ") == 3 and "  run     " not in out


def test_collect_counts_the_seeds_found_and_keeps_gone_cells_with_their_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    assert _row(table, "t/acc")[4].endswith("(n=2)")
    both = _row(table, "t/acc")[4]
    shutil.rmtree(tmp_path / "runs" / "toy" / "seed-1")
    assert main([*args, "--collect"]) == 0
    row = _row(table, "t/acc")  # seed 1's value is kept from the table, beside seed 0's run
    assert row[4] == both and "seed 1 kept from the previous table" in row[6]
    # written to a new table (nothing to keep), the cell is seed 0's run alone
    assert main([*args[:-1], "out/fresh.md", "--collect"]) == 0
    row = _row(tmp_path / "out" / "fresh.md", "t/acc")
    assert "±" not in row[4] and re.fullmatch(r"[\d.]+", row[4]) and row[6].startswith("`runs/toy` (")
    seed0 = f"{_final_acc(tmp_path / 'runs' / 'toy'):.2f}"
    assert row[4] == seed0
    # seeds 0 and 1 again, then every run folder gone: the row and its per-seed values are kept
    assert main(args) == 0
    two = _row(table, "t/acc")
    notes = [x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:")]
    assert len(notes) == 1
    shutil.rmtree(tmp_path / "runs")
    assert main([*args, "--collect"]) == 0
    kept = _row(table, "t/acc")
    assert kept[4] == two[4] and "kept from the previous table" in kept[6]
    assert [x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:")] == notes
    compute = next(x for x in table.read_text().splitlines() if x.startswith("**Compute"))
    assert "in the 0 runs made of 1 configs" in compute and "Cells kept from the previous table add" in compute


def test_batch_seeds_layout_is_read_and_extended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    """Folders made by ``lowband run CONFIG --seeds 0,1`` (every seed in seed-<s>/)."""
    from lowband.cli import main
    from lowband.report import load_run

    papers = _paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = str(papers / "toy" / "dfedavg.toml")
    assert main(["run", cfg, "--seeds", "0,1", "--workers", "1", "--quiet"]) == 0
    assert not (tmp_path / "runs" / "toy" / "config.toml").exists()
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main([*args, "--collect"]) == 0
    assert _row(tmp_path / "out" / "toy_table.md", "t/acc")[4].endswith("(n=2)")
    capsys.readouterr()
    assert main([*args, "--seeds", "0-2"]) == 0
    out = capsys.readouterr().out
    assert "reuse   papers/toy/dfedavg.toml seed 0 -> runs/toy/seed-0" in out  # not a new run in runs/toy
    assert "run     papers/toy/dfedavg.toml seed 2 -> runs/toy/seed-2" in out
    assert not (tmp_path / "runs" / "toy" / "config.toml").exists()
    assert _row(tmp_path / "out" / "toy_table.md", "t/rounds")[4].endswith("(n=3)")
    rec = load_run(tmp_path / "runs" / "toy")
    assert len(rec.seeds) == 3


def test_compare_groups_a_run_folder_with_its_seed_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    """``lowband compare runs/<name>`` on the reproduce layout: mean ± std over the seeds."""
    from lowband.cli import main
    from lowband.report import load_run

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "toy", "--experiments", str(papers), "--out", "out"]) == 0
    rec = load_run(tmp_path / "runs" / "toy")
    assert [r.summary["seed"] for r in rec.seeds] == [0, 1]
    # a seed-<s> folder that repeats the run folder's own seed counts once
    shutil.copytree(tmp_path / "runs" / "toy", tmp_path / "runs" / "toy" / "seed-0",
                    ignore=shutil.ignore_patterns("seed-*"))
    assert len(load_run(tmp_path / "runs" / "toy").seeds) == 2
    capsys.readouterr()
    assert main(["compare", "runs/toy", "--out", "cmp"]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    accs = [_final_acc(tmp_path / "runs" / "toy"), _final_acc(tmp_path / "runs" / "toy" / "seed-1")]
    assert f"{statistics.mean(accs):.2f} ± {statistics.stdev(accs):.2f}" in table and "(2 seeds)" in table


def test_seed_folders_follow_the_configs_own_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lowband.reproduce import load_cells, run_plan, seed_overrides

    papers = _paper(tmp_path, seeds=[0, 1], seed=1)
    monkeypatch.chdir(tmp_path)
    cells = load_cells("toy", experiments=papers)
    assert run_plan(cells) == [(cells[0].config, 0), (cells[0].config, 1)]  # 1 and None: one folder
    assert seed_overrides(cells[0].config, [], 1) == []  # the config's own seed: its run folder
    assert seed_overrides(cells[0].config, ["rounds=1"], 0) == ["rounds=1", "seed=0", 'out_dir="runs/toy/seed-0"']


@pytest.mark.parametrize("seeds, error", [
    ("x", "seeds: "), ([0, 0], "a seed is repeated"), ([-1], "at least one seed >= 0"), (True, "list of seeds"),
    ([], "at least one seed"),
])
def test_bad_seeds_are_one_line_errors(tmp_path: Path, seeds: object, error: str) -> None:
    from lowband.reproduce import load_cells

    papers = _paper(tmp_path, seeds=seeds)
    with pytest.raises(ConfigError, match=re.escape(error)) as exc:
        load_cells("toy", experiments=papers)
    assert "\n" not in str(exc.value) and "t/acc" in str(exc.value)


def test_unknown_top_level_key_and_bad_cli_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    from lowband.cli import main
    from lowband.reproduce import load_cells

    papers = _paper(tmp_path)
    path = papers / "toy" / "reproduce.toml"
    path.write_text("seed = [0, 1]\n" + path.read_text())
    with pytest.raises(ConfigError, match="unknown top-level key"):
        load_cells("toy", experiments=papers)
    path.write_text("seeds = [0, 1]\n" + path.read_text().split("\n", 1)[1])
    assert all(c.seeds == [0, 1] for c in load_cells("toy", experiments=papers))
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "toy", "--experiments", str(papers), "--seeds", "2-1", "--dry-run"]) == 2
    assert "range 2-1 runs backwards" in capsys.readouterr().err
    assert main(["reproduce", "toy", "--experiments", str(papers), "--seeds", "0,3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run     papers/toy/dfedavg.toml seed 0 -> runs/toy (" in out
    assert "would run     papers/toy/dfedavg.toml seed 3 -> runs/toy/seed-3 (" in out
    assert not (tmp_path / "runs").exists()


def _timed(run: Path) -> tuple[float, int]:
    """(CPU seconds, rounds) that ``run``'s timing.jsonl logs (its measured ``cpu_s``)."""
    timing = RunLog.read_jsonl(run / "timing.jsonl")
    return sum(t["cpu_s"] for t in timing), len(timing)


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of everything under ``root``, folders included."""
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def test_dry_run_says_what_each_run_would_do_and_what_it_costs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``--dry-run`` says, per seed run: ``reuse`` a complete run, ``resume`` a partial one
    (rounds done/planned, CPU-hours left timed on its own rounds), ``restart`` one killed
    before its first checkpoint (every round again), ``run`` a missing seed (timed on the
    other seeds of its config), ``skip`` a folder made under another default (not timed on);
    then the count of each and the total. It writes nothing, and a real run then does what
    it said."""
    import json

    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1, 2, 3, 4, 5], rounds=4)
    monkeypatch.chdir(tmp_path)
    cfg = str(papers / "toy" / "dfedavg.toml")
    assert main(["run", cfg, "--quiet"]) == 0  # seed 0: complete
    for s, rounds in ((1, 2), (3, 2), (4, 1), (5, 4)):  # seed 2: never run
        assert main(["run", cfg, f"seed={s}", f"out_dir=runs/toy/seed-{s}", f"rounds={rounds}", "--quiet"]) == 0
    root = tmp_path / "runs" / "toy"
    for name in ("checkpoint.pt", "summary.json"):  # seed 3: killed before its first checkpoint
        (root / "seed-3" / name).unlink()
    for s in (4, 5):  # made under another default: seed 4 partly, seed 5 to the end
        hp = root / f"seed-{s}" / "hyperparams.json"
        saved = json.loads(hp.read_text())
        saved["lr"] *= 2
        hp.write_text(json.dumps(saved))
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    before = _files(tmp_path)
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert _files(tmp_path) == before  # a dry run writes nothing
    line = {s: next(x for x in out if f"/dfedavg.toml seed {s} -> " in x) for s in range(6)}
    hours = {}

    def cost(s: int, pattern: str) -> float:
        m = re.fullmatch(r"  would " + pattern + r"about (\S+) CPU-h left(, timed on seeds 0, 1, 3)?\)", line[s])
        assert m, line[s]
        hours[s] = float(m.group(1))
        return hours[s]

    assert line[0] == "  would reuse   papers/toy/dfedavg.toml seed 0 -> runs/toy (4/4 rounds)"
    seconds, rounds = _timed(root / "seed-1")  # threads = 1: CPU-seconds
    left = cost(1, r"resume  papers/toy/dfedavg\.toml seed 1 -> runs/toy/seed-1 \(2/4 rounds; ")
    assert left > 0 and left == pytest.approx(2 * seconds / rounds / 3600, rel=0.06)
    seconds, rounds = _timed(root / "seed-3")
    left = cost(3, r"restart papers/toy/dfedavg\.toml seed 3 -> runs/toy/seed-3 \(2/4 rounds, none checkpointed: "
                   r"from round 0; ")
    assert left > 0 and left == pytest.approx(4 * seconds / rounds / 3600, rel=0.06)
    timed = [_timed(root / f) for f in ("", "seed-1", "seed-3")]  # not seed 4: another config's
    left = cost(2, r"run     papers/toy/dfedavg\.toml seed 2 -> runs/toy/seed-2 \(4 rounds; ")
    assert "timed on seeds 0, 1, 3" in line[2]
    assert left > 0 and left == pytest.approx(4 * sum(t[0] for t in timed) / sum(t[1] for t in timed) / 3600, rel=0.06)
    assert line[4].startswith("  would skip    papers/toy/dfedavg.toml seed 4 -> runs/toy/seed-4: --resume: ")
    assert "algorithm.lr" in line[4]
    # a finished run of another config is not reused as this one's (the table would leave it out)
    assert line[5].startswith("  would skip    papers/toy/dfedavg.toml seed 5 -> runs/toy/seed-5: ")
    assert "holds a finished run of another config" in line[5] and "algorithm.lr" in line[5]
    m = re.fullmatch(r"in all: run 1, resume 1, restart 1, reuse 1, keep 0, skip 2: about (\S+) CPU-h still needed by the 3 "
                     r"runs with an estimate", out[-1])
    assert m, out[-1]
    assert float(m.group(1)) == pytest.approx(sum(hours.values()), rel=0.06)
    # a real run does what the dry run said
    assert main(args) == 0
    real = capsys.readouterr()
    for s, action in ((0, "reuse"), (1, "resume"), (2, "run"), (3, "restart")):
        assert f"  {action:<7} papers/toy/dfedavg.toml seed {s} -> " in real.out, (s, action)
    assert "  skip    papers/toy/dfedavg.toml seed 4: --resume: " in real.err
    assert "  skip    papers/toy/dfedavg.toml seed 5: " in real.err
    assert "seed 4 -> " not in real.out and "seed 5 -> " not in real.out  # refused before it said it would run
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "in all: run 0, resume 0, restart 0, reuse 4, keep 0, skip 2: about 0 CPU-h still needed by the 0 runs " \
                      "with an estimate"


def test_a_dry_run_times_a_run_only_on_runs_made_on_its_kind_of_device(tmp_path: Path) -> None:
    """A run on a GPU is estimated in GPU-hours from GPU runs; a CPU run is not timed on a
    GPU's rounds (nor a GPU run on a core's): it says so instead of guessing."""
    from lowband.config import validate
    from lowband.reproduce import Planned, RunData, dry_run_line, estimate

    cpu = validate(digits_config(tmp_path, "dfedavg", rounds=10))
    gpu = validate({**digits_config(tmp_path, "dfedavg", rounds=10), "device": "cuda"})
    timing = [{"round": r, "round_s": 1800.0, "eval_s": 0.0} for r in (1, 2)]
    on_gpu = {1: RunData(Path("r/seed-1"), [{"round": 2}], timing, 10, None, "x", 4, 1, "cuda")}
    est = estimate(Planned("run", gpu, Path("r/seed-2")), on_gpu)
    assert (est.hours, est.gpu, est.note) == (5.0, True, "timed on seed 1")  # 10 rounds of half an hour
    assert dry_run_line(Planned("run", gpu, Path("r/seed-2")), "c seed 2", est) == \
        "  would run     c seed 2 -> r/seed-2 (10 rounds; about 5 GPU-h left, timed on seed 1)"
    est = estimate(Planned("run", cpu, Path("r/seed-2")), on_gpu)
    assert est.hours is None and est.note == "this config has run here only on a GPU"
    on_cpu = {1: RunData(Path("r/seed-1"), [{"round": 2}], timing, 10, None, "x", 4, 1)}
    est = estimate(Planned("resume", cpu, Path("r/seed-1"), done=2), on_cpu)
    assert (est.hours, est.gpu, est.note) == (16.0, False, "")  # 8 rounds x 0.5 h x 4 threads
    assert estimate(Planned("run", cpu, Path("r/seed-2")), {}).note == "nothing of this config has run here"


HEADLINE = {
    "fedcspack": r"table1/(fmnist|cifar10)/dir[\d.]+/(fedavg|fedcspack)",
    "spark": r"table1/[^/]+/(spark|ntk_dfl)",
    "kta": r"simplecnn/(kta|local)",
    "fol": r"table3/c9/(fol|fedavg)/E\d",
}


def test_shipped_headline_cells_ask_for_three_seeds() -> None:
    from lowband.reproduce import load_cells, packaged_experiments

    shipped = packaged_experiments()
    assert shipped is not None
    for paper, pattern in HEADLINE.items():
        cells = load_cells(paper, experiments=shipped)
        heads = [c for c in cells if re.fullmatch(pattern, c.id)]
        assert len(heads) >= 2, paper
        assert all(c.seeds == [0, 1, 2] for c in heads), paper
        assert all(c.seeds is None for c in cells if not re.fullmatch(pattern, c.id)), paper


def test_every_shipped_config_is_in_the_wheels_package_data() -> None:
    """An installed lowband has only what pyproject's package-data globs ship: every config
    a shipped reproduce.toml names must match one (a deeper folder would be left out)."""
    from fnmatch import fnmatchcase

    from lowband.reproduce import load_cells, packaged_experiments

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lowband"]
    shipped = packaged_experiments()
    assert shipped is not None
    for paper in ("spark", "fedcspack", "fol", "kta"):
        names = {f"{paper}/reproduce.toml"}
        for c in load_cells(paper, experiments=shipped):
            names |= {str(Path(p).resolve().relative_to(shipped.resolve())) for p in (c.config, c.reference) if p}
        for name in names:
            parts = ("experiments/" + name).split("/")
            assert any(len(g.split("/")) == len(parts) and all(fnmatchcase(a, b) for a, b in zip(parts, g.split("/")))
                       for g in globs), f"{paper}: {name} is not shipped by {globs}"


def test_seeds_value_counts_the_seeds_with_a_number() -> None:
    from lowband.reproduce import Cell, RunData, seeds_value

    def run(seed: int, accs: list[float]) -> RunData:
        metrics = [{"round": r, "consensus/acc": a} for r, a in enumerate(accs)]
        return RunData(Path(f"runs/x/seed-{seed}"), metrics, [], 3, 0.8, "consensus/acc", 1, seed)

    runs = {0: run(0, [0.1, 0.85, 0.9, 0.9]), 1: run(1, [0.1, 0.5, 0.82, 0.9]), 2: run(2, [0.1, 0.2, 0.3, 0.4])}
    ours, per = seeds_value(Cell("c", "t", "cfg", "rounds_to_target"), runs, {})
    assert ours == "1.5 ± 0.7 (n=2 of 3)" and per == ["0: 1", "1: 2", "2: > 3"]
    ours, per = seeds_value(Cell("c", "t", "cfg", "consensus/acc", round=5), runs, {})
    assert ours == "" and per == ["0: -", "1: -", "2: -"]  # round 5 not reached: no number
    ours, _ = seeds_value(Cell("c", "t", "cfg", "consensus/acc", round=1), runs, {})
    assert ours == f"{statistics.mean([85, 50, 20]):.2f} ± {statistics.stdev([85, 50, 20]):.2f} (n=3)"
    ours, _ = seeds_value(Cell("c", "t", "cfg", "consensus/acc"), {2: runs[2]}, {})
    assert ours == "40.00"  # one seed: the value alone, as before seeds existed


def test_a_cell_whose_run_unlearned_says_so_and_keeps_its_final_value() -> None:
    """The table's value is the one at the cell's round; a run that fell from what it
    reached (the run-time warning's rule) adds its best and where, so 48.01 is not read as
    all SPARK reached. A run that swings and recovers, or that reached its best last, adds
    nothing."""
    from test_decay_watch import CODE_PAT, SPARK_A01

    from lowband.reproduce import Cell, RunData, seeds_value, value

    def run(values: list[float], seed: int = 0) -> RunData:
        metrics = [{"round": i + 1, "consensus/acc": v} for i, v in enumerate(values)]
        return RunData(Path(f"runs/x/seed-{seed}"), metrics, [], len(values), None, "consensus/acc", 1, seed)

    cell = Cell("c", "t", "cfg", "consensus/acc")
    v, text = value(cell, run(SPARK_A01), None)
    assert v == pytest.approx(48.01) and text == "48.01 (unlearned: best 77.76 at r13)"
    # at round 15 it had not yet fallen
    assert value(Cell("c", "t", "cfg", "consensus/acc", round=15), run(SPARK_A01), None)[1] == "77.59"
    assert "unlearned" not in value(cell, run(CODE_PAT), None)[1]
    assert "unlearned" not in value(cell, run(sorted(SPARK_A01)), None)[1]
    # a loss has no best to fall from
    loss = [{"round": i + 1, "consensus/loss": 1 - v} for i, v in enumerate(SPARK_A01)]
    d = RunData(Path("runs/x"), loss, [], 30, None, "consensus/loss", 1, 0)
    assert "unlearned" not in value(Cell("c", "t", "cfg", "consensus/loss"), d, None)[1]
    # over seeds: the mean, and how many of them unlearned
    ours, per = seeds_value(cell, {0: run(SPARK_A01), 1: run(sorted(SPARK_A01), 1)}, {})
    assert ours.endswith("(n=2) (1 of 2 unlearned)") and "unlearned" in per[0] and "unlearned" not in per[1]


def test_a_final_cell_pools_only_the_seeds_that_got_furthest() -> None:
    """A seed still under way (round 0 of 30) must not enter a final-value mean: the mean
    of round 30 and round 0 is neither. It shows as behind and the cell as n=k of N."""
    from lowband.reproduce import Cell, RunData, seeds_value

    def run(seed: int, accs: list[float]) -> RunData:
        metrics = [{"round": r, "consensus/acc": a} for r, a in enumerate(accs)]
        return RunData(Path(f"runs/x/seed-{seed}"), metrics, [], len(accs) - 1, 0.8, "consensus/acc", 1, seed)

    runs = {0: run(0, [0.1, 0.7, 0.79]), 1: run(1, [0.1]), 2: run(2, [0.1, 0.6])}
    ours, per = seeds_value(Cell("c", "t", "cfg", "consensus/acc"), runs, {})
    assert ours == "79.00 (n=1 of 3)"
    assert per[1] == "1: behind (round 0 of 2)" and per[2] == "2: behind (round 1 of 2)"
    ours, _ = seeds_value(Cell("c", "t", "cfg", "rounds_to_target"), runs, {})
    assert ours == "> 2"  # not "> 2; > 0; > 1"
    # a cell at a fixed round still pools every seed that reached it
    ours, _ = seeds_value(Cell("c", "t", "cfg", "consensus/acc", round=1), runs, {})
    assert ours.endswith("(n=2 of 3)")


def test_a_seed_run_on_a_gpu_counts_as_gpu_hours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed made on a GPU (``device`` saved in its config.toml; a resume may change it, so
    it is the same config) enters the mean like any seed, but its time is GPU-hours: the
    *run* column and the compute line say so, and the CPU-hours leave it out."""
    from lowband.cli import main
    from lowband.reproduce import RunData

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy_table.md"
    cpu_before = float(re.search(r"\*\*Compute: ([\d.e+-]+) CPU-hours", table.read_text()).group(1))
    saved = tmp_path / "runs" / "toy" / "seed-1" / "config.toml"
    saved.write_text(saved.read_text().replace('device = "cpu"', 'device = "cuda"'))
    assert 'device = "cuda"' in saved.read_text()
    assert main(args + ["--collect"]) == 0
    text = table.read_text()
    row = _row(table, "t/acc")
    assert row[4].endswith("(n=2)") and "GPU-h for 1 run on a GPU)" in row[6], row
    m = re.search(r"\*\*Compute: ([\d.e+-]+) CPU-hours\*\*.*1 runs on a GPU \(cuda\) add ([\d.e+-]+) GPU-hours", text)
    assert m, text.splitlines()[2]
    assert float(m.group(1)) < cpu_before and float(m.group(2)) > 0
    d = RunData(Path("r"), [{"round": 1}], [{"round_s": 3600.0}], 1, None, "x", 4, 0, "cuda")
    assert (d.cpu_hours, d.gpu_hours) == (0.0, 1.0)
    assert RunData(Path("r"), [{"round": 1}], [{"round_s": 3600.0}], 1, None, "x", 4, 0).cpu_hours == 4.0


def test_a_run_at_round_0_measures_nothing_yet() -> None:
    """A run that has just started holds only its initial model's evaluation: a one-seed
    cell shows "not measured yet", not the round-0 accuracy (a FedPAC run 10 s in showed
    "9.20 | 0/100"), and its bytes-based cells no number either."""
    from lowband.reproduce import Cell, RunData, seeds_value, value

    d = RunData(Path("runs/x"), [{"round": 0, "personal/acc": 0.092, "bytes/total": 0}], [], 100, 0.8,
                "personal/acc", 1, 0)
    for metric in ("personal/acc", "rounds_to_target", "bytes_per_round", "comm_reduction"):
        assert value(Cell("c", "t", "cfg", metric), d, d) == (None, "not measured yet (round 0 of 100)")
    assert seeds_value(Cell("c", "t", "cfg", "personal/acc"), {0: d}, {})[0] == "not measured yet (round 0 of 100)"
    one = RunData(Path("runs/x"), [*d.metrics, {"round": 1, "personal/acc": 0.31}], [], 100, 0.8, "personal/acc", 1, 0)
    assert value(Cell("c", "t", "cfg", "personal/acc"), one, None) == (pytest.approx(31.0), "31.00")


def test_collect_keeps_a_gone_seed_beside_the_seeds_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 0's folder lost (a new machine), seeds 1 and 2 rerun: the cell is still the
    mean over all three, seed 0's value taken from the previous table and said to be kept;
    without this the mean silently became one over the two new seeds."""
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1, 2])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    full = _row(table, "t/acc")
    assert full[4].endswith("(n=3)")
    dirs = {s: tmp_path / "runs" / "toy" / (f"seed-{s}" if s else "") for s in (0, 1, 2)}
    accs = {s: _final_acc(d) for s, d in dirs.items()}
    hours = {s: _timed(d)[0] / 3600 for s, d in dirs.items()}
    note = next(x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:"))
    assert note == "- `t/acc`: " + ", ".join(f"{s}: {a:.2f} ({hours[s]:.3g} CPU-h)" for s, a in accs.items())
    # seed 0's folder (runs/toy itself) gone, seeds 1 and 2 kept
    for f in (tmp_path / "runs" / "toy").iterdir():
        if not f.name.startswith("seed-"):
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    assert main([*args, "--collect"]) == 0
    row = _row(table, "t/acc")
    assert row[4] == full[4]  # the same mean ± std over the same three values
    assert "seeds 0, 1, 2" in row[6] and "seed 0 kept from the previous table" in row[6]
    assert row[6].endswith(f"(seed 0 kept from the previous table: run folder not found; {hours[0]:.3g} CPU-h) |"[:-2])
    assert next(x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:")) == note

    def kept_compute() -> float:
        line = next(x for x in table.read_text().splitlines() if x.startswith("**Compute"))
        return float(re.search(r"Cells kept from the previous table add ([0-9.e+-]+) CPU-hours", line).group(1))

    # the header adds seed 0's compute alone (seeds 1 and 2 are counted as runs made), and
    # again after another collect: it used to add the whole cell's, and drift each time
    assert kept_compute() == pytest.approx(float(f"{hours[0]:.3g}"))
    assert main([*args, "--collect"]) == 0
    assert _row(table, "t/acc")[4] == full[4]
    assert kept_compute() == pytest.approx(float(f"{hours[0]:.3g}"))
    assert next(x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:")) == note
    # a table from before per-seed compute with it in one cell's list only: the config's other
    # cells take it from there
    text = table.read_text()
    rounds_note = next(x for x in text.splitlines() if x.startswith("- `t/rounds`:"))
    table.write_text(text.replace(rounds_note, re.sub(r" \([0-9.e-]+ CPU-h\)", "", rounds_note)))
    assert main([*args, "--collect"]) == 0
    assert _row(table, "t/rounds")[6].endswith(f"not found; {hours[0]:.3g} CPU-h)")
    # every folder gone: the cell is kept whole, its compute the two runs' plus the held seed's
    shutil.rmtree(tmp_path / "runs")
    assert main([*args, "--collect"]) == 0
    assert kept_compute() == pytest.approx(float(f"{hours[1] + hours[2]:.3g}") + float(f"{hours[0]:.3g}"), rel=0.01)
    # a seed that was behind is not kept as a value
    from lowband.reproduce import kept_seeds
    kept = kept_seeds("0: 79.43, 1: behind (round 0 of 30), 2: > 30, 3: 1,234.50", "0-30/30", {2})
    assert sorted(kept) == [0, 3] and kept[0].value == 79.43 and kept[0].rounds == 30
    assert kept[3].value == 1234.5
    assert kept_seeds("0: > 30, 1: -", "30/30", set())[0].value is None and 1 not in kept_seeds("1: -", "3/3", set())
    # a seed's compute suffix is not part of its value; a GPU run's hours are not CPU-hours
    kept = kept_seeds("0: 82.50 (0.1 GPU-h), 1: > 30 (0.5 CPU-h)", "30/30", set())
    assert (kept[0].text, kept[0].value, kept[0].cpu_hours, kept[0].spent) == ("82.50", 82.5, None, " (0.1 GPU-h)")
    assert (kept[1].text, kept[1].value, kept[1].cpu_hours) == ("> 30", None, 0.5)


def test_collect_keeps_a_single_seed_cell_beside_new_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell measured with the config's seed alone (no per-seed list in its table), its
    folder lost, then seeds 1 and 2 run: the cell pools all three."""
    from lowband.cli import main

    papers = _paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    one = _row(table, "t/acc")[4]
    assert re.fullmatch(r"[\d.]+", one)
    shutil.rmtree(tmp_path / "runs")
    assert main([*args, "--collect"]) == 0  # kept whole
    kept_row = _row(table, "t/acc")
    cfg = str(papers / "toy" / "dfedavg.toml")
    for s in (1, 2):
        assert main(["run", cfg, f"seed={s}", f"out_dir=runs/toy/seed-{s}", "--quiet"]) == 0
    assert main([*args, "--collect"]) == 0
    row = _row(table, "t/acc")
    assert row[4].endswith("(n=3)") and "seed 0 kept from the previous table" in row[6]
    note = next(x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:"))
    # seed 0 keeps the compute its one-seed cell recorded
    spent = re.search(r"\(([0-9.e-]+) CPU-h\)", kept_row[6]).group(1)
    assert note.startswith(f"- `t/acc`: 0: {one} ({spent} CPU-h), 1: ")
    assert row[6].endswith(f"run folder not found; {spent} CPU-h)")
    nums = [float(x.split(": ")[1].split(" (")[0]) for x in note.split("`: ")[1].split(", ")]
    assert row[4].startswith(f"{statistics.mean(nums):.2f} ± {statistics.stdev(nums):.2f}")
    from lowband.reproduce import kept_seeds
    assert kept_seeds("0: n/a (reference not run)", "3/3", set()) == {}


def test_a_run_whose_values_the_table_keeps_is_not_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Run folders gone (a new machine) while the table at --out keeps their values: the same
    command again used to make every such run anew, spending its hours on cells that have
    their number before reaching the empty ones. Now it *keeps* them (dry run and real run
    alike) and times what it still runs on the table's record; ``--remake-kept`` makes them
    again, and a cell added since (nothing of it in the table) has its run made."""
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    before = _row(table, "t/acc")
    shutil.rmtree(tmp_path / "runs" / "toy" / "seed-1")  # seed 1 gone, seed 0 on disk
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(x.startswith("  would keep    papers/toy/dfedavg.toml seed 1 -> runs/toy/seed-1: the table holds "
                            "its values at round 2") for x in out), out
    assert "reuse 1, keep 1, skip 0: about 0 CPU-h" in out[-1]
    assert main(args) == 0
    assert "  keep    papers/toy/dfedavg.toml seed 1: " in capsys.readouterr().out
    assert not (tmp_path / "runs" / "toy" / "seed-1").exists()  # not made again
    assert _row(table, "t/acc")[4] == before[4] and "seed 1 kept from the previous table" in _row(table, "t/acc")[6]
    # every folder gone and a longer config: the values are from fewer rounds than asked, so
    # the runs are made, timed on what the table recorded (2 rounds' hours, 4 rounds to go)
    shutil.rmtree(tmp_path / "runs")
    note = next(x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:"))
    hours = [float(h) for h in re.findall(r"\(([0-9.e-]+) CPU-h\)", note)]
    assert main([*args, "--rounds", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if "seed 0 -> runs/toy (" in x)
    m = re.search(r"\(4 rounds; about (\S+) CPU-h left, timed on the table's record of seeds 0, 1\)", line)
    assert m, line
    assert float(m.group(1)) == pytest.approx(float(f"{4 * sum(hours) / 4:.2g}"), rel=0.01)
    # --remake-kept runs them again
    assert main([*args, "--remake-kept", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "run 2, resume 0, restart 0, reuse 0, keep 0" in out[-1]
    # a cell added since: nothing of it in the table, so its config's runs are made
    exp = papers / "toy" / "reproduce.toml"
    spec = tomllib.loads(exp.read_text())
    spec["run"].append({"id": "t/loss", "table": "t", "config": "dfedavg.toml", "metric": "consensus/loss"})
    exp.write_text(tomli_w.dumps(spec))
    assert main([*args, "--dry-run"]) == 0
    assert "run 2, resume 0, restart 0, reuse 0, keep 0" in capsys.readouterr().out.splitlines()[-1]


def test_a_value_kept_after_its_config_changed_is_neither_kept_nor_a_reason_not_to_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The table records each run folder's config fingerprint. A config edited after its
    folder was removed (same name, so the same folder) used to keep the old config's value
    in the table, and the run would not be made again: now the cell empties with a
    warning and the run is planned. A table from before fingerprints keeps its values."""
    from lowband.cli import main

    papers = _paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    assert table.read_text().rstrip().splitlines()[-1].startswith('<!-- lowband config fingerprints: {"runs/toy": "')
    shutil.rmtree(tmp_path / "runs")
    assert main([*args, "--collect"]) == 0  # same config: kept, fingerprint carried along
    assert "kept from the previous table" in _row(table, "t/acc")[6]
    assert '{"runs/toy": "' in table.read_text()
    cfg = papers / "toy" / "dfedavg.toml"
    spec = tomllib.loads(cfg.read_text())
    spec["algorithm"]["lr"] = 2 * spec["algorithm"].get("lr", 0.05)
    legacy = table.read_text()
    cfg.write_text(tomli_w.dumps(spec))
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    assert "in all: run 1, resume 0, restart 0, reuse 0, keep 0" in capsys.readouterr().out
    assert main([*args, "--collect"]) == 0
    err = capsys.readouterr().err
    assert "t/acc: the previous table's value was measured under another version of" in err
    assert _row(table, "t/acc")[4] == "" and "config changed since" in _row(table, "t/acc")[6]
    # a table without fingerprints (written before them): its values are kept as before
    table.write_text("\n".join(x for x in legacy.splitlines() if "fingerprints" not in x) + "\n")
    assert main([*args, "--collect"]) == 0
    assert "kept from the previous table" in _row(table, "t/acc")[6]
    assert "fingerprints" not in table.read_text()  # not passed off as today's config


def test_a_reference_run_is_kept_only_while_the_cells_that_use_it_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config other cells divide by (``reference``) must be made again when one of those
    cells' own configs is measured again (a run on disk, or one to make): keeping the
    reference would leave that cell "n/a". Its own seed serves every seed of theirs, so it
    is all or nothing; a reference that is itself another cell's config passes it on."""
    from lowband.reproduce import Cell, Recorded, kept_runs, plan

    rec = Recorded(30, 30, 1.0)
    table = {"ref.toml": {0: rec, 1: rec}, "a.toml": {0: rec}, "b.toml": {0: rec, 1: rec}, "c.toml": {0: rec}}
    again = {"a.toml"}
    monkeypatch.setattr(plan, "recorded_runs", lambda previous, cells, cfg, overrides: table[cfg])
    monkeypatch.setattr(plan, "_measured_again", lambda cells, cfg, kept, overrides: cfg in again or not kept)
    cells = [Cell("r", "t", "ref.toml", "consensus/acc"), Cell("a", "t", "a.toml", "comm_reduction", reference="ref.toml"),
             Cell("b", "t", "b.toml", "consensus/acc")]
    out = kept_runs({}, cells, ["ref.toml", "a.toml", "b.toml"], [])
    assert out["ref.toml"] == {} and sorted(out["b.toml"]) == [0, 1]  # a.toml measured again: ref.toml made
    again.clear()
    assert sorted(kept_runs({}, cells, ["ref.toml", "a.toml", "b.toml"], [])["ref.toml"]) == [0, 1]
    # ref.toml <- a.toml <- c.toml: c.toml measured again makes a.toml, so ref.toml too
    cells = [*cells, Cell("c", "t", "c.toml", "comm_reduction", reference="a.toml")]
    again.add("c.toml")
    out = kept_runs({}, cells, ["ref.toml", "a.toml", "b.toml", "c.toml"], [])
    assert out["a.toml"] == {} and out["ref.toml"] == {}

def _ref_paper(root: Path, seeds: object = None) -> Path:
    """A paper ``toy`` whose cell ``t/cr`` divides base.toml's bytes by ref.toml's
    (``reference``), while ref.toml has a cell of its own (``t/ref``)."""
    exp = root / "papers" / "toy"
    exp.mkdir(parents=True)
    for name in ("base", "ref"):
        cfg = digits_config(root, "dfedavg", rounds=2)
        cfg.update(seed=0, out_dir=f"runs/{name}")
        cfg["eval"] = {"protocols": ["consensus"], "main": "consensus/acc"}
        (exp / f"{name}.toml").write_text(tomli_w.dumps(cfg))
    cr = {"id": "t/cr", "table": "t", "config": "base.toml", "metric": "comm_reduction", "reference": "ref.toml"}
    if seeds is not None:
        cr["seeds"] = seeds
    runs = [{"id": "t/ref", "table": "t", "config": "ref.toml", "metric": "consensus/acc"}, cr]
    (exp / "reproduce.toml").write_text(tomli_w.dumps({"paper": "toy", "run": runs}))
    return root / "papers"


def test_a_reference_is_made_again_when_a_cell_that_uses_it_reads_a_run_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The reference's folder gone while the referring cell's run is still on disk: the
    table measures that cell again from the run, which needs the reference. Keeping the
    reference (its own cell has its value in the table) turned the cell into "n/a
    (reference not run)"."""
    from lowband.cli import main

    papers = _ref_paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    before = _row(table, "t/cr")[4]
    assert re.fullmatch(r"-?[\d.]+", before), before
    shutil.rmtree(tmp_path / "runs" / "ref")
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run     papers/toy/ref.toml -> runs/ref" in out, out
    assert main(args) == 0
    assert _row(table, "t/cr")[4] == before
    # the reference (its own seed) serves every seed of base.toml: a seed added since is made,
    # so the reference is needed even though base's seed 0 keeps its value
    shutil.rmtree(tmp_path / "runs")
    spec = tomllib.loads((papers / "toy" / "reproduce.toml").read_text())
    spec["run"][1]["seeds"] = [0, 1]
    (papers / "toy" / "reproduce.toml").write_text(tomli_w.dumps(spec))
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would keep    papers/toy/base.toml seed 0" in out and "would run     papers/toy/base.toml seed 1" in out
    assert "would run     papers/toy/ref.toml -> runs/ref" in out, out
    # every value in the table and no run of base.toml on disk: nothing is measured again
    assert main(args) == 0
    shutil.rmtree(tmp_path / "runs")
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    assert "run 0, resume 0, restart 0, reuse 0, keep 3" in capsys.readouterr().out.splitlines()[-1]


def test_a_run_the_table_holds_at_more_rounds_than_asked_is_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``--rounds 1`` against a table measured at 2 rounds: the kept values are not the
    values of the runs asked (a run on disk is read at round 1), so the gone seed is made.
    Kept, it showed its round-2 value beside seed 0 read at round 1, which then counted as
    "behind": the cell was seed 1's round-2 value alone."""
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    shutil.rmtree(tmp_path / "runs" / "toy" / "seed-1")
    capsys.readouterr()
    assert main([*args, "--rounds", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run     papers/toy/dfedavg.toml seed 1 -> runs/toy/seed-1" in out, out
    assert main([*args, "--rounds", "1"]) == 0
    row = _row(tmp_path / "out" / "toy.md", "t/acc")
    assert row[4].endswith("(n=2)") and row[5] == "1/1" and "kept" not in row[6], row


def test_a_one_seed_run_made_on_a_gpu_is_not_kept_as_zero_cpu_hours(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A one-seed cell whose run was made on a GPU records "0 CPU-h; X GPU-h": its folder
    gone, the seed's compute is its GPU-hours, not 0 CPU-h. Read as 0 CPU-h, a dry run timed
    a CPU run of the config at 0 CPU-h, and a table keeping the seed beside new seeds said
    its compute was 0 CPU-hours."""
    from lowband.cli import main

    papers = _paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    saved = tmp_path / "runs" / "toy" / "config.toml"
    saved.write_text(saved.read_text().replace('device = "cpu"', 'device = "cuda"'))
    assert main([*args, "--collect"]) == 0
    table = tmp_path / "out" / "toy.md"
    assert "GPU-h for 1 run on a GPU" in _row(table, "t/acc")[6]
    gpu = re.search(r"; ([0-9.e-]+) GPU-h for 1 run", _row(table, "t/acc")[6]).group(1)
    shutil.rmtree(tmp_path / "runs")
    capsys.readouterr()
    assert main([*args, "--rounds", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "timed on the table's record" not in out and "nothing of this config has run here" in out, out
    cfg = str(papers / "toy" / "dfedavg.toml")
    assert main(["run", cfg, "seed=1", "out_dir=runs/toy/seed-1", "--quiet"]) == 0
    assert main([*args, "--collect"]) == 0
    row = _row(table, "t/acc")
    assert "seed 0 kept from the previous table" in row[6] and not row[6].endswith("; 0 CPU-h)"), row
    note = next(x for x in table.read_text().splitlines() if x.startswith("- `t/acc`:"))
    assert note.split(", 1: ")[0].endswith(f" ({gpu} GPU-h)"), note


def test_a_seed_kept_by_a_table_from_before_per_seed_compute_counts_as_not_recorded() -> None:
    """A kept cell written before per-seed compute says "(seed 0 kept from the previous
    table: run folder not found)" with no hours: the header must count that seed's compute
    as not recorded, not leave it out as if the cell's CPU-h were all its runs'."""
    from lowband.reproduce import compute_line

    where = "`runs/toy` seeds 0, 1 (0.5 CPU-h) (seed 0 kept from the previous table: run folder not found)"
    line = compute_line([], 1, {"t/acc": where, "t/acc#kept-seeds": where})
    assert "add 0.5 CPU-hours (recorded for 1 runs); 1 of their runs have no recorded compute." in line, line
    # some of the kept seeds with hours, some without: the ones without still count as missing
    where = ("`runs/toy` seeds 0, 1, 2 (0.5 CPU-h) (seed 0, 1 kept from the previous table: run folder not found; "
             "0.2 CPU-h, 1 not recorded)")
    line = compute_line([], 1, {"t/acc": where, "t/acc#kept-seeds": where})
    assert "add 0.7 CPU-hours" in line and "; 1 of their runs have no recorded compute." in line, line
    where = "`runs/toy` seeds 0, 1, 2 (0.5 CPU-h) (seed 0, 1 kept from the previous table: run folder not found)"
    assert "; 2 of their runs have no recorded compute." in compute_line([], 1, {"t/acc": where})


def test_a_gone_seed_measured_under_another_config_is_dropped_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Seed 0's value in the table is of the config before an edit, seed 1 is on disk, run
    with today's: seed 0 is not pooled with it, and the table's losing it is said (it was
    dropped silently, the cell going from n=2 to one seed with no word why)."""
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    cfg = papers / "toy" / "dfedavg.toml"
    spec = tomllib.loads(cfg.read_text())
    spec["algorithm"]["lr"] = 2 * spec["algorithm"].get("lr", 0.05)
    cfg.write_text(tomli_w.dumps(spec))
    shutil.rmtree(tmp_path / "runs")
    assert main(["run", str(cfg), "seed=1", "out_dir=runs/toy/seed-1", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*args, "--collect"]) == 0
    err = capsys.readouterr().err
    row = _row(tmp_path / "out" / "toy.md", "t/acc")
    assert "±" not in row[4] and "kept" not in row[6], row
    assert "t/acc: the previous table's value of seed 0 was measured under another version of" in err, err


def test_collect_at_fewer_rounds_does_not_keep_values_of_more_rounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``--collect --rounds 1`` beside a table measured at 2 rounds, seed 1's folder gone:
    seed 1's round-2 value must not be kept (it stood alone as the cell, seed 0 read at
    round 1 counting as "behind"); a cell read at a fixed round within the rounds asked
    would be the same value and is kept."""
    from lowband.cli import main

    papers = _paper(tmp_path, seeds=[0, 1])
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    seed0_r1 = 100 * RunLog.read_jsonl(tmp_path / "runs" / "toy" / "metrics.jsonl")[1]["consensus/acc"]
    shutil.rmtree(tmp_path / "runs" / "toy" / "seed-1")
    capsys.readouterr()
    assert main([*args, "--collect", "--rounds", "1"]) == 0
    err = capsys.readouterr().err
    row = _row(tmp_path / "out" / "toy.md", "t/acc")
    assert row[4] == f"{seed0_r1:.2f}" and row[5] == "1/1" and "kept" not in row[6], row
    assert "seed 1 is from round 2, past the 1 rounds asked; not kept" in err, err
    # every folder gone: the whole cell's round-2 value is not kept at --rounds 1 either
    main([*args, "--collect"])  # back to a 2-round table (seed 1 kept)
    shutil.rmtree(tmp_path / "runs")
    capsys.readouterr()
    assert main([*args, "--collect", "--rounds", "1"]) == 0
    row = _row(tmp_path / "out" / "toy.md", "t/acc")
    assert row[4] == "" and "of more rounds than 1" in row[6], row
    from lowband.reproduce.cells import Cell
    from lowband.reproduce.table import _past_asked
    assert not _past_asked(Cell("c", "t", "cfg", "consensus/acc", round=1), 2, 1)
    assert _past_asked(Cell("c", "t", "cfg", "consensus/acc"), 2, 1)
    assert not _past_asked(Cell("c", "t", "cfg", "consensus/acc"), 2, 2)


def test_a_run_made_with_other_threads_names_the_flag_not_a_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A run made with ``threads=2`` is another config for a reproduce of a config that says
    1 (thread counts change the arithmetic's order; the campaign's runs are made with
    ``threads=1`` over configs that set none). The
    skip and the table's warning say so with the values and name the flag that uses it,
    instead of telling the user to move hours of runs away; with the flag it is reused."""
    from lowband.cli import main

    papers = _paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(papers / "toy" / "dfedavg.toml"), "threads=2", "--quiet"]) == 0
    capsys.readouterr()
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "threads: 2 then, 1 now" in out
    assert "collect or run with --threads 2, as the run was made, to use it" in out
    assert "move it away" not in out
    assert main([*args, "--collect"]) == 0
    err = capsys.readouterr().err
    assert "left out of the table: collect or run with --threads 2" in err
    assert main([*args, "--collect", "--threads", "2"]) == 0
    assert _row(tmp_path / "out" / "toy_table.md", "t/acc")[4]  # reused: the cell has its value


def test_device_flag_reaches_every_run_and_a_missing_gpu_stops_nothing_midway(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``reproduce --device D`` runs every cell's config with ``device = D`` (saved in the
    run's config.toml; the table then counts a GPU run's time as GPU-hours). A device name
    the key does not know, or a GPU this machine lacks, is one line and exit 2 before any
    run starts; a collect needs no GPU here."""
    from lowband.cli import main

    papers = _paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main([*args, "--device", "gpu0"]) == 2
    assert "--device: unknown device 'gpu0'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*args, "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "--device: 'cuda' is not available on this machine" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "runs").exists()  # nothing ran
        assert main([*args, "--device", "cuda", "--dry-run"]) == 0  # reading needs no GPU
    assert main([*args, "--device", "auto"]) == 0
    saved = [p.read_text() for p in (tmp_path / "runs").rglob("config.toml")]
    assert saved and all('device = "auto"' in t for t in saved)
    assert _row(tmp_path / "out" / "toy_table.md", "t/acc")[4]


def test_config_change_names_each_differing_setting_with_both_values(tmp_path: Path) -> None:
    """``--resume`` and ``reproduce`` refuse a run folder of another config; the reason shows
    each dotted key with its value then and now (not just the section ``data``)."""
    from lowband.config import load_experiment
    from lowband.engine.runlog import config_change, config_diff

    papers = _paper(tmp_path)
    cfg = str(papers / "toy" / "dfedavg.toml")
    exp = load_experiment(cfg, [f"out_dir={tmp_path / 'r'}"])
    RunLog.open(exp).release()
    assert config_change(exp.run_dir(), exp) is None
    other = load_experiment(cfg, [f"out_dir={tmp_path / 'r'}", "data.alpha=0.9", "threads=2"])
    diff = config_diff(exp.run_dir(), other)
    assert set(diff) == {"data.alpha", "threads"}
    assert diff["threads"] == (1, 2)
    text = config_change(exp.run_dir(), other)
    assert "data.alpha: " in text and " then, 0.9 now" in text and "threads: 1 then, 2 now" in text


def test_a_value_of_another_folder_with_the_same_name_is_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A cell keeps a gone run's value only while the *run* column names the config's own run
    folder, compared as a path: ``runs/cpu/toy`` is not ``runs/gpu/toy`` (the last name alone
    matched before, so a table without fingerprints kept one config's value for the other).
    A fingerprint recorded under the folder's last name (tables before the path was the
    key) still counts."""
    from lowband.cli import main

    papers = _paper(tmp_path)
    cfg = papers / "toy" / "dfedavg.toml"
    spec = tomllib.loads(cfg.read_text())
    cfg.write_text(tomli_w.dumps({**spec, "out_dir": "runs/cpu/toy"}))
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main(args) == 0
    table = tmp_path / "out" / "toy.md"
    text = table.read_text()
    assert '{"runs/cpu/toy": "' in text
    shutil.rmtree(tmp_path / "runs")
    # a fingerprint keyed by the folder's name (an older table) is still read: same config, kept
    table.write_text(text.replace('{"runs/cpu/toy": "', '{"toy": "'))
    assert main([*args, "--collect"]) == 0
    assert "kept from the previous table" in _row(table, "t/acc")[6]
    # another config (other lr) whose folder has the same last name, and a table without
    # fingerprints: the value is not the new config's
    table.write_text("\n".join(x for x in text.splitlines() if "fingerprints" not in x) + "\n")
    cfg.write_text(tomli_w.dumps({**spec, "out_dir": "runs/gpu/toy",
                                  "algorithm": {**spec["algorithm"], "lr": 0.3}}))
    capsys.readouterr()
    assert main([*args, "--collect"]) == 0
    assert "t/acc: the previous table's value came from another run folder" in capsys.readouterr().err
    assert _row(table, "t/acc")[4] == "" and _row(table, "t/acc")[6] == "not run"
