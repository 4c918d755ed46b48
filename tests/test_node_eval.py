"""node_global in blocks (lowband.engine.node_eval): equal to the per-node evaluation within
float tolerance, a node's bits independent of which other nodes share its block (so the
serial path and the worker pool agree), used by the executor, and not used where it cannot be."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from lowband.engine import evaluation, node_eval
from lowband.train.cohort import mlp_layers
from lowband.engine.node_eval import NODE_BLOCK, stacked_logits
from lowband.models import build_model
from lowband.train import evaluate

torch.set_num_threads(1)


def _models(hidden, n: int = 3) -> list[nn.Module]:
    return [build_model("mlp", num_classes=10, input_shape=(1, 8, 8), hidden=hidden, seed=i) for i in range(n)]


@pytest.mark.parametrize("hidden", [16, [16, 12]], ids=["one-hidden", "two-hidden"])
def test_block_logits_equal_each_models_own(hidden) -> None:
    ms = _models(hidden)
    x = torch.randn(300, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    slots = [None] * NODE_BLOCK
    pos = [0, 3, NODE_BLOCK - 1]
    for p, m in zip(pos, ms):
        slots[p] = m.state_dict()
    out = stacked_logits(mlp_layers(ms[0]), slots, x, 128)
    assert out.shape == (NODE_BLOCK, 10, 300)
    for p, m in zip(pos, ms):
        with torch.no_grad():
            assert torch.allclose(out[p].t(), m.eval()(x), atol=1e-5, rtol=0)


def test_logreg_is_blocked_too() -> None:
    lr = build_model("logreg", num_classes=10, input_shape=(1, 8, 8), seed=0)
    assert mlp_layers(lr) == [("head.weight", "head.bias")]
    x = torch.randn(50, 1, 8, 8)
    slots = [None] * NODE_BLOCK
    slots[2] = lr.state_dict()
    with torch.no_grad():
        assert torch.allclose(stacked_logits(mlp_layers(lr), slots, x, 20)[2].t(), lr(x), atol=1e-5, rtol=0)


def test_other_models_are_not_blocked() -> None:
    seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    assert mlp_layers(seq) is None
    assert mlp_layers(build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28), seed=0)) is None


class _Ex:
    """The parts of an executor map_many reads: nodes' states, one module, contexts."""

    def __init__(self, models: list[nn.Module], model: nn.Module):
        self.states = {i: {"params": m.state_dict()} for i, m in enumerate(models)}
        self._model = model
        self.env = type("Env", (), {"model_key": staticmethod(lambda n: "m")})()

    def model_for(self, n: int) -> nn.Module:
        return self._model

    def context(self, n: int, round: int, plan) -> object:
        return type("Ctx", (), {"model": self._model, "node": n})()


class _Alg:
    @staticmethod
    def node_params(s: dict):
        return s.get("params")


def test_map_many_equals_per_node_and_does_not_depend_on_the_block(monkeypatch) -> None:
    """Per node: within float tolerance of lowband.train.evaluate; bit for bit the same
    whether its block is full (one process holds every node) or half empty (a worker holds
    part of it) or it is scored alone (a Flower client)."""
    ms = _models(16, 2 * NODE_BLOCK + 3)
    g = torch.Generator().manual_seed(1)
    test = (torch.randn(400, 1, 8, 8, generator=g), torch.randint(0, 10, (400,), generator=g))
    ex = _Ex(ms, _models(16, 1)[0])
    calls = [0]
    orig = node_eval.stacked_logits

    def counting(*a, **k):
        calls[0] += 1
        return orig(*a, **k)

    monkeypatch.setattr(node_eval, "stacked_logits", counting)
    fn = partial(evaluation._eval_node_global, alg=_Alg(), test=test, bs=128)
    everyone = list(range(len(ms)))
    full = evaluation._eval_node_global_many(ex, everyone, 1, None, alg=_Alg(), test=test, bs=128)
    assert calls[0] == 3  # three blocks, not one call per node: the fast path ran
    for n, m in enumerate(ms):
        acc, loss, _ = evaluate(m, None, test[0], test[1], 128)
        assert abs(full[n][0] - acc) < 1e-6 and abs(full[n][1] - loss) < 1e-5
    part = evaluation._eval_node_global_many(ex, everyone[5:NODE_BLOCK + 4], 1, None, alg=_Alg(), test=test, bs=128)
    assert all(part[n] == full[n] for n in part)
    for n in (0, NODE_BLOCK + 1):
        assert fn(ex.context(n, 1, None), ex.states[n]) == full[n]


def test_the_executor_takes_the_batched_form(monkeypatch) -> None:
    from lowband.engine.executor import map_many

    fn = partial(evaluation._eval_node_global, alg=_Alg(), test=(torch.zeros(1), torch.zeros(1)), bs=1)
    assert map_many(fn) is not None
    assert map_many(partial(evaluation._node_params, alg=_Alg())) is None


def test_a_serial_run_scores_node_global_in_blocks(tmp_path, monkeypatch) -> None:
    from conftest import digits_config
    from lowband.config import validate
    from lowband.engine.simulator import Simulation

    calls = [0]
    orig = node_eval.stacked_logits

    def counting(*a, **k):
        calls[0] += 1
        return orig(*a, **k)

    monkeypatch.setattr(node_eval, "stacked_logits", counting)
    cfg = digits_config(tmp_path, "dfedavg", rounds=1)
    cfg["eval"] = {"protocols": ["node_global"]}
    res = Simulation(validate(cfg)).run()
    assert calls[0] == len(res.metrics) == 2  # rounds 0 and 1; 8 nodes: one block, one call each
    assert 0 <= res.metrics[-1]["node_global/acc"] <= 1
