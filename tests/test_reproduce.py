"""Reproduction support (issue 15): the ``personal_joined`` protocol, ``data.seed`` and
``lowband reproduce`` from an installed package in any folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from conftest import digits_config
from lowband.config import validate
from lowband.engine.simulator import Simulation, make_federation
from lowband.train import evaluate


def _joined_cfg(tmp_path: Path) -> dict:
    cfg = digits_config(tmp_path, "fedcspack", rounds=2)
    # clients 0-2 train in round 1, 1-3 in round 2; 4-7 never join
    cfg["topology"] = {"kind": "star", "sampling": "list", "schedule": [[0, 1, 2], [1, 2, 3]]}
    cfg["eval"] = {"protocols": ["personal", "personal_joined"]}
    return cfg


def test_personal_joined_excludes_clients_never_sampled(tmp_path: Path) -> None:
    sim = Simulation(validate(_joined_cfg(tmp_path)))
    res = sim.run()
    by_round = {m["round"]: m for m in res.metrics}
    assert by_round[0]["personal_joined/n"] == 0 and "personal_joined/acc_mean" not in by_round[0]
    assert by_round[1]["personal_joined/n"] == 3
    assert by_round[2]["personal_joined/n"] == 4
    # per-client accuracies of the models the clients hold after round 2
    model = sim.executor.model_for(0)
    acc = {}
    for i, nd in enumerate(sim.fed.nodes):
        acc[i] = evaluate(model, sim.alg.node_params(sim.executor.states[i]), nd.test_x, nd.test_y)[0]
    assert all(sim.fed.nodes[i].test_y.numel() > 0 for i in acc)
    last = by_round[2]
    assert last["personal_joined/acc_mean"] == pytest.approx(np.mean([acc[i] for i in range(4)]), abs=1e-6)
    assert last["personal/acc_mean"] == pytest.approx(np.mean(list(acc.values())), abs=1e-6)
    # the never-sampled clients still hold the shared initial model and count only in `personal`
    init = sim.executor.env.init_params(4)
    for i in range(4, 8):
        for k, v in init.items():
            assert np.allclose(sim.alg.node_params(sim.executor.states[i])[k].numpy(), v.numpy())
    assert last["personal/acc_mean"] != pytest.approx(last["personal_joined/acc_mean"], abs=1e-3)


def test_personal_joined_is_a_known_protocol_and_main_metric(tmp_path: Path) -> None:
    cfg = _joined_cfg(tmp_path)
    cfg["eval"]["main"] = "personal_joined/acc_weighted"
    cfg["rounds"] = 1
    res = Simulation(validate(cfg)).run()
    assert res.summary["main_metric"] == "personal_joined/acc_weighted"
    assert res.summary["final"]["personal_joined/n"] == 3


def test_data_seed_fixes_the_partition_while_seed_varies(tmp_path: Path) -> None:
    base = digits_config(tmp_path, "fedavg")
    a = validate({**base, "seed": 1, "data": {**base["data"], "seed": 0}})
    b = validate({**base, "seed": 2, "data": {**base["data"], "seed": 0}})
    c = validate({**base, "seed": 2})
    fa, fb, fc = make_federation(a), make_federation(b), make_federation(c)
    same = all(np.array_equal(x.train_y.numpy(), y.train_y.numpy()) for x, y in zip(fa.nodes, fb.nodes))
    assert same
    assert any(x.train_y.numel() != y.train_y.numel() or not np.array_equal(x.train_y.numpy(), y.train_y.numpy())
               for x, y in zip(fb.nodes, fc.nodes))


# --------------------------------------------------------------------------- lowband reproduce

ROOT = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file of the source tree a run could write into."""
    out = {}
    for top in ("src", "experiments", "docs", "tests", "benchmarks"):
        for p in (root / top).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                st = p.stat()
                out[str(p)] = (st.st_mtime_ns, st.st_size)
    for p in root.iterdir():  # new top-level folders (runs/, results/) or files
        out.setdefault(str(p), (0, 0))
    return out


