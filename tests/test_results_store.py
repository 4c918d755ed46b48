"""Results as records (DESIGN.md, "Results are records, not tables"): the run record, the
store, tables rendered from the store alone, prose numbers traced to it, and
``lowband reproduce --verify``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import as_written, digits_config
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.reproduce.cells import load_cells
from lowband.results.table import table_markdown
from lowband.results import record as recmod
from lowband.results.pages import derived_numbers, imported_numbers, misderived, unsourced
from lowband.results.record import code_commit, read_record, write_record
from lowband.results.store import Store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def _run(tmp_path: Path, rounds: int = 3, **over: object) -> Path:
    cfg = {**digits_config(tmp_path, "fedavg", rounds=rounds), **over}
    Simulation(validate(cfg)).run()
    return Path(cfg["out_dir"])


# --------------------------------------------------------------------------- the record

def test_record_holds_the_runs_metrics_ledger_commits_and_time(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    path = write_record(rd)
    assert path == rd / "record.jsonl" and path.stat().st_size < 20_000  # a few kB
    rec = read_record(path)
    metrics = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    assert rec.metrics == metrics  # every metric of every evaluated round, exactly
    summary = json.loads((rd / "summary.json").read_text())
    assert rec.header["summary"] == summary and rec.header["rounds_done"] == 3
    # the ledger's per-round totals by direction and kind add up to what the run counted
    up = sum(v[0] for x in rec.rounds for k, v in (x.get("ledger") or {}).items() if k.startswith("up/"))
    assert up == metrics[-1]["bytes/up"] > 0
    # each round names the code that computed it; the header collects them
    assert {x["commit"] for x in rec.rounds if x["round"] >= 1} == {code_commit()}
    assert rec.header["commits"] == [code_commit()] and code_commit()
    assert rec.header["machine"]["torch"] and rec.header["machine"]["of"] == "run"
    assert rec.header["cpu_s"] is not None and rec.header["cpu_s"] > 0
    assert len(rec.header["fingerprint"]) == 12


def test_every_run_writes_its_record_beside_its_metrics(tmp_path: Path) -> None:
    """The run itself writes record.jsonl (the RecordWriter observer, last of the defaults):
    nobody calls write_record, and the record equals the one built from the finished folder."""
    from lowband.engine.observers import RecordWriter

    rd = _run(tmp_path)
    rec = read_record(rd / "record.jsonl")
    assert rec.metrics == [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    assert rec.header["summary"] == json.loads((rd / "summary.json").read_text())
    again = recmod.build_record(rd)  # from the files written after the observer's last hook
    assert rec.rounds == again[1:] and rec.header["summary"] == again[0]["summary"]
    cfg = digits_config(tmp_path / "x", "fedavg", rounds=1)
    sim = Simulation(validate(cfg))
    assert isinstance(sim.observers[-1], RecordWriter)
    sim.observers.pop()  # without the observer, no record: the test above is the observer's
    sim.run()
    assert not (Path(cfg["out_dir"]) / "record.jsonl").exists()


def test_a_flower_run_writes_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower is a backend of the same driver: its run folder has the same record."""
    pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")
    from flwr.supercore.task_identity import TaskIdentity

    import test_flower as tf
    from lowband.flower import FlowerRun, client_app

    for attr, v in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, attr, v)
    exp = validate(tf._cnn_config(tmp_path, "flower", "fedavg"))
    FlowerRun(exp, tf.InProcessGrid(client_app(exp), 6)).run()
    rd = tmp_path / "flower"
    rec = read_record(rd / "record.jsonl")
    assert rec.metrics == [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    assert rec.rounds == recmod.build_record(rd)[1:]


def test_a_run_cut_short_keeps_a_partial_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lowband.engine.observers import record as obsrec

    monkeypatch.setattr(obsrec, "PARTIAL_EVERY_S", 0.0)
    cfg = digits_config(tmp_path, "fedavg", rounds=3)
    sim = Simulation(validate(cfg))
    sim.observers[-1].on_run_end = lambda run, summary: None  # the run ends before its last hook
    sim.run()
    rec = read_record(Path(cfg["out_dir"]) / "record.jsonl")
    assert [m["round"] for m in rec.metrics][-1] == 2 and rec.header["summary"] == {}


def test_fingerprint_ignores_seed_and_rounds_but_not_the_method(tmp_path: Path) -> None:
    a = read_record(write_record(_run(tmp_path / "a", rounds=1)))
    b = read_record(write_record(_run(tmp_path / "b", rounds=2, seed=5)))
    cfg = digits_config(tmp_path / "c", "fedavg", rounds=1)
    cfg["algorithm"]["lr"] = 0.01
    Simulation(validate(cfg)).run()
    c = read_record(write_record(Path(cfg["out_dir"])))
    assert a.header["fingerprint"] == b.header["fingerprint"] != c.header["fingerprint"]


def test_a_key_added_with_its_default_leaves_the_fingerprint_alone() -> None:
    """A config saved before a schema key existed (e.g. ``comm.freshness``) and the same config
    written by newer code with that key at its default are one config; a non-default value is not."""
    import tomli_w

    from lowband.results.record import fingerprint

    cfg = digits_config(Path("/tmp/unused"), "fedavg", rounds=1)
    older = tomli_w.dumps(cfg)
    newer = tomli_w.dumps({**cfg, "comm": {**cfg.get("comm", {}), "freshness": False}})
    changed = tomli_w.dumps({**cfg, "comm": {**cfg.get("comm", {}), "freshness": True}})
    assert fingerprint(older) == fingerprint(newer) != fingerprint(changed)


def test_a_large_record_is_gzipped_and_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rd = _run(tmp_path, rounds=2)
    plain = read_record(write_record(rd))
    monkeypatch.setattr(recmod, "GZIP_ABOVE", 100)
    path = write_record(rd)
    assert path.name == "record.jsonl.gz" and not (rd / "record.jsonl").exists()
    assert read_record(path).metrics == plain.metrics


def test_record_import_cli(tmp_path: Path) -> None:
    rd = _run(tmp_path, rounds=1)
    out = subprocess.run([sys.executable, "-m", "lowband.cli", "record", "import", str(rd), "--commit", "abc1234"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rec = read_record(rd / "record.jsonl")
    assert rec.header["machine"]["of"] == "import" and rec.metrics
    bad = subprocess.run([sys.executable, "-m", "lowband.cli", "record", "import", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "not a run folder" in bad.stderr


# --------------------------------------------------------------------------- the store and the tables

@pytest.mark.parametrize("paper", sorted(p.name.removesuffix("_table.md") for p in RESULTS.glob("*_table.md")))
def test_pages_are_rendered_from_the_store_alone(paper: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No run folder anywhere (an empty working folder): the store renders the committed page
    byte for byte."""
    monkeypatch.chdir(tmp_path)
    cells = load_cells(paper, ROOT)
    store = Store(RESULTS / "records", paper)
    md = table_markdown(paper, cells, store)
    assert md + "\n" == (RESULTS / f"{paper}_table.md").read_text()
    assert not (tmp_path / "runs").exists()


def test_every_published_cell_value_is_in_the_store() -> None:
    for page in RESULTS.glob("*_table.md"):
        paper = page.name.removesuffix("_table.md")
        store = Store(RESULTS / "records", paper)
        shown = {c.id for c in load_cells(paper, ROOT) if store.records(c.config)} | set(store.imported())
        for line in page.read_text().splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) == 7 and cols[4] and cols[0] not in ("cell", "---"):
                assert cols[0] in shown, (page.name, cols[0])


@pytest.mark.parametrize("page", sorted(p.name for p in RESULTS.glob("*.md") if not p.name.endswith("_table.md")))
def test_every_number_quoted_in_a_results_page_is_in_the_store(page: str) -> None:
    assert unsourced(RESULTS, page) == []
    assert misderived(RESULTS, page) == []  # each derived number recomputed from its record


def test_natural_pages_numbers_are_derived_from_its_measured_records() -> None:
    """natural.md's 20-round numbers are recomputed from the committed records, and kept apart
    from the imported numbers of the runs whose folders are gone."""
    derived = {n for n, _ in derived_numbers(RESULTS, "natural.md")}
    assert {"19.35", "3.13", "8.25", "23.2", "654.4", "13.2", "2.0", "19.40"} <= derived
    assert not derived & imported_numbers(RESULTS, "natural.md")


def test_editing_a_record_or_a_page_number_breaks_the_prose_check(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    assert misderived(results, "natural.md") == [] and unsourced(results, "natural.md") == []
    rec = results / "records" / "natural" / "shakespeare_fedadam" / "seed-0.jsonl"
    rec.write_text(rec.read_text().replace('"global/acc": 0.1940000057220459', '"global/acc": 0.1950000057220459'))
    assert any("19.40 is 100 * a = 19.50" in x for x in misderived(results, "natural.md"))
    shutil.copy(RESULTS / "records" / "natural" / "shakespeare_fedadam" / "seed-0.jsonl", rec)
    page = results / "natural.md"
    page.write_text(page.read_text().replace("and FedAdam 19.40%", "and FedAdam 19.45%"))
    assert unsourced(results, "natural.md") == ["19.45"]
    assert any("does not quote it" in x for x in misderived(results, "natural.md"))


def _toy_paper(tmp_path: Path) -> tuple[Path, Path]:
    exp = tmp_path / "experiments" / "toy"
    exp.mkdir(parents=True)
    cfg = digits_config(tmp_path, "fedavg", rounds=2)
    cfg["out_dir"] = str(tmp_path / "runs" / "toy")
    import tomli_w

    (exp / "fedavg.toml").write_bytes(tomli_w.dumps(cfg).encode())
    (exp / "reproduce.toml").write_text('paper = "toy"\n\n[[run]]\nid = "t/acc"\ntable = "t"\n'
                                        'config = "experiments/toy/fedavg.toml"\nmetric = "personal/acc_weighted"\n')
    return exp / "fedavg.toml", Path(cfg["out_dir"])


def test_records_of_other_code_are_shown_with_their_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, rd = _toy_paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    Simulation(validate(__import__("lowband.config", fromlist=["load_toml"]).load_toml(config))).run()
    store = Store(tmp_path / "records", "toy")
    store.put(str(config), rd)
    cells = load_cells("toy", tmp_path)
    one = table_markdown("toy", cells, store)
    assert f"commit {code_commit()[:7]}" in one and "made by different code:" not in one
    # seed 7 made by an older commit (its record says so): the table names both and does not mix silently
    lines = recmod.build_record(rd)
    lines[0]["seed"], lines[0]["commits"] = 7, ["0123456789abcdef"]
    for x in lines[1:]:
        x["commit"] = "0123456789abcdef"
    store.put_record(str(config), lines)
    two = table_markdown("toy", cells, store)
    assert "made by different code: " in two and "0123456 (seed 7)" in two


def test_reproduce_records_its_runs_and_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, rd = _toy_paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    from lowband.cli import main

    assert main(["reproduce", "toy", "--store", "records", "--out", "out"]) == 0
    rec = read_record(tmp_path / "records" / "toy" / "fedavg" / "seed-1.jsonl")
    assert rec.header["rounds_done"] == 2
    page = (tmp_path / "out" / "toy_table.md").read_text()
    shutil.rmtree(tmp_path / "runs")  # the run folders gone: the same page
    assert main(["reproduce", "toy", "--store", "records", "--render", "--out", "again"]) == 0
    assert (tmp_path / "again" / "toy_table.md").read_text() == page
    # --verify re-runs it and finds every metric equal to the digit, naming both commits
    assert main(["reproduce", "toy", "--store", "records", "--verify", "t/acc"]) == 0


def test_verify_reports_a_difference_and_the_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    config, rd = _toy_paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    Simulation(validate(__import__("lowband.config", fromlist=["load_toml"]).load_toml(config))).run()
    lines = recmod.build_record(rd)
    lines[0]["commits"] = ["fedcba9876543210"]
    for x in lines[1:]:
        x["commit"] = "fedcba9876543210"
    lines[-1]["metrics"]["personal/acc_weighted"] += 0.01  # older code measured another number
    Store(tmp_path / "records", "toy").put_record(str(config), lines)
    from lowband.cli import main

    assert main(["reproduce", "toy", "--store", "records", "--verify", "t/acc"]) == 1
    out = capsys.readouterr().out
    assert "made by fedcba9" in out and "different" in out and "personal/acc_weighted" in out
    assert "equal " in out  # the other metrics still equal


# --------------------------------------------------------------------------- the published cells, verified

#: (paper, cell, rounds): cells whose first rounds take seconds. FOL has none: each of its configs first
#: pretrains the local models (150 epochs, about 10 CPU-minutes); KTA's page is not a reproduce table.
CHEAP = [("fedcspack", "table1/fmnist/dir0.3/fedprox", 2), ("fedcspack", "table1/fmnist/dir0.3/fedcspack_code", 2),
         ("spark", "table3/a0.3/dfedavgm", 2)]


@pytest.mark.slow  # paper cells re-run (about 50 s of the fast tier)
@pytest.mark.parametrize("paper,cell,rounds", CHEAP)
def test_published_cells_reproduce_to_the_digit(paper: str, cell: str, rounds: int, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    """A few cheap cells per paper re-run from their committed records (a minute or two in all)."""
    if not (ROOT / "experiments").is_dir() or not Path(__import__("os").environ.get("LOWBAND_DATA", "/nonexistent")
                                                       ).is_dir():
        pytest.skip("needs the datasets ($LOWBAND_DATA)")
    monkeypatch.chdir(ROOT)
    from lowband.cli import main

    args = ["reproduce", paper, "--verify", cell] + (["--rounds", str(rounds)] if rounds else [])
    rc = main(args)
    out = capsys.readouterr().out
    assert rc == 0 and "REPRODUCED" in out and "equal to the digit" in out, out


def test_collect_records_only_folders_of_todays_config_with_sound_logs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``--collect`` files the run folders present in the store; a folder made by another
    config, or whose log is damaged, is not recorded (one line says why) and the store keeps
    the record it had."""
    config, rd = _toy_paper(tmp_path)
    monkeypatch.chdir(tmp_path)
    from lowband.cli import main

    args = ["reproduce", "toy", "--store", "records", "--out", "out"]
    assert main(args) == 0
    stored = tmp_path / "records" / "toy" / "fedavg" / "seed-1.jsonl"
    before = stored.read_bytes()
    hp = rd / "hyperparams.json"
    saved = json.loads(hp.read_text())
    as_written(hp, json.dumps({**saved, "lr": saved["lr"] * 2}))  # made under another default
    capsys.readouterr()
    assert main([*args, "--collect"]) == 0
    assert "another config" in capsys.readouterr().err and stored.read_bytes() == before
    as_written(hp, json.dumps(saved))
    log = rd / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")  # damaged before its end
    assert main([*args, "--collect"]) == 2  # a damaged folder: one line, exit 2 (test_damage_matrix)
    assert "not recorded" in capsys.readouterr().err and stored.read_bytes() == before


@pytest.mark.slow  # runs a cell
def test_a_cell_made_by_older_code_names_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    """The store's FedNova Dir(0.3) record was made by the code of 5009b6e (2026-11-24): the
    re-run here names that commit and says, per metric, how far today's code is from it."""
    if not Path(__import__("os").environ.get("LOWBAND_DATA", "/nonexistent")).is_dir():
        pytest.skip("needs the datasets ($LOWBAND_DATA)")
    monkeypatch.chdir(ROOT)
    from lowband.cli import main

    rc = main(["reproduce", "fedcspack", "--verify", "table1/fmnist/dir0.3/fednova", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "made by 5009b6e" in out and "the record was made by other code (5009b6e" in out, out
    assert rc == 0 and "equal            personal/acc_weighted" in out  # the accuracies to the digit
