"""Both seeds layouts are read by every reader of run folders (issue 16): a run in ``R``
plus ``R/seed-<s>/`` beside it (``lowband reproduce``) and every seed in ``R/seed-<s>/``
(``lowband run --seeds``). ``lowband.load_run``, ``lowband export``, ``lowband compare``
(report.load_run) and the plots see every seed and say which layout they read; a run
folder without seed folders reads as before."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import torch

from conftest import digits_config

import lowband as lb
from lowband.cli import main
from lowband.report import ReportError, find_runs

pd = pytest.importorskip("pandas")  # the test extra installs it; DataFrames are the feature


@pytest.fixture(scope="module")
def reproduce_layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """R: a finished 1-round digits run of seed 0 in R itself and seed 1 in R/seed-1 (what
    ``lowband reproduce`` leaves for a cell with ``seeds = [0, 1]``). Built once; tests that
    change a layout work on a copy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("layouts") / "R"
        cfg = digits_config(root.parent, rounds=1)
        lb.run(cfg, seed=0, out=root)
        lb.run(cfg, seed=1, out=root / "seed-1")
    finally:
        torch.set_num_threads(before)
    return root


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _final(run: Path) -> float:
    s = json.loads((run / "summary.json").read_text())
    return s["final"][s["main_metric"]]


def _batch_copy(r: Path, dest: Path) -> Path:
    """The same two seeds in the ``lowband run --seeds`` layout: dest/seed-0, dest/seed-1."""
    shutil.copytree(r, dest / "seed-0", ignore=shutil.ignore_patterns("seed-*"))
    shutil.copytree(r / "seed-1", dest / "seed-1")
    return dest


def test_the_two_seeds_differ(reproduce_layout: Path) -> None:
    a, b = _jsonl(reproduce_layout / "metrics.jsonl"), _jsonl(reproduce_layout / "seed-1" / "metrics.jsonl")
    assert a != b  # so a reader that returns one seed twice, or only one, is caught below


def test_find_runs_names_the_layout(reproduce_layout: Path, tmp_path: Path) -> None:
    f = find_runs(reproduce_layout)
    assert (f.layout, f.seeds, f.dirs) == ("run+seeds", [0, 1], [reproduce_layout, reproduce_layout / "seed-1"])
    assert "lowband reproduce" in f.describe() and "seeds 0, 1" in f.describe()
    b = find_runs(_batch_copy(reproduce_layout, tmp_path / "B"))
    assert (b.layout, b.seeds) == ("seeds", [0, 1]) and "lowband run --seeds" in b.describe()
    single = find_runs(reproduce_layout / "seed-1")
    assert (single.layout, single.seeds, single.left_out) == ("run", [1], [])


def test_load_run_reads_run_plus_seed_folders(reproduce_layout: Path) -> None:
    res = lb.load_run(reproduce_layout)
    assert isinstance(res, lb.SeedResults)
    assert (res.layout, res.seeds, res.run_dir, res.left_out) == ("run+seeds", [0, 1], reproduce_layout, [])
    assert [r.run_dir for r in res.runs] == [reproduce_layout, reproduce_layout / "seed-1"]
    assert "run+seeds" in repr(res)
    m = res.metrics
    assert list(m["seed"]) == [0, 0, 1, 1] and list(m["round"]) == [0, 1, 0, 1]
    for s, folder in ((0, reproduce_layout), (1, reproduce_layout / "seed-1")):
        rows = m[m["seed"] == s].drop(columns="seed").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, pd.DataFrame.from_records(_jsonl(folder / "metrics.jsonl")),
                                      check_exact=True)
    led = res.ledger
    assert list(led.columns[:2]) == ["seed", "round"] and set(led["seed"]) == {0, 1}
    for s, r in zip(res.seeds, res.runs):
        assert int(led[led["seed"] == s]["bytes"].sum()) == r.summary["bytes_up"] + r.summary["bytes_down"]
    # the aggregate is computed (reproduce writes no aggregate.json) over both seeds
    assert not (reproduce_layout / "aggregate.json").exists()
    key = res.main_metric
    finals = [_final(reproduce_layout), _final(reproduce_layout / "seed-1")]
    summ = res.summary[f"final/{key}"]
    assert summ["n"] == 2 and summ["mean"] == pytest.approx(statistics.mean(finals))
    assert summ["std"] == pytest.approx(statistics.stdev(finals))
    agg = res.aggregate
    last = agg[agg["round"] == 1].iloc[0]
    assert last["n"] == 2 and last[f"{key}.mean"] == pytest.approx(statistics.mean(finals))
    assert last[f"{key}.ci_low"] < last[f"{key}.mean"] < last[f"{key}.ci_high"]


def test_load_run_of_a_single_run_is_unchanged(reproduce_layout: Path, tmp_path: Path) -> None:
    one = lb.load_run(reproduce_layout / "seed-1")
    assert isinstance(one, lb.Result) and one.layout == "run" and one.config.seed == 1
    alone = tmp_path / "alone"
    shutil.copytree(reproduce_layout, alone, ignore=shutil.ignore_patterns("seed-*"))
    (alone / "seed-7").mkdir()  # a seed folder with no run at all is not a seed
    res = lb.load_run(alone)
    assert isinstance(res, lb.Result) and res.run_dir == alone and res.config.seed == 0


