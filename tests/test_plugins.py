"""Plugins (lowband.plugins): the worked examples of docs/adding-an-algorithm.md, copied to a
temporary folder outside the source tree, run through the CLI (--plugin, in a fresh
process) and the Python API; entry points of an installed distribution; clear errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
import torch

from conftest import digits_config
from lowband.config import ConfigError

DOCS = Path(__file__).resolve().parents[1] / "docs"
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def _clean_registries():
    """Plugins registered by a test are removed afterwards (other tests list the registries)."""
    from lowband import plugins
    from lowband.algorithms import ALGORITHMS
    from lowband.comm import codecs
    from lowband.data import sources
    from lowband.models import MODELS

    saved = [(d, dict(d)) for d in (ALGORITHMS, MODELS, sources.DATASETS, sources.PLUGIN_LOADERS, codecs.MAKERS,
                                    codecs.CODECS, plugins._MODULES)]
    loaded = list(plugins.LOADED)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    for d, copy in saved:
        d.clear()
        d.update(copy)
    plugins.LOADED[:] = loaded
    sources.clear_cache()


def doc_block(starts: str) -> str:
    for b in re.findall(r"```python\n(.*?)```", (DOCS / "adding-an-algorithm.md").read_text(), flags=re.S):
        if b.startswith(starts):
            return b
    raise AssertionError(f"no python block starting with {starts!r} in docs/adding-an-algorithm.md")


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "my_fedavgm.py").write_text(doc_block('"""FedAvgM'))
    (d / "my_parts.py").write_text(doc_block("# my_parts.py"))
    return d


def listed(name: str, text: str) -> bool:
    """``name`` is an entry of `lowband list` output (``dfedavgm`` does not list ``fedavgm``)."""
    return re.search(rf"^\s+{re.escape(name)}\s", text, flags=re.M) is not None


