"""MOON: model-contrastive federated learning (Li, He and Song, CVPR 2021).

FedAvg, with the client objective
    CE(w; x, y) + mu * l_con,
    l_con = -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) ),
where z is the representation (``model.features``) of the model being trained, z_glob that
of the received global model (positive pair) and z_prev that of the client's own model
from its previous participation (negative pair), sim the cosine similarity. Defaults
mu = 1, tau = 0.5 (the spec; MOON's CIFAR-10 setting uses mu = 5).

Choices: the representation is ``features(x)`` (PFLlib's ``model.base``; the original
code adds a projection head that our models do not have). The two teachers are frozen
copies in eval mode. A client that has never been sampled uses the shared initial model
as its "previous" model (the original code's initial pool). The previous model stays in
the client's state; nothing extra crosses the network (bytes as FedAvg). Prediction uses
the global model (``personalized = False``, as PFLlib evaluates MOON).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.personalised._pfl import fedavg_reply, frozen_copy
from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, State, register
from lowband.algorithms.common import local_train
from lowband.algorithms.server.fedavg import FedAvg, FedAvgHP
from lowband.train import Params


class MOONHP(FedAvgHP):
    mu: float = Field(1.0, ge=0, description="weight of the model-contrastive loss (0 would be FedAvg)")
    temperature: float = Field(0.5, gt=0, description="contrastive temperature tau")


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """MOON's l_con, averaged over the batch."""
    pos = F.cosine_similarity(z, z_glob, dim=-1) / temperature
    neg = F.cosine_similarity(z, z_prev, dim=-1) / temperature
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


@register
class MOON(FedAvg):
    """FedAvg with a model-contrastive term in the local objective."""

    name = "moon"
    paper = "Li, He and Song, Model-Contrastive Federated Learning, CVPR 2021"
    Hyperparams = MOONHP
    personalized = False

    def init_node(self, ctx: NodeContext) -> State:
        return {}  # "prev" appears after the first participation

    def moon_loss(self, ctx: NodeContext, glob: Params, prev: Params):
        mu, tau = self.hp.mu, self.hp.temperature
        g_model, p_model = frozen_copy(ctx.model, glob), frozen_copy(ctx.model, prev)

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = model.features(x)
            ce = F.cross_entropy(model.head(z), y)
            if mu == 0:
                return ce
            with torch.no_grad():
                zg, zp = g_model.features(x), p_model.features(x)
            return ce + mu * contrastive_loss(z, zg, zp, tau)

        return loss

    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = inbox[0].msg.tensors
        prev = state.get("prev") or ctx.init_params()
        params, stats = local_train(ctx, glob, self.moon_loss(ctx, glob, prev))
        return {"prev": params, "loss": stats.loss}, Outbox().send(SERVER, fedavg_reply(ctx, params, glob))
