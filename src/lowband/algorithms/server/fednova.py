"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020).

Clients run FedAvg's local SGD; client i reports (message metadata ``a``) the normaliser of
the tau_i local steps it took, with its sample count. With
plain SGD its normaliser is a_i = tau_i (with heavy-ball momentum rho,
a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho), the paper's formula). The
server forms the normalised cumulative updates d_i = (w - w_i) / a_i, the effective step
count tau_eff = sum_i p_i a_i (p_i = n_i / sum n) and moves
w <- w - tau_eff * sum_i p_i d_i.

The server takes that step with FedAvg's ``server_opt``: ``sgd`` moves
w <- w - server_lr * tau_eff * sum_i p_i d_i (the paper's update at server_lr = 1); the
other optimisers use -tau_eff * sum_i p_i d_i as their pseudo-gradient.
When every client takes the same number of steps this is exactly FedAvg; it differs when
clients hold different amounts of data (tau_i = epochs * ceil(n_i / B)), which is the
point of the method. Clients are stateless (``personal`` evaluates the global model).
"""

from __future__ import annotations

from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, State, register
from lowband.algorithms.common import local_train
from lowband.algorithms.server.fedavg import FedAvg, FedAvgHP, _complete
from lowband.comm.message import Message
from lowband.train import is_float


class FedNovaHP(FedAvgHP):
    pass


def normaliser(steps: int, momentum: float = 0.0) -> float:
    """a_i: the norm of client i's accumulated-gradient coefficient vector (l1), FedNova eq. 9."""
    if steps <= 0:
        return 0.0
    if momentum == 0.0:
        return float(steps)
    r = momentum
    return (steps - r * (1 - r ** steps) / (1 - r)) / (1 - r)


@register
class FedNova(FedAvg):
    """FedAvg with updates normalised by each client's number of local steps."""

    name = "fednova"
    stateless_clients = True  # a client keeps no model between rounds (config.bounds)
    paper = "Wang et al., Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization, NeurIPS 2020"
    Hyperparams = FedNovaHP
    personalized = False

    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = inbox[0].msg.tensors
        params, stats = local_train(ctx, glob)
        a = normaliser(stats.steps, self.hp.momentum)
        delta = self.hp.upload == "delta"
        payload = {k: (v - glob[k]) if (delta and is_float(v)) else v for k, v in params.items()}
        msg = Message("delta" if delta else "weights", payload,
                      meta={"num_examples": ctx.data.n_train, "a": a})
        return {**state, "loss": stats.loss, "tau": stats.steps}, Outbox().send(SERVER, msg)

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = state["params"]
        inbox = [e for e in inbox if float(e.msg.meta["a"]) > 0]
        if not inbox:
            return state, Outbox()
        n = [float(e.msg.meta["num_examples"]) for e in inbox]
        p = [ni / sum(n) for ni in n]
        a = [float(e.msg.meta["a"]) for e in inbox]
        tau_eff = sum(pi * ai for pi, ai in zip(p, a))
        zero = self.hp.upload == "delta"
        received = [_complete(e.msg.tensors, glob, zero=zero) for e in inbox]
        direction = {}  # the pseudo-gradient tau_eff * sum_i p_i d_i (a step direction: added)
        for k, g in glob.items():
            if not is_float(g):
                direction[k] = g.clone()
                continue
            step = g.new_zeros(g.shape, dtype=g.dtype)
            for r, pi, ai in zip(received, p, a):
                t = r[k].to(g.dtype)
                local_minus_global = t if zero else t - g
                step += (pi / ai) * local_minus_global
            direction[k] = tau_eff * step
        return self.server_apply(ctx, state, direction), Outbox()
