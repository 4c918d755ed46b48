"""Plain single-process PyTorch loops over the same clients as a lowband workload:
the yardstick column (c) of benchmarks/suite.py.

What a researcher would write by hand, with no lowband engine: one ``nn.Module`` loaded
with each client's weights in turn, ``torch.optim.SGD``, minibatches from a seeded
``randperm``, ``state_dict`` averaging, evaluation with ``torch.no_grad``. The work is the
lowband run's: the same model, the same per-client data (the federation lowband built),
the same participants and graph each round (the run's round plans), the same batch size,
epochs and learning rate, and the same evaluation (protocols, test sets, eval batch size).
Nothing is encoded or counted: there are no messages, only tensors in one process.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

StateDict = dict[str, torch.Tensor]


def _train(model: nn.Module, start: StateDict, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
           batch_size: int, lr: float, gen: torch.Generator) -> StateDict:
    """``epochs`` of minibatch SGD from ``start`` on ``(x, y)``; returns the new weights."""
    model.load_state_dict(start)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = int(y.shape[0])
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _average(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    total = float(sum(weights))
    return {k: sum(s[k] * (w / total) for s, w in zip(states, weights)) for k in states[0]}  # type: ignore[misc]


@torch.no_grad()
def _evaluate(model: nn.Module, state: StateDict, x: torch.Tensor, y: torch.Tensor,
              batch_size: int) -> tuple[float, float, int]:
    """(accuracy, mean loss, samples) of ``state`` on ``(x, y)``."""
    n = int(y.shape[0])
    if n == 0:
        return float("nan"), float("nan"), 0
    model.load_state_dict(state)
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, n, batch_size):
        out = model(x[i:i + batch_size])
        loss += float(F.cross_entropy(out, y[i:i + batch_size], reduction="sum"))
        correct += int((out.argmax(1) == y[i:i + batch_size]).sum())
    return correct / n, loss / n, n


def fedavg(model: nn.Module, init: StateDict, fed: Any, participants: Sequence[Sequence[int]], *,
           epochs: int, batch_size: int, lr: float, eval_batch_size: int, protocols: Sequence[str],
           on_round: Callable[[int, dict[str, float]], None] = lambda r, m: None) -> StateDict:
    """FedAvg: each round, the sampled clients train from the global weights, and the
    global weights become their sample-weighted average. Evaluation every round:
    ``personal`` = the global model on every client's local test split (sample-weighted
    accuracy, as lowband's FedAvg ``personal``), ``global`` = on the global test set.
    ``on_round(r, metrics)`` is called after each round's evaluation (the caller's clock)."""
    glob = {k: v.clone() for k, v in init.items()}
    for r, sampled in enumerate(participants, start=1):
        states, sizes = [], []
        for c in sampled:
            nd = fed.nodes[c]
            gen = torch.Generator().manual_seed(1000 * r + c)
            states.append(_train(model, glob, nd.train_x, nd.train_y, epochs=epochs, batch_size=batch_size,
                                 lr=lr, gen=gen))
            sizes.append(float(nd.n_train))
        if states:
            glob = _average(states, sizes)
        metrics: dict[str, float] = {}
        if "global" in protocols:
            metrics["global/acc"] = _evaluate(model, glob, fed.global_test_x, fed.global_test_y, eval_batch_size)[0]
        if "personal" in protocols:
            res = [_evaluate(model, glob, nd.test_x, nd.test_y, eval_batch_size) for nd in fed.nodes]
            n = sum(k for _, _, k in res)
            metrics["personal/acc_weighted"] = sum(a * k for a, _, k in res if k) / max(n, 1)
        on_round(r, metrics)
    return glob


def dfedavg(model: nn.Module, init: StateDict, fed: Any, neighbours: Sequence[dict[int, Sequence[int]]], *,
            epochs: int, batch_size: int, lr: float, eval_batch_size: int, protocols: Sequence[str],
            on_round: Callable[[int, dict[str, float]], None] = lambda r, m: None) -> list[StateDict]:
    """DFedAvg: each round every node trains from its own weights, then takes the uniform
    average over its closed neighbourhood in the round's graph. Evaluation every round:
    ``consensus`` = the average of all nodes' weights on the global test set,
    ``node_global`` = every node's model on the global test set (mean accuracy)."""
    n_nodes = len(fed.nodes)
    states = [{k: v.clone() for k, v in init.items()} for _ in range(n_nodes)]
    for r, graph in enumerate(neighbours, start=1):
        trained = []
        for i in range(n_nodes):
            nd = fed.nodes[i]
            gen = torch.Generator().manual_seed(1000 * r + i)
            trained.append(_train(model, states[i], nd.train_x, nd.train_y, epochs=epochs,
                                  batch_size=batch_size, lr=lr, gen=gen))
        states = [_average([trained[i]] + [trained[j] for j in graph.get(i, ())], [1.0] * (1 + len(graph.get(i, ()))))
                  for i in range(n_nodes)]
        metrics: dict[str, float] = {}
        tx, ty = fed.global_test_x, fed.global_test_y
        if "consensus" in protocols:
            metrics["consensus/acc"] = _evaluate(model, _average(states, [1.0] * n_nodes), tx, ty, eval_batch_size)[0]
        if "node_global" in protocols:
            accs = [_evaluate(model, s, tx, ty, eval_batch_size)[0] for s in states]
            metrics["node_global/acc"] = sum(accs) / len(accs)
        on_round(r, metrics)
    return states