def test_every_shipped_paper_resolves_from_a_foreign_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    from lowband.cli import main
    from lowband.config import load_experiment
    from lowband.reproduce import load_cells, locate, packaged_experiments

    monkeypatch.chdir(tmp_path)  # no experiments/ here
    shipped = packaged_experiments()
    assert shipped is not None
    for paper in ("spark", "fedcspack", "fol", "kta"):
        assert locate(paper) == shipped
        for cell in load_cells(paper):
            assert Path(cell.config).is_file(), (paper, cell.id, cell.config)
    load_experiment(load_cells("spark")[0].config)
    assert main(["reproduce", "spark", "--dry-run", "--only", "ref_ntkdfl/m10/*"]) == 0
    out = capsys.readouterr().out
    assert "would run     spark/ntkdfl_ref_m10.toml -> runs/spark-fmnist-ntkdfl_ref_m10 (4 rounds; no estimate: " \
        "no record of this config in the store)" in out
    assert "would run     spark/ntkdfl_ref_m10_seq.toml -> " in out
    assert out.splitlines()[-1].startswith("in all: run 2, resume 0, restart 0, reuse 0, skip 0: ")
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_reproduce_runs_a_shipped_cell_in_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture, shared_data: Path) -> None:
    """From a folder outside the checkout: the shipped config is found, the run goes to
    ./runs, the table to --out, and nothing is written into the source tree."""
    from lowband.cli import main

    before = _tree(ROOT)
    monkeypatch.chdir(tmp_path)
    cell = "ref_ntkdfl/m10/synchronous/r1/client"
    assert main(["reproduce", "spark", "--only", cell, "--rounds", "1", "--threads", "1",
                 "--data-dir", str(shared_data), "--out", "tables"]) == 0
    table = (tmp_path / "tables" / "spark_table.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith(f"| {cell} |"))
    ours = row.split("|")[5].strip()
    assert 10 < float(ours) < 100 and "1/1 (at 1)" in row
    assert "CPU-hours" in table and "in the 1 recorded runs of 1 configs" in table
    assert (tmp_path / "runs" / "spark-fmnist-ntkdfl_ref_m10" / "summary.json").is_file()
    assert _tree(ROOT) == before


def _toy(root: Path, rounds: int = 3) -> Path:
    import tomli_w

    exp = root / "papers" / "toy"
    exp.mkdir(parents=True)
    cfg = digits_config(root, "dfedavg", rounds=rounds)
    cfg["out_dir"] = "runs/toy"
    cfg["eval"] = {"protocols": ["consensus"], "main": "consensus/acc"}
    (exp / "dfedavg.toml").write_text(tomli_w.dumps(cfg))
    runs = [{"id": "t/acc", "table": "t", "config": "experiments/toy/dfedavg.toml", "metric": "consensus/acc"},
            {"id": "t/at3", "table": "t", "config": "dfedavg.toml", "metric": "consensus/acc", "round": 3},
            {"id": "t/time", "table": "t", "config": "dfedavg.toml", "metric": "time/elapsed_s"}]
    (exp / "reproduce.toml").write_text(tomli_w.dumps({"paper": "toy", "run": runs}))
    return root / "papers"


def test_reproduce_resumes_interrupted_and_restarts_uncheckpointed_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from lowband.cli import main
    from lowband.engine.runlog import RunLog

    papers = _toy(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md"]
    assert main([*args, "--rounds", "2"]) == 0
    assert "  run " in capsys.readouterr().out
    table = (tmp_path / "out" / "toy.md").read_text()
    assert "| t/at3 |  | consensus/acc |  |  | 2/2 (at 3) |" in table  # round 3 not reached: no number
    # a longer run resumes from the checkpoint instead of starting over
    assert main(args) == 0
    assert "  resume" in capsys.readouterr().out
    resumed = RunLog.read_jsonl(tmp_path / "runs" / "toy" / "metrics.jsonl")
    assert [m["round"] for m in resumed] == [0, 1, 2, 3]
    # a run killed before its first checkpoint restarts from round 0, to the same numbers
    # (the folder as such a kill leaves it: every change through the run log, so its manifest agrees)
    log = RunLog(tmp_path / "runs" / "toy")
    log.remove(log.ckpt_path)
    log.remove(log.summary_path)
    lines = log.metrics_path.read_text().splitlines()
    log.write_file(log.metrics_path, lines[0] + "\n")
    assert main(args) == 0
    assert "  restart" in capsys.readouterr().out
    assert RunLog.read_jsonl(tmp_path / "runs" / "toy" / "metrics.jsonl") == resumed
    # a finished run is reused; the table states its compute
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "  reuse" in out and "Compute: " in out and "in the 1 recorded runs of 1 configs" in out
    timing = RunLog.read_jsonl(tmp_path / "runs" / "toy" / "timing.jsonl")
    assert len(timing) == 3 and all(t["round_s"] > 0 for t in timing)


def _toy_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str], Callable[[], str]]:
    """The toy paper run once (2 rounds) into ``runs/toy`` with its table at out/toy.md: the
    papers folder, the ``--collect`` command line, and a function returning the table's
    ``t/acc`` row as it is now."""
    from lowband.cli import main

    papers = _toy(tmp_path, rounds=2)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out/toy.md", "--collect"]
    assert main(args[:-1]) == 0
    return papers, args, lambda: next(line for line in (tmp_path / "out" / "toy.md").read_text().splitlines()
                                      if line.startswith("| t/acc |"))


# --------------------------------------------------------------------------- damaged run folders


