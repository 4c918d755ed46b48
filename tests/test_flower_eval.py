"""A Flower run's evaluation asks the clients its protocols score, and no other.

``global`` needs no client; ``personal`` and ``node_global`` score the ``eval.nodes``
sample (every client without one); ``personal_joined`` the clients that have joined. Each
case counts the ``evaluate`` messages the ServerApp sends (a run that messages every client
every round fails here) and checks that metrics.jsonl is `lowband run`'s, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower adapter needs the extra: pip install 'lowband[flower]'")

from lowband.config import validate  # noqa: E402
from lowband.engine.evaluation import sample_nodes  # noqa: E402
from lowband.engine.simulator import Simulation  # noqa: E402
from lowband.flower import FlowerRun, client_app  # noqa: E402
from lowband.flower import adapter  # noqa: E402
from test_flower import InProcessGrid, _config, task_identity  # noqa: E402,F401

ROUNDS = 3


class CountingGrid(InProcessGrid):
    """Records the destination partition of every ``evaluate`` message, per call."""

    def __init__(self, app, num_nodes: int):
        super().__init__(app, num_nodes)
        self.evaluated: list[list[int]] = []
        self.by_type: dict[str, int] = {}

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:
            self.by_type[m.metadata.message_type] = self.by_type.get(m.metadata.message_type, 0) + 1
        if messages and messages[0].metadata.message_type == "evaluate":
            self.evaluated.append(sorted(m.metadata.dst_node_id - 100 for m in messages))
        return super().send_and_receive(messages, timeout=timeout)


def _both(tmp_path: Path, algorithm: str = "fedavg", alg: dict | None = None,
          **evaluation: object) -> tuple[CountingGrid, Simulation]:
    """The config run by `lowband run` and through the adapter; the adapter's grid."""
    cfgs = {}
    for name in ("lowband", "flower"):
        cfg = _config(tmp_path, algorithm, name, ROUNDS, **(alg or {}))
        cfg["eval"] = dict(evaluation)
        cfgs[name] = cfg
    ref = Simulation(validate(cfgs["lowband"]))
    ref.run()
    exp = validate(cfgs["flower"])
    grid = CountingGrid(client_app(exp), 10)
    FlowerRun(exp, grid).run()
    assert (tmp_path / "flower" / "metrics.jsonl").read_text() == (tmp_path / "lowband" / "metrics.jsonl").read_text()
    return grid, ref


def test_global_alone_sends_no_evaluate_message(tmp_path: Path, task_identity) -> None:
    grid, _ = _both(tmp_path, protocols=["global"])
    assert grid.by_type.get("evaluate", 0) == 0 and grid.by_type["train"] > 0


def test_an_eval_nodes_sample_is_all_that_is_asked(tmp_path: Path, task_identity) -> None:
    grid, _ = _both(tmp_path, "fedcspack", {"pack": 64}, protocols=["global", "personal", "node_global"], nodes=3)
    sample = sample_nodes(10, 3, 3)
    assert grid.evaluated == [sample] * (ROUNDS + 1)  # one message to each sampled client per evaluation


def test_personal_joined_asks_the_clients_that_joined(tmp_path: Path, task_identity) -> None:
    grid, ref = _both(tmp_path, protocols=["global", "personal_joined"])
    joined = [ref.evaluator.joined(r) for r in range(1, ROUNDS + 1)]
    assert all(0 < len(j) < 10 for j in joined[:1])  # a round's participants: some clients, not all
    assert grid.evaluated == joined  # round 0: nobody has joined, no message


def test_every_client_is_asked_only_when_the_protocol_scores_every_client(tmp_path: Path, task_identity,
                                                                          monkeypatch) -> None:
    """``personal`` over every client: one message to each per evaluation, which reads no
    client state (FedAvg's clients are scored with the server's model) and decodes the
    server's model once per evaluation in this process."""
    loads = []
    real = adapter._Client.load_state
    monkeypatch.setattr(adapter._Client, "load_state", lambda self, **kw: loads.append(self.node) or real(self, **kw))
    decoded = adapter._EVAL_PARAMS.decoded
    grid, _ = _both(tmp_path, protocols=["global", "personal"])
    assert grid.evaluated == [list(range(10))] * (ROUNDS + 1)
    assert len(loads) == grid.by_type["train"]  # a train step loads its client's state; evaluate does not
    assert adapter._EVAL_PARAMS.decoded - decoded == ROUNDS + 1


def test_the_params_cache_decodes_new_bytes_and_keeps_no_refused_ones() -> None:
    """Equal bytes give the tensors decoded before; other bytes are decoded again; bytes
    the decoder refuses leave the cache as it was."""
    import torch

    from lowband.flower.evaluation import ParamsCache

    calls = []

    def decode(data):
        calls.append(data)
        if data == b"bad":
            raise ValueError("refused")
        return {"w": torch.tensor([float(len(data))])}

    cache = ParamsCache()
    first = cache.get(b"model-1", decode)
    assert cache.get(bytearray(b"model-1"), decode) is first and len(calls) == 1
    with pytest.raises(ValueError):
        cache.get(b"bad", decode)
    assert cache.get(b"model-1", decode) is first and len(calls) == 2
    assert cache.get(b"model-22", decode)["w"].item() == 8.0 and cache.decoded == 2
