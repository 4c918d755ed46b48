"""Named evaluation protocols (the papers disagree, so every number says which it is).

- ``global``: the server's model on the global (held-out official) test set.
- ``personal``: each node's own model on its own local test split; sample-weighted mean,
  plain mean and the mean of the worst 10% of nodes. For algorithms whose clients keep no
  model of their own (FedAvg, FedProx), the global model is evaluated on each client's
  local test split (PFLlib's convention).
- ``node_global``: each node's model on the global test set, mean over nodes
  (NTK-DFL's "average client accuracy").
- ``consensus``: the uniform average of all nodes' weights on the global test set
  (NTK-DFL's "aggregated model").

Evaluation is measurement: it runs through the executor on each node's own data, is
never fed back to training, and never appears in the ledger.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch

from lowband.algorithms.base import SERVER, Algorithm, NodeContext, State
from lowband.engine.executor import Executor
from lowband.topology import RoundPlan
from lowband.train import evaluate, weighted_average


def worst_fraction_mean(values: Sequence[float], fraction: float = 0.1) -> float:
    """Mean of the lowest ``fraction`` of values (at least one value)."""
    vals = sorted(v for v in values if not math.isnan(v))
    if not vals:
        return float("nan")
    k = max(1, int(math.floor(len(vals) * fraction)))
    return float(np.mean(vals[:k]))


class Evaluator:
    """Runs the configured protocols every ``every`` rounds and returns a flat metric dict."""

    def __init__(self, protocols: Sequence[str], algorithm: Algorithm, executor: Executor,
                 num_nodes: int, test_x: torch.Tensor, test_y: torch.Tensor, batch_size: int = 2000):
        self.protocols = list(protocols)
        self.alg = algorithm
        self.ex = executor
        self.num_nodes = num_nodes
        self.test_x, self.test_y = test_x, test_y
        self.batch_size = batch_size
        if "global" in self.protocols and not algorithm.has_server:
            raise ValueError(f"eval.protocols: 'global' needs a server; {algorithm.name} has none (use consensus or node_global)")

    def __call__(self, round: int, plan: RoundPlan) -> dict[str, float]:
        out: dict[str, float] = {}
        nodes = range(self.num_nodes)
        server_params = None
        if self.alg.has_server:
            server_params = self.ex.map_nodes(lambda ctx, s: self.alg.server_params(s), [SERVER], round, plan)[SERVER]
        bs = self.batch_size

        if "global" in self.protocols and server_params is not None:
            res = self.ex.map_nodes(
                lambda ctx, s: evaluate(ctx.model, server_params, self.test_x, self.test_y, bs), [SERVER], round, plan
            )[SERVER]
            out["global/acc"], out["global/loss"] = res[0], res[1]

        if "personal" in self.protocols:
            use_global = not self.alg.personalized

            def personal(ctx: NodeContext, s: State) -> tuple[float, float, int]:
                params = server_params if use_global else self.alg.node_params(s)
                if params is None or ctx.data.test_y.numel() == 0:
                    return float("nan"), float("nan"), 0
                return evaluate(ctx.model, params, ctx.data.test_x, ctx.data.test_y, bs)

            res = self.ex.map_nodes(personal, nodes, round, plan)
            accs = np.array([res[n][0] for n in nodes], dtype=float)
            losses = np.array([res[n][1] for n in nodes], dtype=float)
            ns = np.array([res[n][2] for n in nodes], dtype=float)
            ok = ns > 0
            if ok.any():
                out["personal/acc_weighted"] = float(np.sum(accs[ok] * ns[ok]) / ns[ok].sum())
                out["personal/acc_mean"] = float(accs[ok].mean())
                out["personal/acc_worst10"] = worst_fraction_mean(accs[ok].tolist(), 0.1)
                out["personal/loss"] = float(np.sum(losses[ok] * ns[ok]) / ns[ok].sum())

        if "node_global" in self.protocols:
            res = self.ex.map_nodes(
                lambda ctx, s: evaluate(ctx.model, self.alg.node_params(s), self.test_x, self.test_y, bs)[:2]
                if self.alg.node_params(s) is not None else (float("nan"), float("nan")),
                nodes, round, plan,
            )
            accs = np.array([res[n][0] for n in nodes], dtype=float)
            out["node_global/acc"] = float(np.nanmean(accs))
            out["node_global/acc_std"] = float(np.nanstd(accs))
            out["node_global/loss"] = float(np.nanmean([res[n][1] for n in nodes]))

        if "consensus" in self.protocols:
            params = self.ex.map_nodes(lambda ctx, s: self.alg.node_params(s), nodes, round, plan)
            plist = [params[n] for n in nodes if params[n] is not None]
            if plist:
                avg = weighted_average(plist)
                res = self.ex.map_nodes(
                    lambda ctx, s: evaluate(ctx.model, avg, self.test_x, self.test_y, bs), [0], round, plan
                )[0]
                out["consensus/acc"], out["consensus/loss"] = res[0], res[1]
        return out


def default_protocols(alg: Algorithm, fed: Any, requested: Optional[Sequence[str]]) -> list[str]:
    """The protocols to run: the config's, else the algorithm's defaults that the data allows."""
    if requested:
        return list(requested)
    protos = list(alg.default_protocols)
    has_local_test = any(int(nd.test_y.numel()) > 0 for nd in fed.nodes)
    if not has_local_test and "personal" in protos:
        protos.remove("personal")
    if not alg.has_server and "global" in protos:
        protos.remove("global")
    return protos