def lowband_cli(*args: str, cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), extra_path, os.environ.get("PYTHONPATH", ""))
                                                       if p)}
    return subprocess.run([sys.executable, "-m", "lowband.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # a fresh process and two spawned sweep workers import torch (~10 s)
def test_plugin_algorithm_through_the_cli(plugin_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lowband.algorithms import ALGORITHMS
    from lowband.cli import main

    assert "fedavgm" not in ALGORITHMS  # not in the package
    cfg = digits_config(plugin_dir, "fedavgm", rounds=2)
    (plugin_dir / "cfg.toml").write_text(tomli_w.dumps(cfg))
    # a fresh process: `lowband run ... --plugin FILE`
    res = lowband_cli("run", "cfg.toml", "--plugin", "my_fedavgm.py", "-q", cwd=plugin_dir)
    assert res.returncode == 0, res.stderr
    summary = json.loads((Path(cfg["out_dir"]) / "summary.json").read_text())
    assert summary["algorithm"] == "fedavgm" and summary["rounds_completed"] == 2
    assert summary["final"]["global/acc"] > 0.15  # it learns (10 classes)
    # in this process: list, and a sweep whose two worker processes load the plugin too
    capsys.readouterr()
    assert main(["list", "algorithms", "--plugin", str(plugin_dir / "my_fedavgm.py")]) == 0
    out = capsys.readouterr().out
    assert listed("fedavgm", out) and "server_momentum" in out
    assert main(["sweep", str(plugin_dir / "cfg.toml"), "algorithm.server_momentum=0.5,0.9", "rounds=1", "--out",
                 str(plugin_dir / "sw"), "--workers", "2", "--plugin", str(plugin_dir / "my_fedavgm.py"), "-q"]) == 0
    table = (plugin_dir / "sw" / "sweep.md").read_text()
    assert "| 0.5 |" in table and "| 0.9 |" in table
    capsys.readouterr()
    assert main(["run", str(plugin_dir / "cfg.toml"), "--plugin", "missing.py"]) == 2
    assert capsys.readouterr().err.strip().startswith("lowband: error: plugin 'missing.py': no such file")


def test_plugin_algorithm_model_dataset_codec_through_the_api(plugin_dir: Path) -> None:
    import lowband as lb
    from lowband.algorithms import ALGORITHMS

    with pytest.raises(ConfigError, match="unknown algorithm 'fedavgm'"):
        lb.experiment(digits_config(plugin_dir, "fedavgm"))
    lb.load_plugin(plugin_dir / "my_fedavgm.py")
    lb.load_plugin(str(plugin_dir / "my_fedavgm.py"))  # idempotent
    assert ALGORITHMS["fedavgm"].__module__.startswith("lowband_plugin_my_fedavgm")
    res = lb.run(digits_config(plugin_dir, "fedavgm", rounds=2), write=False)
    assert res.summary["algorithm"] == "fedavgm" and set(res.ledger_columns["kind"]) == {"weights", "delta"}
    # the first round of FedAvgM is FedAvg on deltas (its momentum buffer starts at 0)
    m = lb.run(digits_config(plugin_dir, "fedavgm", rounds=1), write=False)
    f = lb.run(digits_config(plugin_dir, "fedavg", rounds=1, upload="delta"), write=False)
    for k, v in f.states[-1]["params"].items():
        torch.testing.assert_close(m.states[-1]["params"][k], v)

    lb.load_plugin(plugin_dir / "my_parts.py")
    cfg = digits_config(plugin_dir, "fedavg", rounds=3)
    cfg["data"] = {"dataset": "blobs", "options": {"n": 400, "dim": 32}, "num_clients": 4, "partition": "iid",
                   "split": [0.75, 0.0, 0.25]}
    cfg["model"] = {"name": "tiny_mlp", "width": 64}
    cfg["comm"] = {"codec": "sign8"}
    cfg["algorithm"]["lr"] = 0.1
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    res = lb.run(cfg, write=False)
    assert type(res.model()).__name__ == "TinyMLP" and res.summary["model_params"] == 32 * 64 + 64 + 64 * 3 + 3
    assert res.summary["final"]["global/acc"] > 0.6  # blobs are easy; sign updates still learn
    up = res.ledger_columns["bytes"][res.ledger_columns["direction"] == "up"]
    fp32 = lb.run(cfg, write=False, comm={"codec": "fp32"})
    up32 = fp32.ledger_columns["bytes"][fp32.ledger_columns["direction"] == "up"]
    assert up.sum() < 0.5 * up32.sum()  # one byte per value instead of four (plus headers)
    from lowband.comm.codecs import parse_codec

    assert parse_codec("sign8").spec == "sign8"
    with pytest.raises(ConfigError, match="data.options"):
        lb.experiment(cfg, data={"options": {"colour": 1}})


def test_entry_points_of_an_installed_distribution(tmp_path: Path) -> None:
    """A distribution on the path with lowband.* entry points: registered without --plugin."""
    site = tmp_path / "site"
    (site / "my_fl").mkdir(parents=True)
    (site / "my_fl" / "__init__.py").write_text("")
    (site / "my_fl" / "fedavgm.py").write_text(doc_block('"""FedAvgM'))
    (site / "my_fl" / "parts.py").write_text(doc_block("# my_parts.py").replace(
        "\nregister_model(", "\nif False:\n    register_model(").replace(
        "\nregister_dataset(", "\nif False:\n    register_dataset(").replace(
        "\nregister_codec(", "\nif False:\n    register_codec("))
    dist = site / "my_fl-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-fl\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[lowband.algorithms]\nfedavgm = my_fl.fedavgm\n"
        "[lowband.models]\ntiny_mlp = my_fl.parts:build_tiny_mlp\n"
        "[lowband.codecs]\nsign8 = my_fl.parts:Sign\n"
        "[lowband.datasets]\nbroken = my_fl.nothere:load\n")
    out = lowband_cli("list", cwd=tmp_path, extra_path=str(site))
    assert out.returncode == 0, out.stderr
    assert all(listed(n, out.stdout) for n in ("fedavgm", "tiny_mlp", "sign8"))
    assert not listed("fedavgm", lowband_cli("list", cwd=tmp_path).stdout)  # only with the distribution
    assert "broken" in out.stderr and "not loaded" in out.stderr  # a warning; the command still works
