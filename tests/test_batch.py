"""Seeds and sweeps (lowband.batch): parsing, statistics, resumable runs, parallel workers
equal to serial, aggregates, the sweep table and plots, kill and resume; ledger.csv and
`lowband export`."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import digits_config
from lowband.batch import (BatchError, parse_grid, parse_seeds, run_seeds, run_sweep, seed_runs, split_values,
                           stats)
from lowband.cli import main
from lowband.config import ConfigError
from lowband.engine.runlog import RunDirError, RunLog

SRC = Path(__file__).resolve().parents[1] / "src"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_cfg(path: Path, cfg: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(cfg))
    return path


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- parsing and statistics


def test_parse_seeds_grid_and_values() -> None:
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    for bad in ("", "a", "3-1", "1,1", "-1"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)
    assert split_values("topk(0.01)+fp16,sketch(5,2000),int8") == ["topk(0.01)+fp16", "sketch(5,2000)", "int8"]
    assert split_values("[0.5,0.25,0.25],[1.0,0.0,0.0]") == ["[0.5,0.25,0.25]", "[1.0,0.0,0.0]"]
    grid, fixed = parse_grid(["comm.codec=fp32,fp16", "algorithm.lr=0.1,0.05", "rounds=2"])
    assert grid == {"comm.codec": ["fp32", "fp16"], "algorithm.lr": [0.1, 0.05]}
    assert fixed == ["rounds=2"]
    with pytest.raises(ConfigError, match="repeated"):
        parse_grid(["comm.codec=fp16,fp16"])


def test_stats_match_scipy_t_interval() -> None:
    from scipy import stats as st

    vals = [0.8, 0.85, 0.83, 0.9]
    s = stats(vals)
    lo, hi = st.t.interval(0.95, len(vals) - 1, loc=sum(vals) / 4, scale=st.sem(vals))
    assert s["n"] == 4 and math.isclose(s["mean"], 0.845)
    assert math.isclose(s["std"], float(torch.tensor(vals, dtype=torch.float64).std()))
    assert math.isclose(s["ci_low"], lo) and math.isclose(s["ci_high"], hi)
    assert stats([0.5, None])["std"] is None and stats([])["mean"] is None


# --------------------------------------------------------------------------- seeds


def test_seeds_cli_aggregate_and_resume(tmp_path: Path, capsys) -> None:
    cfg = write_cfg(tmp_path / "c.toml", digits_config(tmp_path, rounds=2))
    base = tmp_path / "seeds"
    rc, out, err = cli(capsys, "run", cfg, "--seeds", "0,1,2", "--workers", "1", "--out", base, "-q")
    assert rc == 0, err
    assert "over 3 seeds" in out and "±" in out
    dirs = seed_runs(base, finished=True)
    assert [d.name for d in dirs] == ["seed-0", "seed-1", "seed-2"]
    finals = [json.loads((d / "summary.json").read_text())["final"]["personal/acc_weighted"] for d in dirs]
    assert len(set(finals)) > 1  # the seeds really differ
    agg = json.loads((base / "aggregate.json").read_text())
    s = agg["summary"]["final/personal/acc_weighted"]
    assert s["n"] == 3 and math.isclose(s["mean"], sum(finals) / 3)
    assert s["ci_low"] < s["mean"] < s["ci_high"]
    assert [r["round"] for r in agg["rounds"]] == [0, 1, 2]
    header = (base / "aggregate.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["round", "n"] and "personal/acc_weighted.ci_high" in header
    # again: every seed is finished, nothing is rerun
    before = mtimes(base / "seed-1")
    rc, out, err = cli(capsys, "run", cfg, "--seeds", "0-2", "--workers", "1", "--out", base)
    assert rc == 0 and err.count("skip") == 3, err
    assert mtimes(base / "seed-1") == before
    # a seed folder of another config is refused before anything runs
    rc, _, err = cli(capsys, "run", cfg, "algorithm.lr=0.2", "--seeds", "0,3", "--workers", "1", "--out", base)
    assert rc == 2 and "different config" in err and not (base / "seed-3").exists()


@pytest.mark.slow  # two spawned worker processes import torch (~8 s)
def test_parallel_seeds_equal_serial(tmp_path: Path) -> None:
    """Two worker processes give byte-identical metrics to the serial runner (threads = 1)."""
    cfg = digits_config(tmp_path, rounds=2)
    a = run_seeds(cfg, [0, 1], out=tmp_path / "serial", workers=1, progress=False)
    b = run_seeds(cfg, [0, 1], out=tmp_path / "pool", workers=2, progress=False)
    for s in ("seed-0", "seed-1"):
        for f in ("metrics.jsonl", "ledger.csv", "summary.json"):
            assert (a / s / f).read_text() == (b / s / f).read_text(), f"{s}/{f}"
    assert (a / "aggregate.csv").read_text() == (b / "aggregate.csv").read_text()


def test_a_failing_run_is_reported_and_the_others_finish(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, rounds=1)
    (tmp_path / "s" / "seed-1").mkdir(parents=True)
    (tmp_path / "s" / "seed-1" / "checkpoint.pt").write_bytes(b"garbage")
    (tmp_path / "s" / "seed-1" / "config.toml").write_text(
        __import__("lowband").experiment(cfg, seed=1, out_dir=str(tmp_path / "s" / "seed-1")).to_toml())
    with pytest.raises(BatchError, match=r"1 of 2 runs failed: seed 1: (RunDirError|DamagedFileError)"):
        run_seeds(cfg, [0, 1], out=tmp_path / "s", workers=1, progress=False)
    assert (tmp_path / "s" / "seed-0" / "summary.json").exists()


# --------------------------------------------------------------------------- sweeps


def test_sweep_codecs_by_seeds_table_plots_and_skip(tmp_path: Path, capsys) -> None:
    """`lowband sweep` of FedAvg over comm.codec x 3 seeds on digits: the table and plots;
    a second run after removing one cell redoes only that cell."""
    cfg = write_cfg(tmp_path / "c.toml", digits_config(tmp_path, rounds=2))
    out = tmp_path / "sw"
    rc, stdout, err = cli(capsys, "sweep", cfg, "comm.codec=fp32,fp16,int8", "--seeds", "0,1,2", "--out", out,
                          "--workers", "1", "-q")
    assert rc == 0, err
    rows = [line for line in (out / "sweep.md").read_text().splitlines() if line.startswith("| fp")
            or line.startswith("| int8")]
    assert [r.split("|")[1].strip() for r in rows] == ["fp32", "fp16", "int8"]
    assert all("±" in r for r in rows)
    csv_rows = (out / "sweep.csv").read_text().splitlines()
    header = csv_rows[0].split(",")
    up = [float(r.split(",")[header.index("bytes_up")]) for r in csv_rows[1:]]
    assert up[0] > 1.9 * up[1] and up[1] > 1.8 * up[2]  # fp32 ~ 2 x fp16 ~ 4 x int8 on the uplink (+ headers)
    assert [int(r.split(",")[header.index("n")]) for r in csv_rows[1:]] == [3, 3, 3]
    for png in ("sweep_curves.png", "sweep_final.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    cells = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(cells) == 3 and all(len(seed_runs(c, finished=True)) == 3 for c in cells)
    # remove one finished cell; a re-run redoes it only
    import shutil

    shutil.rmtree(out / "comm.codec=fp16")
    keep = {c.name: mtimes(c) for c in cells if c.name != "comm.codec=fp16"}
    rc, _, err = cli(capsys, "sweep", cfg, "comm.codec=fp32,fp16,int8", "--seeds", "0,1,2", "--out", out,
                     "--workers", "1")
    assert rc == 0, err
    assert err.count("skip") == 6 and err.count("ran ") == 3, err
    for name, before in keep.items():
        assert {k: v for k, v in mtimes(out / name).items() if not k.startswith("aggregate")} == \
            {k: v for k, v in before.items() if not k.startswith("aggregate")}
    assert len(seed_runs(out / "comm.codec=fp16", finished=True)) == 3


def test_sweep_bad_value_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    cfg = write_cfg(tmp_path / "c.toml", digits_config(tmp_path, rounds=1))
    rc, _, err = cli(capsys, "sweep", cfg, "comm.codec=fp16,nope", "--out", tmp_path / "sw")
    assert rc == 2 and "comm.codec" in err and "nope" in err
    assert not (tmp_path / "sw").exists()


#: ``lowband.cli`` in a child process that stops for good (sleeps until it is killed) in the
#: middle of one sweep cell: when run folder ``argv[2]`` is about to checkpoint round
#: ``argv[3]`` (that round's metrics and timing already logged, the checkpoint still one
#: round behind), it creates the file ``argv[1]`` and sleeps. The test kills it there: the
#: same kill, at the same point, however loaded the machine is.
GATED_CLI = """
import sys, time
from pathlib import Path
from lowband.engine.runlog import RunLog
from lowband.cli import main

