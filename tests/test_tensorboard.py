"""Optional TensorBoard logging (lowband.tblog): the event files read back equal metrics.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import tomli_w

from conftest import digits_config
from lowband.cli import main
from lowband.config import ConfigError, validate
from lowband.tblog import TB_DIR, read_scalars, scalars

pytest.importorskip("tensorboard", reason="the tensorboard extra (pip install 'lowband[tensorboard]')")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _expected(recs: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in recs:
        for k, v in scalars(rec).items():
            out.setdefault(k, []).append((rec["round"], v))
    return out


def _same(got: dict[str, list[tuple[int, float]]], want: dict[str, list[tuple[int, float]]]) -> None:
    assert sorted(got) == sorted(want)
    for tag, pts in want.items():  # event files hold float32 values
        assert [s for s, _ in got[tag]] == [s for s, _ in pts], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in pts], rel=1e-6), tag


def test_cli_tensorboard_event_files_match_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(digits_config(tmp_path, "fedavg", rounds=3)))
    run = tmp_path / "run-fedavg"
    assert main(["run", str(cfg), "--tensorboard", "--quiet"]) == 0
    got = read_scalars(run / TB_DIR)
    want = _expected(_metrics(run))
    assert {"global/acc", "bytes/total", "personal/acc_weighted"} <= set(got)
    assert len(got["global/acc"]) == 4  # rounds 0-3
    _same(got, want)
    assert 'tensorboard = true' in (run / "config.toml").read_text()


def test_resume_rebuilds_the_event_log_once_per_round(tmp_path: Path) -> None:
    """A resumed run's tb/ holds each round once, equal to its metrics.jsonl (and a config
    key, not only the CLI flag, turns it on)."""
    cfg = {**digits_config(tmp_path, "fedavg", rounds=2), "log": {"tensorboard": True}}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(cfg))
    run = tmp_path / "run-fedavg"
    assert main(["run", str(path), "--quiet"]) == 0
    assert main(["run", str(path), "rounds=4", "--resume", "--quiet"]) == 0
    got = read_scalars(run / TB_DIR)
    assert [s for s, _ in got["global/acc"]] == [0, 1, 2, 3, 4]
    _same(got, _expected(_metrics(run)))


def test_no_tensorboard_by_default(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(digits_config(tmp_path, "fedavg", rounds=1)))
    assert main(["run", str(cfg), "--quiet"]) == 0
    assert not (tmp_path / "run-fedavg" / TB_DIR).exists()


def test_missing_package_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(digits_config(tmp_path, "fedavg", rounds=1)))
    assert main(["run", str(cfg), "--tensorboard", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'lowband[tensorboard]'" in err[0], err
    assert not (tmp_path / "run-fedavg").exists()  # refused before the run folder is made


def test_in_memory_run_refuses_tensorboard(tmp_path: Path) -> None:
    import lowband as lb

    exp = validate({**digits_config(tmp_path, "fedavg", rounds=1), "log": {"tensorboard": True}})
    with pytest.raises(ConfigError, match="write=False writes nothing"):
        lb.run(exp, write=False)


def test_opening_replaces_a_stale_event_log(tmp_path: Path) -> None:
    """Rounds logged after the checkpoint a run resumes from (a kill between the metrics line
    and the checkpoint) are dropped, as metrics.jsonl drops them: no round twice."""
    from lowband.tblog import TensorBoardLog

    folder = tmp_path / TB_DIR
    old = TensorBoardLog(folder, [{"round": r, "acc": 0.1 * r} for r in range(4)])
    old.close()
    new = TensorBoardLog(folder, [{"round": r, "acc": 0.2 * r, "bad": float("nan")} for r in range(3)])
    new.add({"round": 3, "acc": 0.9, "note": "text"})
    new.close()
    got = read_scalars(folder)
    assert list(got) == ["acc"]
    assert [s for s, _ in got["acc"]] == [0, 1, 2, 3]
    assert [v for _, v in got["acc"]] == pytest.approx([0.0, 0.2, 0.4, 0.9])