def test_load_run_reads_the_batch_layout_and_leaves_out_unfinished_and_repeated_seeds(
        reproduce_layout: Path, tmp_path: Path) -> None:
    b = _batch_copy(reproduce_layout, tmp_path / "B")
    res = lb.load_run(b)
    assert isinstance(res, lb.SeedResults) and (res.layout, res.seeds) == ("seeds", [0, 1])
    # an unfinished seed (config.toml, no summary.json) is left out and named
    shutil.copytree(b / "seed-1", b / "seed-2")
    (b / "seed-2" / "summary.json").unlink()
    res = lb.load_run(b)
    assert res.seeds == [0, 1] and res.left_out == [(b / "seed-2", "unfinished: no summary.json")]
    # a seed-<s> folder repeating the run folder's own seed counts once
    r = tmp_path / "R"
    shutil.copytree(reproduce_layout, r)
    shutil.copytree(r, r / "seed-0", ignore=shutil.ignore_patterns("seed-*"))
    res = lb.load_run(r)
    assert res.seeds == [0, 1] and res.left_out == [(r / "seed-0", f"repeats seed 0 of {r}")]
    # only unfinished seeds: refused with one line that says so
    (b / "seed-0" / "summary.json").unlink()
    (b / "seed-1" / "summary.json").unlink()
    with pytest.raises(ReportError, match="unfinished"):
        lb.load_run(b)


def test_an_aggregate_json_from_before_the_per_metric_counts_is_recounted(reproduce_layout: Path,
                                                                          tmp_path: Path) -> None:
    """An aggregate.json written before each metric had its own count (``count`` per round,
    ``<metric>.n`` in the table) is not shown with an unknown n: load_run recounts it."""
    from lowband.batch import write_aggregate

    b = _batch_copy(reproduce_layout, tmp_path / "B")
    write_aggregate(b, [b / "seed-0", b / "seed-1"])
    old = json.loads((b / "aggregate.json").read_text())
    for row in old["rounds"]:
        del row["count"]
    (b / "aggregate.json").write_text(json.dumps(old))
    res = lb.load_run(b)
    assert list(res.aggregate[f"{res.main_metric}.n"]) == [2, 2]


@pytest.mark.parametrize("layout", ["run+seeds", "seeds"])
def test_export_writes_every_seed_and_the_aggregate(reproduce_layout: Path, tmp_path: Path, layout: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    src = reproduce_layout if layout == "run+seeds" else _batch_copy(reproduce_layout, tmp_path / "B")
    folders = {0: reproduce_layout, 1: reproduce_layout / "seed-1"}
    capsys.readouterr()
    assert main(["export", str(src), "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"read {src}: ") and "seeds 0, 1" in out
    assert ("lowband reproduce" if layout == "run+seeds" else "lowband run --seeds") in out
    metrics = pd.read_csv(tmp_path / "x" / "metrics.csv")
    assert list(metrics["seed"]) == [0, 0, 1, 1] and list(metrics.columns[:2]) == ["seed", "round"]
    for s, folder in folders.items():
        rows = metrics[metrics["seed"] == s].drop(columns="seed").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, pd.DataFrame.from_records(_jsonl(folder / "metrics.jsonl")),
                                      check_exact=True)
    ledger = pd.read_csv(tmp_path / "x" / "ledger.csv")
    for s, folder in folders.items():
        summary = json.loads((folder / "summary.json").read_text())
        assert int(ledger[ledger["seed"] == s]["bytes"].sum()) == summary["bytes_up"] + summary["bytes_down"]
    agg = pd.read_csv(tmp_path / "x" / "aggregate.csv")
    key = json.loads((reproduce_layout / "summary.json").read_text())["main_metric"]
    assert list(agg["round"]) == [0, 1] and list(agg["n"]) == [2, 2]
    assert agg[f"{key}.mean"].iloc[-1] == pytest.approx(statistics.mean(_final(f) for f in folders.values()))


def test_export_of_a_single_run_is_unchanged(reproduce_layout: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["export", str(reproduce_layout / "seed-1"), "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wrote ") and "read " not in out
    metrics = pd.read_csv(tmp_path / "x" / "metrics.csv")
    assert "seed" not in metrics.columns and not (tmp_path / "x" / "aggregate.csv").exists()
    pd.testing.assert_frame_equal(metrics, pd.DataFrame.from_records(
        _jsonl(reproduce_layout / "seed-1" / "metrics.jsonl")), check_exact=True)


def test_compare_and_plots_show_both_seeds(reproduce_layout: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    import matplotlib

    matplotlib.use("Agg")
    b = _batch_copy(reproduce_layout, tmp_path / "B")
    capsys.readouterr()
    assert main(["compare", str(reproduce_layout), str(b), "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    finals = [_final(reproduce_layout), _final(reproduce_layout / "seed-1")]
    mean_std = f"{100 * statistics.mean(finals):.2f} ± {100 * statistics.stdev(finals):.2f}"
    rows = [r.split("|") for r in table.splitlines() if r.startswith("| t-fedavg")]
    assert len(rows) == 2 and all("(2 seeds)" in r[1] and r[4].strip() == mean_std for r in rows)
    res = lb.load_run(reproduce_layout)
    ax = res.plot(x="round")
    assert len(ax.collections) == 1  # the 95% band over the two seeds
    per_seed = [[r[res.main_metric] for r in _jsonl(f / "metrics.jsonl")]
                for f in (reproduce_layout, reproduce_layout / "seed-1")]
    assert list(ax.lines[0].get_ydata()) == pytest.approx([100 * statistics.mean(v) for v in zip(*per_seed)])
