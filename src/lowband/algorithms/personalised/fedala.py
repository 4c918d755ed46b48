"""FedALA: adaptive local aggregation (Zhang et al., AAAI 2023; PFLlib ``clientala``).

Each client keeps its own model. When it receives the global model w_g it builds its
starting point by Adaptive Local Aggregation (ALA):

- the lower parameter tensors (all but the top ``layers`` = p) are taken from w_g;
- each of the top p tensors becomes w_l + (w_g - w_l) * W, with element-wise weights
  W in [0, 1] learned on a random ``rand_percent`` = s% of the client's training data:
  per batch, W <- clip(W - eta * grad_{w_t} * (w_g - w_l), 0, 1) (eta = 1.0).
  In the client's first ALA ("start phase") W is trained epoch after epoch until the std
  of the last ``num_pre_loss`` epoch losses is below ``threshold`` (at most
  ``max_init_epochs``: PFLlib's loop has no cap); afterwards one epoch per round.
  W starts at all ones and is kept in the client's state between rounds.
- ALA is skipped while the client's model still equals the global one in its first
  tensor (PFLlib's "deactivate ALA at the 1st communication iteration").

Then ordinary local training; the server averages full models with sample weights.
Defaults p = 2 (the head's weight and bias), s = 80, eta = 1.0, threshold 0.1,
num_pre_loss 10. The ``personal`` protocol evaluates the model each client holds.

Choice: the s% subset is a random subset drawn per round from the client's addressed
generator (PFLlib takes a contiguous window at a random offset of an unshuffled loader).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, Params, State, register
from lowband.algorithms.common import local_train
from lowband.algorithms.server.fedavg import FedAvg, FedAvgHP
from lowband.algorithms.personalised._pfl import fedavg_reply
from lowband.train import batches, load_params
from lowband.train.steps import projected_step


class FedALAHP(FedAvgHP):
    layers: int = Field(2, ge=1, description="p: number of top parameter tensors aggregated adaptively")
    rand_percent: float = Field(80, gt=0, le=100, description="s: percent of local training data used to learn W")
    eta: float = Field(1.0, gt=0, description="learning rate of the aggregation weights W")
    threshold: float = Field(0.1, gt=0, description="start phase: stop when std of recent losses < threshold")
    num_pre_loss: int = Field(10, ge=1, description="start phase: number of recent losses in the std")
    max_init_epochs: int = Field(50, ge=1, description="start phase: cap on the epochs learning W")


def adaptive_local_aggregation(ctx: NodeContext, local: Params, glob: Params, weights: dict[str, torch.Tensor],
                               start_phase: bool) -> tuple[Params, dict[str, torch.Tensor], bool, int]:
    """ALA: returns (initialised local model, learned W, still in start phase, epochs run)."""
    hp = ctx.hp
    model = ctx.model
    names = [n for n, _ in model.named_parameters()]
    first = names[0]
    if torch.equal(local[first], glob[first]):
        return dict(local), weights, start_phase, 0
    top = names[-hp.layers:]
    lower = [n for n in glob if n not in set(top)]
    if not weights:
        weights = {n: torch.ones_like(local[n]) for n in top}
    else:
        weights = {n: w.clone() for n, w in weights.items()}
    start = {n: glob[n] for n in lower}
    diff = {n: glob[n] - local[n] for n in top}
    for n in top:
        start[n] = local[n] + diff[n] * weights[n]
    load_params(model, start)
    model.train()
    named = dict(model.named_parameters())
    for n in names:
        named[n].requires_grad_(n in top)
    x, y = ctx.data.train_x, ctx.data.train_y
    gen = ctx.rng("ala")
    m = max(1, int(hp.rand_percent / 100 * int(y.shape[0])))
    sub = torch.randperm(int(y.shape[0]), generator=gen)[:m]
    xs, ys = x[sub], y[sub]
    losses: list[float] = []
    epochs = 0
    try:
        while True:
            for idx in batches(m, hp.batch_size, gen):
                model.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xs[idx]), ys[idx])
                loss.backward()
                with torch.no_grad():
                    for n in top:
                        weights[n] = projected_step(weights[n], named[n].grad, hp.eta, scale=diff[n])
                        named[n].copy_(local[n] + diff[n] * weights[n])
            losses.append(float(loss.detach()))
            epochs += 1
            if not start_phase:
                break
            if len(losses) > hp.num_pre_loss and np.std(losses[-hp.num_pre_loss:]) < hp.threshold:
                break
            if epochs >= hp.max_init_epochs:
                break
    finally:
        for n in names:
            named[n].requires_grad_(True)
    out = dict(start)
    for n in top:
        out[n] = named[n].detach().clone()
    return out, weights, False, epochs


@register
class FedALA(FedAvg):
    """FedAvg whose clients start each round from an adaptively aggregated personal model."""

    name = "fedala"
    paper = "Zhang et al., FedALA: Adaptive Local Aggregation for Personalized Federated Learning, AAAI 2023"
    Hyperparams = FedALAHP
    personalized = True

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params(), "ala_weights": {}, "start_phase": True}

    def node_params(self, state: State):
        return state.get("params")

    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = inbox[0].msg.tensors
        start, weights, phase, _ = adaptive_local_aggregation(ctx, state["params"], glob, state["ala_weights"],
                                                              state["start_phase"])
        params, stats = local_train(ctx, start)
        new = {"params": params, "ala_weights": weights, "start_phase": phase, "loss": stats.loss}
        return new, Outbox().send(SERVER, fedavg_reply(ctx, params, glob))
