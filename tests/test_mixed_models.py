"""Mixed federations (``[model] mix``): per-client architectures for methods that exchange
predictions only; weight-averaging methods refuse them in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import digits_config
from lowband.algorithms.base import SERVER
from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation
from lowband.models import build_model, count_params


def _cfg(tmp_path: Path, algorithm: str, **alg: object) -> dict:
    cfg = digits_config(tmp_path, algorithm, rounds=1, **alg)
    cfg["threads"] = 1
    cfg["data"]["public_size"] = 100
    cfg["model"] = {"name": "mlp", "mix": ["mlp", "logreg"]}
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    return cfg


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])
def test_weight_averaging_refuses_a_mixed_federation(tmp_path: Path, algorithm: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(_cfg(tmp_path, algorithm))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("model.mix:") and algorithm in msg and "kta" in msg


def test_mix_is_validated(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "kta", distill_epochs=1)
    cfg["model"]["mix"] = ["mlp", "nope"]
    with pytest.raises(ConfigError, match="model.mix: unknown model 'nope'"):
        validate(cfg)
    cfg["model"]["mix"] = []
    with pytest.raises(ConfigError, match="model.mix"):
        validate(cfg)
    cfg["model"] = {"name": "mlp", "mix": ["mlp", "logreg"], "hidden": 16}  # logreg has no 'hidden'
    with pytest.raises(ConfigError, match="model.hidden: not an option of logreg"):
        validate(cfg)
    cfg["model"] = {"name": "mlp", "mix": ["mlp", "logreg"]}
    cfg["eval"] = {"protocols": ["consensus"]}
    with pytest.raises(ConfigError, match="consensus"):
        validate(cfg)


@pytest.mark.parametrize("algorithm", ["kta", "local"])
def test_mixed_federation_runs_with_one_architecture_per_client(tmp_path: Path, algorithm: str) -> None:
    extra = {"distill_epochs": 1} if algorithm == "kta" else {}
    sim = Simulation(validate(_cfg(tmp_path, algorithm, **extra)))
    res = sim.run()
    states = sim.executor.states
    keys = [set(states[i]["params"]) for i in range(8)]
    assert all(keys[i] == keys[i % 2] for i in range(8)) and keys[0] != keys[1]  # round robin mlp, logreg
    sizes = {m: count_params(build_model(m, num_classes=10, input_shape=(1, 8, 8))) for m in ("mlp", "logreg")}
    assert res.summary["model_mix"] == sizes and sizes["logreg"] == 64 * 10 + 10
    assert res.metrics[-1]["node_global/acc"] > 0.2
    if algorithm == "kta":
        assert SERVER in states and "params" not in states[SERVER]
