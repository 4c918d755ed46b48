"""config.bounds' memory estimate counts what a run holds (issue 43): models of the nodes
that take part (states are made on first use; none for clients that keep no model) and the
round's messages, so 100,000 FedAvg clients pass without ``allow_huge`` while a population
of peers too big for the machine is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowband.config import ConfigError, validate
from lowband.config import bounds

GiB = 2**30
MLP = 784 * 100 + 100 + 100 * 10 + 10  # the NTK-FL MLP's parameters


def _cfg(tmp_path: Path, algorithm: str, n: int, **over: object) -> dict:
    peer = algorithm in ("dfedavg", "dpsgd")
    cfg: dict = {"name": "est", "out_dir": str(tmp_path / "run"), "rounds": 3,
                 "data": {"dataset": "fashion_mnist", "num_clients": n, "partition": "iid_replace",
                          "samples_per_client": 20},
                 "model": {"name": "mlp"}, "algorithm": {"name": algorithm},
                 "topology": {"kind": "kregular", "k": 5} if peer else {"kind": "star", "sampling": "count",
                                                                       "count": 100}}
    cfg.update(over)
    return cfg


@pytest.fixture
def free_8gib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "available_memory", lambda: 8 * GiB)


def test_stateless_clients_count_only_the_round(tmp_path: Path, free_8gib: None) -> None:
    exp = validate(_cfg(tmp_path, "fedavg", 100_000))  # no allow_huge: accepted
    need, n = bounds.memory_estimate(exp)
    assert n == MLP and bounds.model_holders(exp) == 0 and bounds.participants_per_round(exp) == 100
    assert need == 4 * MLP * (100 + bounds.COPIES_FIXED)


def test_a_client_with_a_state_counts_once_it_has_taken_part(tmp_path: Path, free_8gib: None) -> None:
    exp = validate(_cfg(tmp_path, "scaffold", 100_000))  # SCAFFOLD keeps c_i: a model per client seen
    assert bounds.model_holders(exp) == 300  # 100 a round, 3 rounds
    exp = validate(_cfg(tmp_path, "moon", 1000, rounds=50))  # MOON inherits FedAvg, keeps its previous model
    assert bounds.model_holders(exp) == 1000


def test_peers_hold_their_states_and_their_messages(tmp_path: Path, free_8gib: None) -> None:
    exp = validate(_cfg(tmp_path, "dfedavg", 10_000))
    need, _ = bounds.memory_estimate(exp)
    assert need == 4 * MLP * (2 * 10_000 + bounds.COPIES_FIXED)  # 6.4 GB: the measured floor of a peer round
    with pytest.raises(ConfigError, match="allow_huge") as e:  # 100,000 peers: 64 GB
        validate(_cfg(tmp_path, "dfedavg", 100_000))
    assert "100,000 nodes (100,000 a round)" in str(e.value)
    validate(_cfg(tmp_path, "dfedavg", 100_000, allow_huge=True))
