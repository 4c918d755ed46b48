"""The algorithm's own per-round diagnostics (measurement only), as ``alg/<key>`` metrics.

``Algorithm.round_metrics(server_state)`` on the server, and ``Algorithm.node_metrics(ctx,
state)`` on every node that has one (a node must put its id in node-specific keys: a key
repeated by two nodes is an error). Nodes the backend does not hold (a Flower run's
clients) give none.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from lowband.algorithms.base import SERVER, Algorithm
from lowband.engine.observers.base import Observer, Round, Run

__all__ = ["Diagnostics"]


def _round_metrics(ctx: Any, state: Any, alg: Algorithm) -> dict[str, float]:
    return alg.round_metrics(state)


class Diagnostics(Observer):
    def on_eval(self, run: Run, rnd: Round, rec: dict[str, Any]) -> None:
        sim, alg, r, plan = run.sim, run.sim.alg, rnd.number, rnd.plan
        if alg.has_server:
            extra = sim.backend.map_nodes(partial(_round_metrics, alg=alg), [SERVER], r, plan)[SERVER]
            rec.update({f"alg/{k}": float(v) for k, v in (extra or {}).items()})
        if type(alg).node_metrics is Algorithm.node_metrics:
            return
        nodes = list(range(sim.num_nodes)) + ([SERVER] if alg.has_server else [])
        per_node = sim.backend.map_nodes(alg.node_metrics, nodes, r, plan)
        for n in nodes:
            for k, v in (per_node.get(n) or {}).items():
                if f"alg/{k}" in rec:
                    raise ValueError(f"{alg.name}.node_metrics: node {n} repeats metric {k!r}; "
                                     f"include the node id in node-specific keys")
                rec[f"alg/{k}"] = float(v)