gate, cell, at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
save = RunLog.save_checkpoint

def gated(self, state):
    if self.dir.name == cell and state["round"] == at:
        gate.write_text(str(at))
        time.sleep(3600)  # killed here
    save(self, state)

RunLog.save_checkpoint = gated
sys.exit(main(sys.argv[4:]))
"""


def wait_for(path: Path, proc: subprocess.Popen, log: Path, deadline_s: float = 600.0) -> None:
    """Wait until ``path`` exists; fail naming the child's stderr if it exits first, or after
    ``deadline_s`` (generous: the child imports torch and trains under whatever load)."""
    end = time.monotonic() + deadline_s
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the sweep exited ({proc.returncode}) before {path.name} appeared: {log.read_text()}")
        if time.monotonic() > end:
            pytest.fail(f"{path.name} did not appear within {deadline_s:.0f} s: {log.read_text()}")
        time.sleep(0.05)


@pytest.mark.slow  # a real process killed mid-sweep and started again (~15 s)
def test_sweep_killed_midway_resumes_without_redoing_finished_cells(tmp_path: Path) -> None:
    """SIGKILL in the middle of the second cell (fp16: round 5's metrics logged, its
    checkpoint at round 4), then the same sweep again: the finished cell is skipped untouched,
    the killed one resumes and equals an uninterrupted run. The kill point is a gate in the
    child, not a race against a poll (which under heavy CPU load killed too late, or ran
    out of time before the cell started)."""
    cfg = digits_config(tmp_path, rounds=25)
    cfg["eval"] = {"every": 5}
    path = write_cfg(tmp_path / "c.toml", cfg)
    out = tmp_path / "sw"
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["sweep", str(path), "comm.codec=fp32,fp16,int8", "--out", str(out), "--workers", "1"]
    first, second = out / "comm.codec=fp32", out / "comm.codec=fp16"
    gate, log = tmp_path / "gate", tmp_path / "killed.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", GATED_CLI, str(gate), second.name, "5", *args, "-q"],
                                env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for(gate, proc, log)
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (first / "summary.json").exists() and not (second / "summary.json").exists(), "killed too late"
    done_before = mtimes(first)
    ck_round = torch.load(second / "checkpoint.pt", weights_only=True)["round"]
    assert 0 < ck_round < 25
    assert max(r["round"] for r in RunLog.read_jsonl(second / "metrics.jsonl")) > ck_round  # logged past it
    res = subprocess.run([sys.executable, "-m", "lowband.cli", *args, "-v"], env=env, capture_output=True,
                         text=True, timeout=1800)
    assert res.returncode == 0, res.stderr
    assert "skip    comm.codec=fp32" in res.stderr and "resumed comm.codec=fp16" in res.stderr, res.stderr
    assert mtimes(first) == done_before
    # the resumed cell equals an uninterrupted run of the same config
    import lowband as lb

    fresh = lb.run(lb.experiment(cfg, comm={"codec": "fp16"}), out=tmp_path / "fresh")
    assert RunLog.read_jsonl(second / "metrics.jsonl") == fresh.records
    assert (out / "sweep.md").exists()


@pytest.mark.slow  # starts a local Ray runtime (~10 s)
def test_sweep_on_ray_tasks(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    cfg = digits_config(tmp_path, rounds=1)
    out, cells = run_sweep(cfg, {"comm.codec": ["fp32", "fp16"]}, out=tmp_path / "sw", workers=2, backend="ray",
                           progress=False)
    serial, _ = run_sweep(cfg, {"comm.codec": ["fp32", "fp16"]}, out=tmp_path / "sw2", workers=1, progress=False)
    for c in cells:
        assert (c.dir / "metrics.jsonl").read_text() == (serial / c.dir.name / "metrics.jsonl").read_text()


# --------------------------------------------------------------------------- ledger file and export


def test_ledger_file_sums_to_the_summary(tmp_path: Path) -> None:
    from lowband.engine.simulator import Simulation
    from lowband.config import validate
    from lowband.export import read_ledger

    for alg in ("fedavg", "dfedavg"):
        res = Simulation(validate(digits_config(tmp_path, alg, rounds=2))).run()
        led = read_ledger(Path(res.run_dir) / "ledger.csv")
        for d in ("up", "down", "peer"):
            mask = led["direction"] == d
            assert int(led["bytes"][mask].sum()) == res.summary[f"bytes_{d}"]
            assert int(led["declared"][mask].sum()) == res.summary[f"declared_bytes_{d}"]
        assert int(led["bytes"].sum()) == res.metrics[-1]["bytes/total"] > 0
        per_round = {r: int(led["bytes"][led["round"] <= r].sum()) for r in (1, 2)}
        assert per_round == {m["round"]: m["bytes/total"] for m in res.metrics if m["round"] > 0}


def test_export_csv_read_by_pandas_equals_metrics_jsonl(tmp_path: Path, capsys) -> None:
    import pandas as pd
    import lowband as lb

    res = lb.run(digits_config(tmp_path, rounds=2))
    rc, out, err = cli(capsys, "export", res.run_dir)
    assert rc == 0, err
    exported = pd.read_csv(res.run_dir / "export" / "metrics.csv")
    jsonl = pd.DataFrame.from_records(RunLog.read_jsonl(res.run_dir / "metrics.jsonl"))
    pd.testing.assert_frame_equal(exported, jsonl, check_exact=True)
    ledger = pd.read_csv(res.run_dir / "export" / "ledger.csv")
    pd.testing.assert_frame_equal(ledger, res.ledger, check_exact=True)
    # a seeds folder: every seed's rows with a seed column
    base = run_seeds(digits_config(tmp_path / "s", rounds=1), [3, 4], out=tmp_path / "s", workers=1, progress=False)
    rc, _, err = cli(capsys, "export", base, "--out", tmp_path / "x")
    assert rc == 0, err
    both = pd.read_csv(tmp_path / "x" / "metrics.csv")
    assert list(both["seed"]) == [3, 3, 4, 4] and list(both.columns[:2]) == ["seed", "round"]


def test_export_parquet(tmp_path: Path, capsys, monkeypatch) -> None:
    import lowband as lb

    res = lb.run(digits_config(tmp_path, rounds=1))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    rc, _, err = cli(capsys, "export", res.run_dir, "--format", "parquet")
    assert rc == 2 and "pyarrow" in err and "--format csv" in err
    assert not (res.run_dir / "export").exists()
    monkeypatch.delitem(sys.modules, "pyarrow")
    import pandas as pd

    pytest.importorskip("pyarrow")  # parquet is optional (lowband[analysis]); the test extra installs it
    rc, _, err = cli(capsys, "export", res.run_dir, "--format", "parquet")
    assert rc == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(res.run_dir / "export" / "metrics.parquet"), res.metrics,
                                  check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(res.run_dir / "export" / "ledger.parquet"), res.ledger,
                                  check_exact=True)


def test_export_of_a_seed_without_a_ledger_exports_its_metrics_and_says_so(tmp_path: Path, capsys) -> None:
    """A seed run from before ledger.csv was written (no ledger.csv and no checkpoint.pt)
    was exported without a word: its metrics were there, but ledger.csv silently held the
    other seeds only. Now it is exported with what it has (its metrics and timing, its rows
    in the aggregate), as the export treats every missing file, and one warning line names
    the seed folder and the table that has no rows for it."""
    import csv
    import io

    base = tmp_path / "s"
    for s in (0, 1):
        d = base / f"seed-{s}"
        d.mkdir(parents=True)
        (d / "config.toml").write_text("")
        (d / "summary.json").write_text(json.dumps({"seed": s, "rounds_completed": 1, "main_metric": "acc",
                                                    "final": {"acc": 0.5 + s / 10}}))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "acc": 0.1 * r + s / 10}) + "\n"
                                                 for r in (0, 1)))
        (d / "timing.jsonl").write_text(json.dumps({"round": 1, "round_s": 0.5}) + "\n")
    (base / "seed-0" / "ledger.csv").write_text("round,src,dst,direction,kind,bytes,declared\n1,0,-1,up,w,100,0\n")
    rc, out, err = cli(capsys, "export", base, "--out", tmp_path / "x")
    assert rc == 0, err
    assert "wrote " in out and "seeds 0, 1" in out

    def table(name: str) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO((tmp_path / "x" / name).read_text())))

    assert [r["seed"] for r in table("metrics.csv")] == ["0", "0", "1", "1"]  # seed 1 is not dropped
    assert [r["seed"] for r in table("timing.csv")] == ["0", "1"]
    assert [r["seed"] for r in table("ledger.csv")] == ["0"]  # the only ledger there is
    assert [r["n"] for r in table("aggregate.csv")] == ["2", "2"]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(base / "seed-1") in lines[0] and "no ledger.csv and no checkpoint.pt" in lines[0]
    assert "no ledger rows for it" in lines[0] and "timing" not in lines[0]


def test_compare_shows_mean_and_std_of_a_seeds_folder(tmp_path: Path, capsys) -> None:
    cfg = digits_config(tmp_path, rounds=1)
    base = run_seeds(cfg, [0, 1], out=tmp_path / "s", workers=1, progress=False)
    single = tmp_path / "s" / "seed-0"
    rc, out, err = cli(capsys, "compare", base, single, "--out", tmp_path / "cmp")
    assert rc == 0, err
    rows = [r for r in out.splitlines() if r.startswith("| t-fedavg")]
    assert "(2 seeds)" in rows[0] and "±" in rows[0].split("|")[4]
    assert "±" not in rows[1].split("|")[4]


def test_seeds_finished_at_different_rounds_are_refused_not_averaged(tmp_path: Path, capsys) -> None:
    """A seed that finished more rounds than the config now asks counts as done, so a seeds
    folder can hold seeds at round 2 and a seed at round 1: their mean final would mix two
    run lengths under one "mean over 3 seeds". The aggregate and compare refuse it, naming
    the rounds; running to the longer length (the shorter seed resumes) makes it whole."""
    cfg = digits_config(tmp_path, rounds=2)
    base = tmp_path / "s"
    run_seeds(cfg, [0, 1], out=base, workers=1, progress=False)
    with pytest.raises(BatchError, match=r"different numbers of rounds.*seed-2: 1"):
        run_seeds({**cfg, "rounds": 1}, [0, 1, 2], out=base, workers=1, progress=False)
    rc, _, err = cli(capsys, "compare", base, "--out", tmp_path / "cmp")
    assert rc == 2 and "different numbers of rounds" in err and len(err.strip().splitlines()) == 1
    run_seeds(cfg, [0, 1, 2], out=base, workers=1, progress=False)  # seed 2 resumes to round 2
    agg = json.loads((base / "aggregate.json").read_text())
    assert agg["n"] == 3 and agg["summary"]["rounds_completed"] == {"n": 3, "mean": 2.0, "std": 0.0,
                                                                    "ci_low": 2.0, "ci_high": 2.0}


def test_aggregate_n_counts_the_values_averaged_not_the_runs(tmp_path: Path) -> None:
    """aggregate.csv (and `lowband export`'s aggregate table) said n = 3 at a round where
    one of 3 seeds had no value for a metric (null, or the key absent), while the mean,
    std and CI rested on 2 values. Each metric now has its own ``<metric>.n``: the values
    averaged, which the statistics use alone. Rounds that not every seed evaluated (4, 5
    here) are left out, so the row's ``n`` is the seeds with a record there (3)."""
    import csv
    import io
    import statistics

    from lowband.batch import write_aggregate
    from lowband.export import aggregate_rows

    seeds = {0: [{"round": 0, "acc": 0.1, "bytes/total": 0}, {"round": 5, "acc": 0.5, "bytes/total": 10},
                 {"round": 10, "acc": 0.7, "bytes/total": 20}],
             1: [{"round": 0, "acc": 0.2, "bytes/total": 0}, {"round": 4, "acc": 0.4, "bytes/total": 8},
                 {"round": 10, "acc": None, "bytes/total": 20}],  # acc null at round 10
             2: [{"round": 0, "bytes/total": 0},  # acc absent at round 0
                 {"round": 5, "acc": 0.6, "bytes/total": 10}, {"round": 10, "acc": 0.9, "bytes/total": 20}]}
    dirs = []
    for s, recs in seeds.items():
        d = tmp_path / "s" / f"seed-{s}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"seed": s, "rounds_completed": 10, "main_metric": "acc",
                                                    "final": {"acc": recs[-1]["acc"]}}))
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        dirs.append(d)
    agg = write_aggregate(tmp_path / "s", dirs)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "s" / "aggregate.csv").read_text())))
    assert [r["round"] for r in rows] == ["0", "10"] and [r["n"] for r in rows] == ["3", "3"]
    assert [r["acc.n"] for r in rows] == ["2", "2"] and [r["bytes/total.n"] for r in rows] == ["3", "3"]
    for r, vals in zip(rows, ([0.1, 0.2], [0.7, 0.9])):
        assert float(r["acc.mean"]) == pytest.approx(statistics.mean(vals))
        assert float(r["acc.std"]) == pytest.approx(statistics.stdev(vals))
    assert list(rows[0])[:4] == ["round", "n", "acc.n", "acc.mean"]
    assert [row["count"]["acc"] for row in agg["rounds"]] == [2, 2]
    assert json.loads((tmp_path / "s" / "aggregate.json").read_text())["rounds"][1]["count"] == {
        "acc": 2, "bytes/total": 3}
    # `lowband export`'s aggregate table is the same rows
    assert [{k: ("" if v is None else str(v)) for k, v in r.items()} for r in aggregate_rows(dirs)] == rows


