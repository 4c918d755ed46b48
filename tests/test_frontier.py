"""``lowband frontier`` (lowband.tradeoff): the grid runs through the sweep runner and
writes frontier.csv/.md/.png; Pareto marking on a hand-made table; a second invocation
redoes nothing; a cell its method cannot run is skipped with the reason; bad arguments
exit 2 with one line."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import digits_config
import lowband.batch
from lowband.batch import BatchError, raw_config
from lowband.cli import main
from lowband.config import ConfigError, load_experiment
from lowband.tradeoff import cell_raw, frontier_markdown, pareto_mask, parse_codecs, parse_methods, run_frontier

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def base_cfg(tmp_path: Path) -> Path:
    cfg = digits_config(tmp_path, "fedavg", rounds=2)
    cfg.pop("out_dir")
    cfg["eval"] = {"protocols": ["global"], "target": 0.2}
    path = tmp_path / "base.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path


# --------------------------------------------------------------------------- pure parts


def test_pareto_mask_on_a_hand_made_table() -> None:
    #            acc    bytes
    points = [(0.80, 100.0),  # A: optimal (cheapest)
              (0.85, 300.0),  # B: optimal (more acc, more bytes)
              (0.84, 400.0),  # C: dominated by B (less acc, more bytes)
              (0.90, 1000.0),  # D: optimal (best acc)
              (0.80, 150.0),  # E: dominated by A (same acc, more bytes)
              (0.70, 100.0),  # F: dominated by A (same bytes, less acc)
              (None, 10.0),  # G: not measured: never optimal
              (0.85, 300.0)]  # H: a tie with B: both optimal
    assert pareto_mask(points) == [True, True, False, True, False, False, False, True]
    assert pareto_mask([]) == []


def test_parse_methods_codecs_and_cell_config() -> None:
    assert parse_methods("fedavg,fedavg(server_opt=adam,server_lr=0.01),kta") == [
        ("fedavg", {"name": "fedavg"}),
        ("fedavg(server_opt=adam,server_lr=0.01)", {"name": "fedavg", "server_opt": "adam", "server_lr": 0.01}),
        ("kta", {"name": "kta"})]
    assert parse_codecs("fp32,ef(topk(0.01)),qsgd(4)") == ["fp32", "ef(topk(0.01))", "qsgd(4)"]
    for bad in ("nosuch", "fedavg,fedavg", "fedavg(server_opt=adam"):
        with pytest.raises(ConfigError, match="--methods"):
            parse_methods(bad)
    for bad in ("fp32,fp32", "topk(", "zzz"):
        with pytest.raises(ConfigError, match="--codecs"):
            parse_codecs(bad)
    base = {"algorithm": {"name": "fedavg", "lr": 0.05, "local_epochs": 1}, "comm": {"codec": "fp32"}}
    raw, notes = cell_raw(base, {"name": "fedavg"}, "ef(topk(0.01))")
    assert raw["algorithm"]["upload"] == "delta" and notes == ["upload=delta"]
    assert raw["comm"]["by_direction"] == {"up": "ef(topk(0.01))"}
    raw, notes = cell_raw(base, {"name": "fedavg"}, "fp32")
    assert "upload" not in raw["algorithm"] and notes == []
    raw, _ = cell_raw(base, {"name": "dpsgd"}, "qsgd(4)")  # no upload knob, no local_epochs
    assert "upload" not in raw["algorithm"] and "local_epochs" not in raw["algorithm"]


def test_markdown_marks_pareto_and_lists_skipped() -> None:
    row = {"status": "ok", "reason": "", "notes": "", "metric": "global/acc", "target": None, "reached": 0,
           "n": 1, "final_std": None, "bytes_up": 1.0, "bytes_to_target": None, "rounds_to_target": None,
           "sim_time_s": None, "time_to_target_s": None, "pareto_time": None}
    rows = [{**row, "method": "fedavg", "codec": "fp32", "final": 0.9, "bytes_total": 1e6, "pareto_bytes": True},
            {**row, "method": "fedavg", "codec": "fp16", "final": 0.8, "bytes_total": 2e6, "pareto_bytes": False},
            {"method": "kta", "codec": "fp32", "status": "skipped", "reason": "needs a public set"}]
    md = frontier_markdown(rows)
    lines = [ln for ln in md.splitlines() if ln.startswith("| fedavg")]
    assert lines[0].rstrip(" |").endswith("| * | 1") and lines[1].endswith("|  | 1 |")
    assert "- kta x fp32: skipped: needs a public set" in md


def _fake_cell(root: Path, codec: str, summary: dict, metrics: list[dict]) -> "FrontierCell":
    """A finished one-run frontier cell written by hand: summary.json and metrics.jsonl."""
    import json

    from lowband.batch import Cell
    from lowband.tradeoff import FrontierCell

    d = root / codec
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"main_metric": "global/acc", "target": None, "bytes_down": 0,
                                                "bytes_peer": 0, "declared_bytes_up": 0, "declared_bytes_down": 0,
                                                "declared_bytes_peer": 0, **summary}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return FrontierCell("m", codec, Cell({"method": "m", "codec": codec}, d, {}))


def test_frontier_bytes_count_declared_bytes_like_retime_and_the_link_time(tmp_path: Path) -> None:
    """A declared payload (NTK-DFL's Jacobians) is counted, never built, and the link model
    times it: the frontier's total bytes and bytes to target must count it as retime.csv and
    compare's bytes plot do, or a cell that declares 500 MB reads as the cheapest and is
    marked Pareto-optimal over one that sends 1 MB."""
    from lowband.tradeoff import frontier_rows

    light = _fake_cell(tmp_path, "a", {"final": {"global/acc": 0.9}, "bytes_up": 1_000_000, "target": 0.5,
                                       "rounds_to_target": 1, "bytes_to_target": 500_000,
                                       "declared_bytes_to_target": 0},
                       [{"round": 1, "global/acc": 0.9, "bytes/total": 1_000_000, "declared/total": 0}])
    heavy = _fake_cell(tmp_path, "b", {"final": {"global/acc": 0.8}, "bytes_up": 1_000, "bytes_peer": 0,
                                       "declared_bytes_peer": 500_000_000, "target": 0.5, "rounds_to_target": 1,
                                       "bytes_to_target": 1_000, "declared_bytes_to_target": 500_000_000},
                       [{"round": 1, "global/acc": 0.8, "bytes/total": 1_000, "declared/total": 500_000_000}])
    rows = frontier_rows([light, heavy], None)
    assert [r["bytes_total"] for r in rows] == [1_000_000, 500_001_000]
    assert [r["bytes_to_target"] for r in rows] == [500_000, 500_001_000]
    assert [r["pareto_bytes"] for r in rows] == [True, False]  # the heavy cell is dominated: less acc, more bytes


def test_frontier_pareto_minimises_a_loss_main_metric(tmp_path: Path) -> None:
    """With ``eval.main = "global/loss"`` a lower value is better: the cell with the lower
    loss for fewer bytes is the only Pareto-optimal one (a mask that maximises the metric
    would mark the worse cell instead)."""
    from lowband.tradeoff import frontier_rows

    good = _fake_cell(tmp_path, "a", {"main_metric": "global/loss", "final": {"global/loss": 0.3},
                                      "bytes_up": 1_000}, [])
    bad = _fake_cell(tmp_path, "b", {"main_metric": "global/loss", "final": {"global/loss": 0.9},
                                     "bytes_up": 2_000}, [])
    rows = frontier_rows([good, bad], None)
    assert [r["pareto_bytes"] for r in rows] == [True, False]
    md = frontier_markdown(rows)
    assert "final (mean ± std)" in md and "at most its global/loss" in md


def test_retime_time_to_target_reached_at_round_0_is_0_not_missing(tmp_path: Path, monkeypatch) -> None:
    """A target the initial model already meets has rounds_to_target = 0 (round 0 is
    evaluated): its simulated time to target is 0 s, as the frontier's own
    time_to_target_s says, not "not reached" (None), which would also drop the cell from
    the time-to-target ranking."""
    import lowband.tradeoff as tr

    cell = _fake_cell(tmp_path, "a", {"final": {"global/acc": 0.9}, "bytes_up": 10, "target": 0.05,
                                      "rounds_to_target": 0, "bytes_to_target": 0, "declared_bytes_to_target": 0},
                      [{"round": 0, "global/acc": 0.1, "bytes/total": 0, "declared/total": 0},
                       {"round": 2, "global/acc": 0.9, "bytes/total": 10, "declared/total": 0}])
    monkeypatch.setattr(tr, "retime_run", lambda d, presets, data_dir=None: {
        p: [{"round": 1, "time/round_s": 1.5, "time/sim_s": 1.5}, {"round": 2, "time/round_s": 2.0,
                                                                    "time/sim_s": 3.5}] for p in presets})
    row = tr._retime_one(cell.cell.dir, ["lte"], None)
    assert row["lte_s"] == 3.5 and row["lte_to_target_s"] == 0.0


def test_retime_a_cell_whose_runs_never_measured_the_metric_is_not_ranked(tmp_path: Path, monkeypatch) -> None:
    """A cell whose every run has a null final metric (frontier.csv writes its ``final``
    empty) crashed `lowband retime` (``float("")``). It is re-timed, but it gets no rank and
    no Pareto mark (it cannot be placed in a trade-off: ranked by bytes it would have read
    as the cheapest) and reads "not measured" in retime.md; the measured cells rank among
    themselves."""
    import json

    import lowband.tradeoff as tr
    from lowband.export import records_csv_text

    def run(d: Path, final: float | None, total: int, seed: int | None = None) -> None:
        d.mkdir(parents=True)
        (d / "config.toml").write_text("")
        (d / "summary.json").write_text(json.dumps({"main_metric": "global/acc", "final": {"global/acc": final},
                                                    "seed": seed, "rounds_completed": 2, "rounds_to_target": None,
                                                    "bytes_to_target": None}))
        (d / "metrics.jsonl").write_text(json.dumps({"round": 2, "global/acc": final, "bytes/up": total // 2,
                                                     "declared/up": 0, "bytes/total": total,
                                                     "declared/total": 0}) + "\n")

    run(tmp_path / "a", 0.9, 3_000)
    for s in (0, 1):  # two seeds, neither measured the metric: the cell is the cheapest by bytes
        run(tmp_path / "b" / f"seed-{s}", None, 1_000, seed=s)
    run(tmp_path / "c", 0.8, 2_000)
    cells = [{"method": "m", "codec": c, "status": "ok", "metric": "global/acc", "final": f, "dir": c}
             for c, f in (("a", 0.9), ("b", None), ("c", 0.8))]
    (tmp_path / "frontier.csv").write_text(records_csv_text(cells, ["method", "codec", "status", "metric", "final",
                                                                    "dir"]))
    monkeypatch.setattr(tr, "retime_run", lambda d, presets, data_dir=None: {
        p: [{"round": 1, "time/round_s": 1.0, "time/sim_s": 1.0},
            {"round": 2, "time/round_s": 1.0, "time/sim_s": 2.0}] for p in presets})
    rows = tr.retime_frontier(tmp_path, ["lte"])
    assert [r["final"] for r in rows] == [0.9, None, 0.8]
    assert [r["bytes_total"] for r in rows] == [3_000, 1_000, 2_000]  # re-timed all the same
    assert [r["rank_bytes"] for r in rows] == [2, None, 1]
    assert [r["pareto_bytes"] for r in rows] == [True, None, True]
    assert [r["rank_lte"] for r in rows] == [1, None, 1] and [r["pareto_lte"] for r in rows] == [True, None, False]
    csv_rows = list(csv.DictReader(io.StringIO((tmp_path / "retime.csv").read_text())))
    assert [(r["final"], r["rank_bytes"], r["pareto_bytes"]) for r in csv_rows][1] == ("", "", "")
    md = (tmp_path / "retime.md").read_text()
    line_b = next(ln for ln in md.splitlines() if ln.startswith("| m | `b`"))
    assert "not measured" in line_b and "*" not in line_b and "(" not in line_b.replace("`b`", "")
    assert "Not measured (no run of the cell has a final global/acc" in md and ": m/b" in md


# --------------------------------------------------------------------------- runs


def test_frontier_runs_writes_files_resumes_and_skips(tmp_path: Path, capsys) -> None:
    cfg = base_cfg(tmp_path)
    out = tmp_path / "front"
    # dpsgd on a star cannot run: its cells are skipped with the validator's reason
    rc, stdout, err = cli(capsys, "frontier", cfg, "--methods", "fedavg,dpsgd", "--codecs", "fp32,ef(topk(0.1))",
                          "--link", "lte", "--out", out, "--workers", "1", "--quiet")
    assert rc == 0, err
    for f in ("frontier.csv", "frontier.md", "frontier.png"):
        assert (out / f).exists(), f
    assert (out / "frontier.png").read_bytes()[:8] == PNG_MAGIC
    rows = list(csv.DictReader(io.StringIO((out / "frontier.csv").read_text())))
    assert [(r["method"], r["codec"], r["status"]) for r in rows] == [
        ("fedavg", "fp32", "ok"), ("fedavg", "ef(topk(0.1))", "ok"),
        ("dpsgd", "fp32", "skipped"), ("dpsgd", "ef(topk(0.1))", "skipped")]
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert all(r["reason"] and "\n" not in r["reason"] for r in skipped)
    assert f"skipped dpsgd x fp32: {skipped[0]['reason']}" in err
    ok = {r["codec"]: r for r in rows if r["status"] == "ok"}
    # the codec really went on the uplink (delta upload): top-k 10% sends far fewer bytes up
    assert float(ok["ef(topk(0.1))"]["bytes_up"]) < 0.5 * float(ok["fp32"]["bytes_up"])
    assert ok["ef(topk(0.1))"]["notes"] == "upload=delta"
    assert float(ok["fp32"]["sim_time_s"]) > 0  # --link gives simulated time
    assert 0 < float(ok["fp32"]["final"]) <= 1
    # Pareto by bytes: the cheaper cell is optimal; the fp32 one only if it is more accurate
    acc = {c: float(r["final"]) for c, r in ok.items()}
    assert ok["ef(topk(0.1))"]["pareto_bytes"] == "True"
    assert ok["fp32"]["pareto_bytes"] == str(acc["fp32"] > acc["ef(topk(0.1))"])
    md = (out / "frontier.md").read_text()
    assert "Pareto (time)" in md and "Not run:" in md and "dpsgd x fp32: skipped" in md
    # the cell configs carry the method and the uplink codec
    cell_toml = (out / ok["ef(topk(0.1))"]["dir"] / "config.toml").read_text()
    assert 'up = "ef(topk(0.1))"' in cell_toml and 'upload = "delta"' in cell_toml

    summaries = sorted(out.rglob("summary.json"))
    assert len(summaries) == 2
    before = {p: p.stat().st_mtime_ns for p in summaries}
    res = run_frontier(raw_config(load_experiment(cfg, [])), "fedavg,dpsgd", "fp32,ef(topk(0.1))", link="lte",
                       out=out, workers=1, progress=False)
    assert res.ran == []  # nothing re-ran
    assert {p: p.stat().st_mtime_ns for p in summaries} == before
    assert [r["status"] for r in res.rows] == ["ok", "ok", "skipped", "skipped"]


def test_frontier_with_seeds(tmp_path: Path, capsys) -> None:
    cfg = base_cfg(tmp_path)
    out = tmp_path / "front"
    rc, _, err = cli(capsys, "frontier", cfg, "rounds=2", "--methods", "fedavg", "--codecs", "fp32,qsgd(4)",
                     "--seeds", "0,1", "--out", out, "--workers", "1", "--quiet")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO((out / "frontier.csv").read_text())))
    assert [r["n"] for r in rows] == ["2", "2"] and rows[0]["seeds"] == "0;1"
    assert all(r["final_std"] != "" for r in rows)
    assert all((out / r["dir"] / "aggregate.json").exists() for r in rows)
    assert "sim time" not in (out / "frontier.md").read_text()  # no link: no time columns


@pytest.mark.parametrize("args, needle", [
    (["--methods", "nosuch", "--codecs", "fp32"], "unknown method"),
    (["--methods", "fedavg", "--codecs", "zzz(1)"], "--codecs"),
    (["--methods", "fedavg", "--codecs", "fp32", "--link", "carrier-pigeon"], "link preset"),
    (["--methods", "fedavg", "--codecs", "fp32", "--seeds", "x"], "--seeds"),
    (["--methods", "fedavg", "--codecs", "fp32", "--workers", "0"], "--workers"),
    (["--methods", "dpsgd", "--codecs", "fp32"], "every cell was skipped"),
    (["--methods", "fedavg", "--codecs", "fp32", "--target", "2"], "eval.target"),
    (["comm.by_kind.delta=fp16", "--methods", "fedavg", "--codecs", "fp32"], "comm.by_kind.delta"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys, args, needle) -> None:
    cfg = base_cfg(tmp_path)
    out = tmp_path / "front"
    rc, _, err = cli(capsys, "frontier", cfg, *args, "--out", out, "--quiet")
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lowband: error:") and needle in lines[0], err
    assert not out.exists()  # nothing written


def test_a_failed_run_is_reported_and_the_others_tabulated(tmp_path: Path, monkeypatch) -> None:
    real = lowband.batch.run_job

    def flaky(job, progress=None):
        if "qsgd" in job.label:
            return {"index": job.index, "status": "failed", "error": "RuntimeError: boom", "run_dir": None,
                    "seconds": 0.0}
        return real(job, progress)

    monkeypatch.setattr(lowband.batch, "run_job", flaky)
    out = tmp_path / "front"
    with pytest.raises(BatchError, match="boom"):
        run_frontier(raw_config(load_experiment(base_cfg(tmp_path), [])), "fedavg", "fp32,qsgd(4)", out=out,
                     workers=1, progress=False)
    rows = list(csv.DictReader(io.StringIO((out / "frontier.csv").read_text())))
    assert [(r["codec"], r["status"]) for r in rows] == [("fp32", "ok"), ("qsgd(4)", "failed")]
    assert rows[0]["pareto_bytes"] == "True" and rows[1]["pareto_bytes"] == "False"


def test_the_shipped_fmnist_frontier_config_runs_every_cell(tmp_path: Path) -> None:
    """experiments/frontier/fmnist.toml (validated only, not run): FMNIST Dir 0.3, 100
    clients, and every cell of its documented grid (FedAvg, FedAdam, FedYogi, FedCSPACK, KTA
    x four codecs) can run but the two refused pairs."""
    from lowband.tradeoff import frontier_cells

    path = Path(__file__).resolve().parents[1] / "experiments" / "frontier" / "fmnist.toml"
    text = path.read_text()
    exp = load_experiment(path, [])
    assert (exp.data.dataset, exp.data.num_clients, exp.data.alpha) == ("fashion_mnist", 100, 0.3)
    methods = "fedavg,fedavg(server_opt=adam),fedavg(server_opt=yogi),fedcspack,kta"
    codecs = "fp32,ef(topk(0.01)),qsgd(4),powersgd(2)"
    assert f'--methods "{methods}"' in text and f'--codecs "{codecs}"' in text
    raw = raw_config(exp)
    raw["links"] = {"preset": "lte"}
    cells = frontier_cells(raw, parse_methods(methods), parse_codecs(codecs), tmp_path, None)
    assert len(cells) == 20
    skipped = {(c.method, c.codec): c.reason for c in cells if c.status != "ok"}
    # a codec with sender state on FedCSPACK's variable packs is refused (the rest runs)
    assert set(skipped) == {("fedcspack", "ef(topk(0.01))"), ("fedcspack", "powersgd(2)")}, skipped
    assert all("fedcspack's 'packs'" in r for r in skipped.values())


def test_python_api_frontier(tmp_path: Path) -> None:
    import lowband as lb

    cfg = digits_config(tmp_path, "fedavg", rounds=2)
    cfg.pop("out_dir")
    res = lb.frontier(cfg, methods=["fedavg", "fedavg(server_opt=adam)"], codecs=["fp32"], out=tmp_path / "f",
                      workers=1)
    assert [r["method"] for r in res.rows] == ["fedavg", "fedavg(server_opt=adam)"]
    assert all(r["status"] == "ok" for r in res.rows) and (res.out / "frontier.md").exists()
    toml = (res.out / res.rows[1]["dir"] / "config.toml").read_text()
    assert 'server_opt = "adam"' in toml


def test_retime_replays_the_ledgers_on_other_links(tmp_path: Path, capsys) -> None:
    """`lowband retime`: under the frontier's own link the re-timed simulated times equal the
    runs' time/sim_s exactly; under LoRaWAN SF12 they follow the uplink's bytes (the lossy
    codec is ranked cheaper by far); ranks, Pareto marks and the difference list are written;
    bad input exits 2 with one line."""
    from lowband.comm.links import PRESETS, transmit
    from lowband.tradeoff import retime_run

    cfg = base_cfg(tmp_path)
    out = tmp_path / "f"
    rc, _, err = cli(capsys, "frontier", cfg, "--methods", "fedavg", "--codecs", "fp32,qsgd(2)", "--link", "lte",
                     "--out", out, "--workers", "1", "--quiet")
    assert rc == 0, err
    rc, stdout, err = cli(capsys, "retime", out, "--links", "lte,lorawan_sf12")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO((out / "retime.csv").read_text())))
    assert [(r["method"], r["codec"]) for r in rows] == [("fedavg", "fp32"), ("fedavg", "qsgd(2)")]
    front = list(csv.DictReader(io.StringIO((out / "frontier.csv").read_text())))
    for r, f in zip(rows, front):
        assert float(r["lte_s"]) == float(f["sim_time_s"])  # the frontier ran on LTE: exactly its times
        assert float(r["lorawan_sf12_s"]) > 1000 * float(r["lte_s"])
    assert [r["rank_lorawan_sf12"] for r in rows] == ["2", "1"] and [r["rank_bytes"] for r in rows] == ["2", "1"]
    assert "lorawan_sf12_j" in rows[0] and float(rows[0]["lorawan_sf12_j"]) > float(rows[1]["lorawan_sf12_j"]) > 0
    assert "Rankings by bytes and by time" in stdout and "wrote" in stdout
    # round 1 of the fp32 cell by hand: the slowest of the 4 sampled clients on SF12
    run = out / front[0]["dir"]
    recs = retime_run(run, ["lorawan_sf12"])["lorawan_sf12"]
    led = [ln.split(",") for ln in (run / "ledger.csv").read_text().splitlines()[1:]]
    sf12 = PRESETS["lorawan_sf12"]
    down = {int(x[2]): int(x[5]) for x in led if x[0] == "1" and x[3] == "down"}
    up = {int(x[1]): int(x[5]) for x in led if x[0] == "1" and x[3] == "up"}
    per = [transmit(sf12.down, down[c]).arrival + transmit(sf12.up, up[c]).arrival for c in down]
    assert recs[0]["time/round_s"] == pytest.approx(max(per), rel=1e-3)  # + the clients' compute (ms)
    assert recs[0]["time/round_s"] >= max(per)
    rc, _, err = cli(capsys, "retime", out, "--links", "lte,lora")
    assert rc == 2 and "unknown link preset 'lora'" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli(capsys, "retime", tmp_path, "--links", "lte")
    assert rc == 2 and "no frontier.csv" in err


def test_the_fmnist_frontier_grid_smoke_on_digits(tmp_path: Path) -> None:
    """The grid of experiments/frontier/fmnist.toml (FedAvg, FedAdam, FedYogi, FedCSPACK, KTA
    x fp32, ef(topk), qsgd, powersgd), 2 rounds on the digits federation: every cell but the
    two refused ones finishes, and the server optimisers really differ from FedAvg. (About 6 s.)"""
    import re

    text = (Path(__file__).resolve().parents[1] / "experiments" / "frontier" / "fmnist.toml").read_text()
    methods = re.search(r'--methods "([^"]+)"', text).group(1)
    codecs = re.search(r'--codecs "([^"]+)"', text).group(1)
    base = digits_config(tmp_path, "fedavg", rounds=2)
    base.pop("out_dir")
    base["data"]["public_size"] = 100
    base["eval"] = {"protocols": ["personal"], "main": "personal/acc_weighted"}
    res = run_frontier(base, methods, codecs, out=tmp_path / "f", workers=1, backend="serial", progress=False)
    status = {(r["method"], r["codec"]): r["status"] for r in res.rows}
    assert len(status) == 20
    assert {k for k, v in status.items() if v != "ok"} == {("fedcspack", "ef(topk(0.01))"),
                                                         ("fedcspack", "powersgd(2)")}
    final = {(r["method"], r["codec"]): r["final"] for r in res.rows if r["status"] == "ok"}
    # (FedAdam and FedYogi differ only in how v grows, which 2 rounds barely show)
    assert final[("fedavg", "fp32")] != final[("fedavg(server_opt=adam)", "fp32")]
    assert final[("fedavg", "fp32")] != final[("fedavg(server_opt=yogi)", "fp32")]


def test_retime_a_frontier_with_seeds_averages_its_seeds(tmp_path: Path, capsys) -> None:
    """`lowband retime` on a `--seeds` frontier: every seed folder is re-timed; under the
    frontier's own link a cell's time is the mean of its seeds' time/sim_s, which is
    frontier.csv's sim_time_s."""
    import json
    import statistics

    cfg = base_cfg(tmp_path)
    out = tmp_path / "f"
    rc, _, err = cli(capsys, "frontier", cfg, "rounds=1", "--methods", "fedavg", "--codecs", "fp32,qsgd(2)",
                     "--link", "lte", "--seeds", "0,1", "--out", out, "--workers", "1", "--quiet")
    assert rc == 0, err
    rc, _, err = cli(capsys, "retime", out, "--links", "lte,lorawan_sf12")
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO((out / "retime.csv").read_text())))
    front = list(csv.DictReader(io.StringIO((out / "frontier.csv").read_text())))
    assert [(r["method"], r["codec"]) for r in rows] == [("fedavg", "fp32"), ("fedavg", "qsgd(2)")]
    for r, f in zip(rows, front):
        seeds = [json.loads((out / f["dir"] / f"seed-{s}" / "summary.json").read_text()) for s in (0, 1)]
        assert float(r["lte_s"]) == pytest.approx(statistics.mean(s["sim_time_s"] for s in seeds), rel=1e-12)
        assert float(r["lte_s"]) == pytest.approx(float(f["sim_time_s"]), rel=1e-12)
        assert float(r["bytes_total"]) == pytest.approx(float(f["bytes_total"]), rel=1e-12)
        assert float(r["lorawan_sf12_s"]) > 1000 * float(r["lte_s"])
    assert [r["rank_lorawan_sf12"] for r in rows] == ["2", "1"]
