"""Cheaper evaluation, same numbers (issue 18 part 4): the CNNs' index-free max-pooling
in evaluation, ``personal`` of a global model as one pooled forward pass, and
``eval.nodes`` (a fixed seeded sample of nodes for ``personal`` / ``node_global``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import digits_config
from lowband.config import ConfigError, validate
from lowband.data.federation import NodeData
from lowband.engine import evaluation
from lowband.engine.evaluation import _PooledTests, sample_nodes
from lowband.engine.simulator import Simulation
from lowband.models import build_model
from lowband.models import cnn
from lowband.train import evaluate


@pytest.mark.parametrize("shape", [(3, 4, 24, 24), (2, 3, 7, 9), (1, 1, 2, 2), (5, 20, 8, 8)])
def test_pool2_is_max_pool2d_bit_for_bit(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    x.view(-1)[::7] = 0.0  # ties
    x.view(-1)[3] = float("nan")
    with torch.no_grad():
        fast = cnn.pool2(x)
    ref = F.max_pool2d(x, 2)
    assert fast.shape == ref.shape
    assert torch.equal(fast.nan_to_num(123.0), ref.nan_to_num(123.0))
    assert torch.isnan(fast).sum() == torch.isnan(ref).sum() > 0


def test_pool2_keeps_max_pool2d_for_training(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    assert "MaxPool" in type(cnn.pool2(x).grad_fn).__name__  # autograd on: the real max_pool2d

    def boom(*a, **k):
        raise AssertionError("max_pool2d called in evaluation")

    monkeypatch.setattr(cnn.F, "max_pool2d", boom)
    with torch.no_grad():
        cnn.pool2(x)  # the index-free path


@pytest.mark.parametrize("name,shape", [("cnn_fmnist", (1, 28, 28)), ("cnn_cifar", (3, 32, 32)),
                                        ("simplecnn", (3, 32, 32)), ("fol_cnn", (3, 32, 32))])
def test_cnn_eval_logits_unchanged(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, input_shape=shape).eval()
    x = torch.randn(6, *shape)
    with torch.no_grad():
        fast = model(x)
    assert torch.equal(fast, model(x).detach())  # autograd on: max_pool2d


def _nodes(sizes: list[int], shape: tuple[int, ...] = (1, 28, 28), classes: int = 10) -> list[NodeData]:
    g = torch.Generator().manual_seed(1)
    out = []
    for n in sizes:
        x = torch.randn(n, *shape, generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        e = torch.empty(0, *shape)
        out.append(NodeData(x[:0], y[:0], e, y[:0], x, y))
    return out


def test_pooled_personal_equals_one_forward_per_node() -> None:
    """The logits of a sample do not depend on its batch-mates: the pooled forward pass
    gives every node exactly what its own evaluate() gives (batch 500 crosses nodes)."""
    torch.manual_seed(0)
    model = build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28))
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = _nodes([150, 0, 7, 333, 501, 1])
    nodes = [0, 1, 2, 3, 4, 5]
    pooled = _PooledTests(data, nodes).evaluate(model, params, 500)
    for n in nodes:
        ref = evaluate(model, params, data[n].test_x, data[n].test_y, 500)
        assert pooled[n][2] == ref[2]
        if ref[2]:
            assert pooled[n][:2] == ref[:2]
        else:
            assert np.isnan(pooled[n][0]) and np.isnan(ref[0])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name,shape", [("cnn_fmnist", (1, 16, 16)), ("mlp", (1, 28, 28))])
def test_pooled_subsets_equal_alone(threads: int, name: str, shape: tuple[int, ...]) -> None:
    """What the pool's workers do: pool *subsets* of the nodes. Every node's score is the
    same bits in the full pool, in any subset, and alone, for small splits (1-40 rows, where
    BLAS takes other kernels for a few rows or a block's tail: fails without the zero
    padding and row alignment of lowband.train.ROW_ALIGN) and on one or two threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(1)
        model = build_model(name, num_classes=4, input_shape=shape)
        params = {k: v.detach().clone() for k, v in model.state_dict().items()}
        sizes = [int(v) for v in torch.randint(1, 41, (24,), generator=torch.Generator().manual_seed(2))]
        data = _nodes(sizes, shape=shape, classes=4)
        alone = {n: evaluate(model, params, data[n].test_x, data[n].test_y, 100) for n in range(len(sizes))}
        for subset in [list(range(24)), list(range(0, 24, 2)), list(range(1, 24, 2)), list(range(5, 19))]:
            pooled = _PooledTests(data, subset).evaluate(model, params, 100)
            for n in subset:
                assert pooled[n] == alone[n], (subset[:3], n)
    finally:
        torch.set_num_threads(old)


