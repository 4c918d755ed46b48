"""The Python API (lowband.api): experiment building, in-memory and written runs, Result
tables, models and plots, load_run, and every code block of docs/python-api.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from conftest import digits_config

import lowband as lb
from lowband.config import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_docs_python_api_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/python-api.md: FedAvg and FedCSPACK over 3 seeds, DataFrames, a plot with
    confidence bands, a codec sweep; the blocks assert their own claims."""
    import pandas  # noqa: F401 - the test extra installs it (pyproject.toml); DataFrames are the feature
    monkeypatch.chdir(tmp_path)
    import matplotlib

    matplotlib.use("Agg")
    ns: dict = {}
    blocks = python_blocks(DOCS / "python-api.md")
    assert len(blocks) == 5
    for block in blocks:
        exec(compile(block, "docs/python-api.md", "exec"), ns)
    assert (tmp_path / "accuracy_vs_bytes.png").read_bytes()[:8] == PNG_MAGIC
    for d in ("fedavg-seeds", "fedcspack-seeds"):
        assert {p.name for p in (tmp_path / "runs" / d).iterdir()} >= {"seed-0", "seed-1", "seed-2", "aggregate.json",
                                                                        "aggregate.csv"}
    ax = ns["ax"]
    assert len(ax.collections) == 2  # one confidence band per method
    assert (tmp_path / "runs" / "codec-sweep" / "sweep_curves.png").exists()


def test_experiment_sources_and_overrides(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path)
    a = lb.experiment(cfg, rounds=5, algorithm={"lr": 0.1}, **{"comm.codec": "fp16", "data.alpha": 0.3})
    assert (a.rounds, a.algorithm.options()["lr"], a.algorithm.options()["batch_size"]) == (5, 0.1, 16)
    assert (a.comm.codec, a.data.alpha, a.data.num_clients) == ("fp16", 0.3, 8)
    b = lb.experiment(a, overrides=["seed=7", "algorithm.lr=0.2"])
    assert (b.seed, b.algorithm.options()["lr"], b.rounds) == (7, 0.2, 5)
    assert a.seed == 1  # copied, not changed
    p = tmp_path / "c.toml"
    p.write_text(a.to_toml())
    assert lb.experiment(p) == a
    assert lb.experiment().algorithm.name == "fedavg"  # the defaults
    with pytest.raises(ConfigError, match=r"algorithm\.lr"):
        lb.experiment(cfg, algorithm={"lr": -1})
    with pytest.raises(ConfigError, match="rounds"):
        lb.experiment(cfg, rounds="many")
    with pytest.raises(ConfigError, match="not found"):
        lb.experiment(tmp_path / "missing.toml")


def test_in_memory_run_writes_nothing_and_matches_a_written_run(tmp_path: Path, monkeypatch) -> None:
    import pandas  # noqa: F401
    monkeypatch.chdir(tmp_path)
    cfg = digits_config(tmp_path / "w", rounds=2)
    mem = lb.run(cfg, write=False)
    assert list(tmp_path.rglob("*")) == []
    assert mem.run_dir is None
    disk = lb.run(cfg)
    assert mem.metrics.equals(disk.metrics) and mem.ledger.equals(disk.ledger)
    back = lb.load_run(disk.run_dir)
    assert isinstance(back, lb.Result)
    assert back.metrics.equals(mem.metrics) and back.ledger.equals(mem.ledger)
    assert back.summary == disk.summary
    m = mem.metrics
    assert list(m["round"]) == [0, 1, 2]
    led = mem.ledger
    assert list(led.columns) == ["round", "src", "dst", "direction", "kind", "bytes", "declared"]
    assert len(led) == 2 * 2 * 4  # 2 rounds x (4 broadcasts down + 4 replies up)
    assert led.groupby("direction")["bytes"].sum().to_dict() == {"down": mem.summary["bytes_down"],
                                                                 "up": mem.summary["bytes_up"]}
    # final models: the in-memory states and the checkpoint's give the same module
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(mem.model()(x), back.model()(x), rtol=0, atol=0)
    # states are made lazily: a node never read (never took part) keeps its initial state,
    # which neither the run nor its checkpoint holds; every node that took part is there
    took_part = set(led["src"]) | set(led["dst"])
    assert set(back.states) == set(mem.states) and took_part <= set(back.states) <= set(range(8)) | {-1}
    with pytest.raises(ValueError, match="stateless"):
        mem.model(0)  # FedAvg clients keep no model
    ax = back.plot(x="round", path=tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
    assert len(ax.lines) == 1 and len(ax.lines[0].get_xdata()) == 3


def test_peer_models_need_a_node(tmp_path: Path) -> None:
    res = lb.run(digits_config(tmp_path, "dfedavg", rounds=1), write=False)
    with pytest.raises(ValueError, match="no server"):
        res.model()
    assert isinstance(res.model(3), torch.nn.Module)


def test_missing_pandas_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = lb.run(digits_config(tmp_path, rounds=1), write=False)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'lowband\[analysis\]'"):
        res.metrics
    assert res.records[-1]["round"] == 1 and len(res.ledger_columns["bytes"]) == 8  # no pandas needed


def test_load_run_refuses_a_non_run(tmp_path: Path) -> None:
    from lowband.report import ReportError

    with pytest.raises(ReportError, match="not a finished lowband run folder"):
        lb.load_run(tmp_path)