def test_tables_show_a_loss_in_its_own_unit_not_as_a_percentage(tmp_path: Path, capsys, monkeypatch) -> None:
    """With ``eval.main = "global/loss"`` the run --seeds line, compare's rows (a single run
    and a seeds folder alike), compare's plots and the sweep table show the loss as it is:
    no "%" heading or "accuracy (%)" axis, and no x100 on one row or on the interval only."""
    import matplotlib.axes

    from lowband.report import sweep_markdown

    cfg = digits_config(tmp_path, rounds=1)
    cfg["eval"] = {"protocols": ["global"], "main": "global/loss"}
    base = tmp_path / "s"
    rc, out, err = cli(capsys, "run", write_cfg(tmp_path / "c.toml", cfg), "--seeds", "0,1", "--workers", "1",
                       "--out", base, "-q")
    assert rc == 0, err
    s = json.loads((base / "aggregate.json").read_text())["summary"]["final/global/loss"]
    assert f"global/loss = {s['mean']:.2f} ± {s['std']:.2f} (95% CI {s['ci_low']:.2f}-{s['ci_high']:.2f})" in out
    drawn: list[float] = []
    ylabels: list[str] = []
    plot, set_ylabel = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.set_ylabel
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, x, y, *a, **k: (drawn.extend(y), plot(ax, x, y, *a, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel", lambda ax, s, **k: (ylabels.append(s), set_ylabel(ax, s, **k))[1])
    rc, out, err = cli(capsys, "compare", base, base / "seed-0", "--out", tmp_path / "cmp")
    assert rc == 0, err
    assert drawn and max(drawn) < 10 and ylabels == ["global/loss", "global/loss"]  # a loss of ~2.5, not 250
    loss0 = json.loads((base / "seed-0" / "summary.json").read_text())["final"]["global/loss"]
    rows = [r.split("|") for r in out.splitlines() if r.startswith("| t-fedavg")]
    assert rows[0][4].strip() == f"{s['mean']:.2f} ± {s['std']:.2f}" and rows[1][4].strip() == f"{loss0:.2f}"
    assert "final %" not in out
    row = {"metric": "global/loss", "n": 1, "final": 0.5, "final_std": None, "final_ci_low": None,
           "final_ci_high": None, "best": None, "best_std": None, "target": None, "rounds_to_target": None,
           "reached": 0, "bytes_to_target": None, "bytes_up": 1, "bytes_down": 1, "bytes_peer": 0}
    md = sweep_markdown([row], [])
    assert "%" not in md.splitlines()[0] and "| global/loss | 0.50 |" in md


# --------------------------------------------------------------------------- console


def test_version_and_log_levels(tmp_path: Path, capsys) -> None:
    from lowband import __version__

    rc, out, _ = cli(capsys, "--version")
    assert rc == 0 and out.strip() == f"lowband {__version__}"
    cfg = write_cfg(tmp_path / "c.toml", digits_config(tmp_path, rounds=1))
    rc, out, err = cli(capsys, "run", cfg, "--seeds", "0", "--workers", "1", "--out", tmp_path / "a", "-v")
    assert rc == 0 and "round 1" not in out and "seed 0 r1" in err  # per-round debug lines
    rc, out, err = cli(capsys, "run", cfg, "--seeds", "1", "--workers", "1", "--out", tmp_path / "a", "-q")
    assert rc == 0 and err == ""
    rc, out, err = cli(capsys, "--log-level", "warning", "run", cfg, "--seeds", "2", "--out", tmp_path / "a",
                       "--workers", "1")
    assert rc == 0 and err == ""
    rc, _, err = cli(capsys, "run", cfg, "--log-level", "loud")
    assert rc == 2 and "--log-level" in err
    from lowband.cli import _Progress

    bar = _Progress("x", "global/acc", 3)
    try:
        assert any(type(c).__name__ == "EtaColumn" for c in bar._bar.columns)  # the ETA (its own: works for slow rounds)
    finally:
        bar.close()