def test_pooled_personal_same_metrics_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    orig = _PooledTests.evaluate
    monkeypatch.setattr(_PooledTests, "evaluate", lambda self, *a: calls.append(1) or orig(self, *a))
    fast = Simulation(validate(digits_config(tmp_path / "fast", "fedavg"))).run()
    assert calls  # the pooled path ran
    monkeypatch.setattr(evaluation.Evaluator, "_can_pool", lambda self, nodes: False)
    monkeypatch.setattr(evaluation.Evaluator, "_can_pool_places", lambda self, nodes: False)
    slow = Simulation(validate(digits_config(tmp_path / "slow", "fedavg"))).run()
    a = (Path(fast.run_dir) / "metrics.jsonl").read_text()
    assert a == (Path(slow.run_dir) / "metrics.jsonl").read_text() and "personal/acc_weighted" in a


def test_sample_nodes_fixed_and_seeded() -> None:
    a = sample_nodes(300, 30, seed=0)
    assert a == sample_nodes(300, 30, seed=0) == sorted(set(a)) and len(a) == 30 and max(a) < 300
    assert a != sample_nodes(300, 30, seed=1)
    assert sample_nodes(5, None, seed=0) == [0, 1, 2, 3, 4]


def test_eval_nodes_scores_only_the_sample(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "dfedavg", rounds=1)
    cfg["eval"] = {"protocols": ["node_global", "consensus"], "nodes": 3}
    sim = Simulation(validate(cfg))
    res = sim.run()
    picked = sample_nodes(8, 3, seed=cfg["seed"])
    assert sim.evaluator.nodes == picked
    fed = sim.fed
    accs = [evaluate(sim.executor.model_for(n), sim.executor.states[n]["params"], fed.global_test_x,
                     fed.global_test_y, 500)[0] for n in range(8)]
    assert res.metrics[-1]["node_global/acc"] == pytest.approx(float(np.mean([accs[n] for n in picked])), abs=1e-12)
    assert len({round(a, 9) for a in accs}) > 1  # the sample makes a difference here


def test_eval_nodes_larger_than_the_federation_is_refused(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "dfedavg", rounds=1)
    cfg["eval"] = {"nodes": 9}
    with pytest.raises(ConfigError, match="eval: nodes = 9 exceeds the run's 8 nodes"):
        Simulation(validate(cfg))


def test_pooled_personal_in_worker_processes_same_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under two worker processes each pools its own nodes' test splits (map_places, in
    parallel): metrics.jsonl byte-identical to the serial run's and to the per-node path's."""
    from lowband.engine.pool import PoolExecutor
    from lowband.engine.rounds import ShardedExecutor

    def run(name: str, workers: int) -> str:
        cfg = {**digits_config(tmp_path / name, "fedavg", rounds=2), "engine": {"workers": workers}}
        sim = Simulation(validate(cfg))
        res = sim.run()
        assert isinstance(sim.executor, PoolExecutor) == (workers > 1)
        return (Path(res.run_dir) / "metrics.jsonl").read_text()

    calls: list[int] = []
    orig = ShardedExecutor.map_places
    monkeypatch.setattr(ShardedExecutor, "map_places", lambda self, fn, nodes: calls.append(1) or orig(self, fn, nodes))
    with monkeypatch.context() as m:
        def boom(*a: object) -> None:
            raise AssertionError("global evaluated on its own")

        m.setattr(evaluation.Evaluator, "_global", boom)  # global comes from the workers' shares
        pooled = run("pool", 2)
    assert len(calls) == 3  # personal at round 0 and after rounds 1, 2: the pooled path ran
    assert "personal/acc_weighted" in pooled and "global/acc" in pooled and pooled == run("serial", 1)
    monkeypatch.setattr(evaluation.Evaluator, "_can_pool_places", lambda self, nodes: False)
    assert run("per_node", 2) == pooled


def test_global_shares_balance_the_places() -> None:
    """The global test set's batches go to the place with the fewest samples to score so far."""
    from lowband.engine.rounds import ShardedExecutor

    class Ex(ShardedExecutor):
        num_workers = 2

        def __init__(self, env: object) -> None:
            super().__init__()
            self.env = env  # type: ignore[assignment]

    class Env:
        num_nodes = 4
        node_data = _nodes([100, 0, 900, 0])

        @staticmethod
        def model_key(n: int) -> str:
            return "m"

    ev = evaluation.Evaluator.__new__(evaluation.Evaluator)
    ev.ex, ev.batch_size = Ex(Env()), 100
    ev.test_y = torch.zeros(1000, dtype=torch.long)
    shares = ev._global_shares([0, 1, 2, 3])
    assert shares is not None and sorted(shares[0] + shares[2]) == list(range(0, 1000, 100))
    assert len(shares[0]) == 9 and len(shares[2]) == 1  # 100 + 900 vs 900 + 100
