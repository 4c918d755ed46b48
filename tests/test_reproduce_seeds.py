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

from conftest import as_written, digits_config
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
    assert row[5] == "2/2" and row[6].startswith("record `dfedavg` seeds 0, 1, 2 (") and "CPU-h;" in row[6]
    text = table.read_text()
    assert re.search(re.escape("- `t/acc`: ") + ", ".join(
        re.escape(f"{s}: {a:.2f}") + r" \([0-9.e-]+ CPU-h\)" for s, a in zip(runs, accs)), text)
    # a cell without seeds of the same config shows every seed found too
    assert _row(table, "t/rounds")[4].endswith("(n=3)")
    assert "in the 3 recorded runs of 1 configs" in text
    # again: every seed is reused, nothing runs
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("  reuse   ") == 3 and "  run     " not in out


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
        as_written(root / "seed-3" / name, None)
    for s in (4, 5):  # made under another default: seed 4 partly, seed 5 to the end
        hp = root / f"seed-{s}" / "hyperparams.json"
        saved = json.loads(hp.read_text())
        saved["lr"] *= 2
        as_written(hp, json.dumps(saved))
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main([*args, "--collect"]) == 0  # the folders present recorded (not seeds 4 and 5: another config's)
    before = _files(tmp_path)
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert _files(tmp_path) == before  # a dry run writes nothing
    line = {s: next(x for x in out if f"/dfedavg.toml seed {s} -> " in x) for s in range(6)}
    hours = {}
    timed = [_timed(root / f) for f in ("", "seed-1", "seed-3")]  # the records of seeds 0, 1, 3
    per_round = sum(t[0] for t in timed) / sum(t[1] for t in timed) / 3600

    def cost(s: int, pattern: str, to_go: int) -> None:
        m = re.fullmatch(r"  would " + pattern + r"about (\S+) CPU-h left, timed on the records of seeds 0, 1, 3\)",
                         line[s])
        assert m, line[s]
        hours[s] = float(m.group(1))
        assert hours[s] > 0 and hours[s] == pytest.approx(to_go * per_round, rel=0.06)

    assert line[0] == "  would reuse   papers/toy/dfedavg.toml seed 0 -> runs/toy (4/4 rounds)"
    cost(1, r"resume  papers/toy/dfedavg\.toml seed 1 -> runs/toy/seed-1 \(2/4 rounds; ", 2)
    cost(3, r"restart papers/toy/dfedavg\.toml seed 3 -> runs/toy/seed-3 \(2/4 rounds, none checkpointed: "
            r"from round 0; ", 4)
    cost(2, r"run     papers/toy/dfedavg\.toml seed 2 -> runs/toy/seed-2 \(4 rounds; ", 4)
    assert line[4].startswith("  would skip    papers/toy/dfedavg.toml seed 4 -> runs/toy/seed-4: --resume: ")
    assert "algorithm.lr" in line[4]
    # a finished run of another config is not reused as this one's (the table would leave it out)
    assert line[5].startswith("  would skip    papers/toy/dfedavg.toml seed 5 -> runs/toy/seed-5: ")
    assert "holds a finished run of another config" in line[5] and "algorithm.lr" in line[5]
    m = re.fullmatch(r"in all: run 1, resume 1, restart 1, reuse 1, skip 2: about (\S+) CPU-h still needed by the 3 "
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
    assert out[-1] == "in all: run 0, resume 0, restart 0, reuse 4, skip 2: about 0 CPU-h still needed by the 0 runs " \
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
    assert (est.hours, est.gpu, est.note) == (5.0, True, "timed on the record of seed 1")  # 10 rounds of half an hour
    assert dry_run_line(Planned("run", gpu, Path("r/seed-2")), "c seed 2", est) == \
        "  would run     c seed 2 -> r/seed-2 (10 rounds; about 5 GPU-h left, timed on the record of seed 1)"
    est = estimate(Planned("run", cpu, Path("r/seed-2")), on_gpu)
    assert est.hours is None and est.note == "this config is recorded only on a GPU"
    on_cpu = {1: RunData(Path("r/seed-1"), [{"round": 2}], timing, 10, None, "x", 4, 1)}
    est = estimate(Planned("resume", cpu, Path("r/seed-1"), done=2), on_cpu)
    assert (est.hours, est.gpu, est.note) == (16.0, False, "timed on the record of seed 1")  # 8 x 0.5 h x 4 threads
    assert estimate(Planned("run", cpu, Path("r/seed-2")), {}).note == "no record of this config in the store"


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
    as_written(saved, saved.read_text().replace('device = "cpu"', 'device = "cuda"'))
    assert 'device = "cuda"' in saved.read_text()
    assert main(args + ["--collect"]) == 0
    text = table.read_text()
    row = _row(table, "t/acc")
    assert row[4].endswith("(n=2)") and "GPU-h on a GPU" in row[6], row
    m = re.search(r"\*\*Compute: ([\d.e+-]+) CPU-hours\*\*.*1 runs on a GPU add ([\d.e+-]+) GPU-hours", text)
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
    assert "collect or run with --threads 2, as the run was made, to use it; not recorded" in err
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


