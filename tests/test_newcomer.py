"""What a newcomer tripped on (issue 44, item 5): bounded intervals for accuracies, the
whole-weights warning for every lossy codec, an ETA for slow rounds, refusals only where a
key is needed, distinct labels and colours, and a --plugin help that says it runs code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lowband.aggregate import metric_bounds, stats


def test_two_seed_accuracy_interval_stays_inside_0_1_and_says_it_was_clipped() -> None:
    # two seeds far apart: the raw t-interval is about -37% .. 134%
    raw = stats([0.20, 0.77])
    assert raw["ci_low"] < 0 and raw["ci_high"] > 1 and "ci_clipped" not in raw  # unbounded: keys as before
    s = stats([0.20, 0.77], metric_bounds("final/personal/acc_weighted"))
    assert s["ci_low"] == 0.0 and s["ci_high"] == 1.0 and s["ci_clipped"]
    assert s["mean"] == raw["mean"] and s["std"] == raw["std"]
    tight = stats([0.80, 0.81, 0.79], metric_bounds("global/acc"))
    assert 0 < tight["ci_low"] < tight["ci_high"] < 1 and not tight["ci_clipped"]


def test_only_accuracies_are_bounded() -> None:
    assert metric_bounds("global/acc") == (0.0, 1.0)
    assert metric_bounds("best/personal/acc_worst10") == (0.0, 1.0)
    for key in ("global/loss", "bytes_up", "rounds_to_target", "rejected/accepted", "final/consensus/loss"):
        assert metric_bounds(key) is None, key


def test_aggregate_bands_of_accuracies_are_clipped() -> None:
    from lowband.aggregate import aggregate

    runs = [({"final": {"global/acc": a}, "main_metric": "global/acc"}, [{"round": 1, "global/acc": a}])
            for a in (0.2, 0.77)]
    agg = aggregate(runs)
    assert agg["summary"]["final/global/acc"]["ci_low"] == 0.0
    row = agg["rounds"][0]
    assert row["ci_low"]["global/acc"] == 0.0 and row["ci_high"]["global/acc"] == 1.0


@pytest.mark.parametrize("spec", ["topk(0.01)", "randmask(0.1)", "sketch(3,100)", "qsgd(4)", "powersgd(2)", "sign",
                                  "qsgd(4)+fp16", "ef(topk(0.01))", "ef(sign)"])
def test_every_lossy_codec_on_whole_weights_is_warned(spec: str) -> None:
    from lowband.engine.checks import weights_lossy_term

    assert weights_lossy_term(spec) is not None


@pytest.mark.parametrize("spec", ["fp32", "fp16", "bf16", "int8", "ef21(topk(0.01))", "ef21(qsgd(4))"])
def test_fine_rounding_and_ef21_are_not_warned(spec: str) -> None:
    from lowband.engine.checks import weights_lossy_term

    assert weights_lossy_term(spec) is None


def test_eta_at_the_mean_pace_even_when_a_round_takes_minutes() -> None:
    from lowband.console import eta_seconds

    assert eta_seconds(None, 0, 10) is None and eta_seconds(5.0, 0, 10) is None
    assert eta_seconds(90.0, 1, 10) == pytest.approx(810.0)  # one 90 s round done, nine to go
    assert eta_seconds(600.0, 4, 5) == pytest.approx(150.0)
    assert eta_seconds(10.0, 5, 5) == 0.0


def test_the_bar_shows_an_eta_after_one_slow_round() -> None:
    from rich.progress import Task

    from lowband.console import _eta_column

    col = _eta_column()
    task = Task(0, "run", 10, 1, _get_time=lambda: 0.0)  # type: ignore[arg-type]
    task.start_time, task.stop_time = 0.0, 95.0  # one round of 95 s: rich's own column says -:--:--
    assert str(col.render(task)) == "eta 0:14:15"


def _base_without_algorithm(tmp: Path) -> Path:
    p = tmp / "base.toml"
    p.write_text('name = "noalg"\nrounds = 1\n[data]\ndataset = "digits"\nnum_clients = 4\n'
                 'split = [0.75, 0.0, 0.25]\n')
    return p


def test_partition_takes_a_base_config_without_an_algorithm(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    from lowband.cli import main

    cfg = _base_without_algorithm(tmp_path)
    assert main(["partition", str(cfg), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").exists() and "4 clients" in capsys.readouterr().out
    assert main(["run", str(cfg), "--quiet"]) == 2  # run still needs one
    assert "sets no algorithm.name" in capsys.readouterr().err


def test_frontier_loads_a_base_config_without_an_algorithm(tmp_path: Path) -> None:
    from lowband.config.resolve import load_experiment

    exp = load_experiment(_base_without_algorithm(tmp_path), needs_algorithm=False)
    assert exp.data.num_clients == 4
    import inspect

    from lowband import tradeoff

    assert "needs_algorithm=False" in inspect.getsource(tradeoff.cmd_frontier)


def _fake_run(path: Path, name: str, acc: float) -> Path:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "name": name, "algorithm": "fedavg", "main_metric": "global/acc", "final": {"global/acc": acc},
        "best": {"global/acc": {"value": acc, "round": 1}}, "bytes_up": 10, "bytes_down": 10, "bytes_peer": 0}))
    (path / "metrics.jsonl").write_text(json.dumps({"round": 1, "global/acc": acc, "bytes/total": 20}) + "\n")
    return path


def test_two_runs_of_one_config_get_distinct_labels(tmp_path: Path) -> None:
    from lowband.report import RunRecord, distinct_labels

    runs = [RunRecord(tmp_path / "a" / "exp", {"name": "exp"}, []), RunRecord(tmp_path / "b" / "exp", {"name": "exp"}, []),
            RunRecord(tmp_path / "c", {"name": "other"}, [])]
    distinct_labels(runs)
    assert [r.label for r in runs] == ["exp [a/exp]", "exp [b/exp]", "other"]


def test_frontier_colours_are_distinct() -> None:
    from lowband.tradeoff import distinct_colours

    for n in (2, 10, 11, 20, 35):
        cs = distinct_colours(n)
        assert len(cs) == n and len({tuple(c) for c in cs}) == n


def test_plugin_help_says_it_executes_code(capsys: pytest.CaptureFixture[str]) -> None:
    from lowband.cli import build_parser

    text = build_parser().format_help()
    assert "EXECUTE" in text and "trust" in text