def _collected(papers: Path, capsys: pytest.CaptureFixture, *extra: str) -> tuple[dict[str, list[str]], str]:
    """``reproduce toy --collect`` into a new table (nothing kept from an earlier one): its rows
    (cell id -> columns), the compute line last under ``"compute"``, and what went to stderr."""
    from lowband.cli import main

    out = Path("out") / "fresh.md"
    out.unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["reproduce", "toy", "--experiments", str(papers), "--out", str(out), "--collect", *extra]) == 0
    lines = out.read_text().splitlines()
    rows = {c[0]: c for c in ([x.strip() for x in line.strip().strip("|").split("|")]
                              for line in lines if line.startswith("| t/"))}
    rows["compute"] = [next(line for line in lines if line.startswith("**Compute"))]
    return rows, capsys.readouterr().err


@pytest.mark.parametrize("text, error", [
    ('{"round": 0, "a": 1}\ngarbage\n{"round": 1, "a": 2}\n', "line 2 is not JSON"),
    ('{"round": 0, "a": 1}\n{"round": 1, "a": 2}\n{"round": 2, "a"\n', "line 3 is not JSON"),  # newline: not torn
    ('{"round": 0, "a": 1}\n[1, 2]\n', "line 2: not an object with an integer 'round'"),
    ('{"round": 0, "a": 1}\nnull\n', "line 2: not an object with an integer 'round'"),
    ('{"a": 1}\n', "line 1: not an object with an integer 'round'"),
    ('{"round": "1", "a": 1}\n', "line 1: not an object with an integer 'round'"),
    ('{"round": 1, "a": "0.5"}\n', "line 1: a is '0.5', not a number"),
    ('{"round": 1, "a": true}\n', "line 1: a is True, not a number"),
    ('{"round": 1, "a": 0.5}\n{"round": 1, "a": 0.9}\n', "round 1 is logged twice with different values (line 2)"),
    ('{"round": 2, "a": 0.5}\n{"round": 1, "a": 0.9}\n', "round 1 comes after round 2 (line 2)"),
])
def test_a_damaged_run_log_is_refused_with_the_line(tmp_path: Path, text: str, error: str) -> None:
    """A bad line before the end (or a value that is not a number, a round logged twice
    with other values) used to make the run read as a shorter one (a line that is not JSON
    ended the read there), crash the table (a line that is not an object, no round, a
    string where a number is compared) or pass as a number (``"0.5"``): now it is an error
    naming the line, which a table's record refuses."""
    from lowband.engine.runlog import DamagedLogError
    from lowband.engine.runlog import RunLog

    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    with pytest.raises(DamagedLogError) as err:
        RunLog.read_jsonl(path)
    assert err.value.problem == error and str(err.value).startswith(f"{path} is damaged ({error}): ")


def test_a_run_log_reads_a_torn_last_line_repeated_rounds_and_non_finite_values(tmp_path: Path) -> None:
    """What a kill or a resume can leave is read as lowband means it: a torn last line (no
    newline after it) is a write cut short and left out; a round logged again with the same
    values counts once; ``NaN``/``Infinity`` (older files) are null, as lowband writes them now."""
    from lowband.engine.runlog import RunLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 0, "a": 0.1}\n{"round": 1, "a": 0.2}\n{"round": 2, "a": 0.')
    assert RunLog.read_jsonl(path) == [{"round": 0, "a": 0.1}, {"round": 1, "a": 0.2}]
    path.write_text('{"round": 0, "a": 0.1}\n{"round": 1, "a": 0.2}\n{"round": 1, "a": 0.2}\n{"round": 2, "a": 0.3}\n')
    assert [r["round"] for r in RunLog.read_jsonl(path)] == [0, 1, 2]
    path.write_text('{"round": 1, "a": NaN, "b": Infinity, "c": -Infinity, "d": null}\n')
    assert RunLog.read_jsonl(path) == [{"round": 1, "a": None, "b": None, "c": None, "d": None}]
    assert RunLog.read_jsonl(tmp_path / "absent.jsonl") == []


def test_collect_reads_a_run_extended_past_the_configs_rounds_at_those_rounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A 2-round config's run extended with ``--rounds 3`` was tabulated at round 3 as
    "3/3": another round than the config's, said to be the config's plan. The table reads
    it at the rounds asked: the config's 2, or 3 with ``--rounds 3``."""
    from lowband.cli import main

    papers = _toy(tmp_path, rounds=2)
    monkeypatch.chdir(tmp_path)
    args = ["reproduce", "toy", "--experiments", str(papers), "--out", "out"]
    assert main(args) == 0
    at2, _ = _collected(papers, capsys)
    assert main([*args, "--rounds", "3"]) == 0
    rows, err = _collected(papers, capsys)
    assert rows["t/acc"][4:6] == [at2["t/acc"][4], "2/2"] and rows["t/at3"][4:6] == ["", "2/2 (at 3)"] and not err
    assert rows["t/acc"][6] == at2["t/acc"][6]  # the compute of the rounds read
    rows, _ = _collected(papers, capsys, "--rounds", "3")
    assert rows["t/acc"][5] == "3/3" and rows["t/at3"][4] == rows["t/acc"][4] != at2["t/acc"][4]


