"""FedDBE: domain bias elimination (Zhang et al., "Eliminating Domain Bias for Federated
Learning in Representation Space", NeurIPS 2023; PFLlib ``clientdbe`` / ``serverdbe``).

Each client keeps a personalised representation bias ``client_mean`` (a D-vector, zero at
first, trained by SGD together with the model): predictions are head(features(x) + bias).
A mean regulariser pulls the client's running representation mean towards the global mean
g: per batch, running = (1 - m) running + m mean_batch(features), and the loss is
    CE(head(z + bias), y) + kappa * mean(0.5 (running - g)^2).
Defaults kappa = 50, m = 1.0 (the original run script: the running mean is the batch mean).

Initialisation period (PFLlib ``serverdbe.__init__``), run in round 1 before the first
FedAvg round: *every* client trains once from the initial model without the bias or the
regulariser and uploads its running mean (D floats); the server forms g as the sample-
weighted mean and sends it to every client; g stays fixed afterwards. Then rounds are
FedAvg rounds (full model down and up, sample-weighted average); the bias never leaves
the client. The ``personal`` protocol evaluates head(features + bias) with the model the
client holds (the bias is folded into the head's bias: W(z + b) + c = Wz + (Wb + c)).

Choice: the warm-up needs the number of clients when round 1's steps are built; it is
recorded when the server state is initialised (a run resumed after round 1 never needs it).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.personalised._pfl import fedavg_reply, train_kwargs
from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, Params, State, Step, register
from lowband.algorithms.server.fedavg import FedAvg, FedAvgHP
from lowband.comm.message import Message
from lowband.topology import RoundPlan
from lowband.train import sgd_train


class FedDBEHP(FedAvgHP):
    kappa: float = Field(50.0, ge=0, description="weight of the mean regulariser (original run script: 50)")
    momentum_mean: float = Field(1.0, gt=0, le=1, description="running-mean momentum m (1.0: the batch mean)")


def dbe_train(ctx: NodeContext, params: Params, client_mean: torch.Tensor, global_mean: Optional[torch.Tensor]
              ) -> tuple[Params, torch.Tensor, torch.Tensor, float]:
    """Local epochs with the DBE loss: returns (params, new bias, running mean, mean loss)."""
    hp = ctx.hp
    bias = client_mean.clone().requires_grad_(True)
    running = {"mean": torch.zeros_like(client_mean)}

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rep = model.features(x)
        running["mean"] = (1 - hp.momentum_mean) * running["mean"].detach() + hp.momentum_mean * rep.mean(0)
        if global_mean is None:
            return F.cross_entropy(model.head(rep), y)
        reg = torch.mean(0.5 * (running["mean"] - global_mean) ** 2)
        return F.cross_entropy(model.head(rep + bias), y) + hp.kappa * reg

    out, stats = sgd_train(ctx.model, params, ctx.data.train_x, ctx.data.train_y, gen=ctx.rng("local"),
                          loss_fn=loss, extra=[bias], **train_kwargs(ctx))
    return out, bias.detach().clone(), running["mean"].detach().clone(), stats.loss


@register
class FedDBE(FedAvg):
    """FedAvg with a personal representation bias and mean regularisation."""

    name = "feddbe"
    paper = "Zhang et al., Eliminating Domain Bias for Federated Learning in Representation Space, NeurIPS 2023"
    Hyperparams = FedDBEHP
    personalized = True

    def init_node(self, ctx: NodeContext) -> State:
        params = ctx.init_params()
        d = ctx.model.feature_dim
        dev = next(iter(params.values())).device
        return {"params": params, "client_mean": torch.zeros(d, device=dev), "global_mean": torch.zeros(d, device=dev)}

    def node_params(self, state: State) -> Optional[Params]:
        p = state.get("params")
        if p is None:
            return None
        out = dict(p)
        out["head.bias"] = p["head.bias"] + p["head.weight"] @ state["client_mean"]
        return out

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        regular = super().steps(round, plan)
        if round != 1:
            return regular
        if self.num_nodes is None:
            raise RuntimeError("feddbe: round 1's initialisation period involves every client and needs their "
                               "number; the simulation sets Algorithm.num_nodes before the first round")
        everyone = list(range(self.num_nodes))
        return [Step("dbe_warmup", everyone, self.client_warmup),
                Step("dbe_global_mean", [SERVER], self.server_global_mean),
                Step("dbe_store", everyone, self.client_store)] + regular

    # -- initialisation period ---------------------------------------------------------
    def client_warmup(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        params, _, running, _ = dbe_train(ctx, state["params"], state["client_mean"], None)
        msg = Message("dbe_mean", {"running_mean": running}, meta={"num_examples": ctx.data.n_train})
        return {**state, "params": params}, Outbox().send(SERVER, msg)

    def server_global_mean(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:  # every client's mean was refused (or dropped): no global mean this time
            return state, Outbox()
        means = torch.stack([e.msg.tensors["running_mean"] for e in inbox])
        w = torch.tensor([float(e.msg.meta["num_examples"]) for e in inbox], device=means.device)
        g = (w[:, None] * means).sum(0) / w.sum()
        dsts = [e.src for e in inbox]
        return state, Outbox().broadcast(dsts, Message("dbe_global_mean", {"global_mean": g}))

    def client_store(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:  # its own mean was refused or late, so the server sent it nothing: keep the zero mean
            return state, Outbox()
        return {**state, "global_mean": inbox[0].msg.tensors["global_mean"].clone()}, Outbox()

    # -- rounds ---------------------------------------------------------------------------
    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = inbox[0].msg.tensors
        params, bias, _, loss = dbe_train(ctx, glob, state["client_mean"], state["global_mean"])
        new = {**state, "params": params, "client_mean": bias, "loss": loss}
        return new, Outbox().send(SERVER, fedavg_reply(ctx, params, glob))
