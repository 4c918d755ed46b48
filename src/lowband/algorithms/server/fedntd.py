"""FedNTD: federated not-true distillation (Lee et al., NeurIPS 2022).

FedAvg (sample-weighted aggregation), with the client objective
    CE(z, y) + beta * tau^2 * KL( softmax(z_g^nt / tau) || softmax(z^nt / tau) )
where z are the local logits, z_g the received global model's logits (a frozen teacher in
eval mode) and ``nt`` removes the true class's logit (the "not-true" classes), the KL
averaged over the batch (``batchmean``). Defaults beta = 1, tau = 1. Bytes as FedAvg;
prediction uses the global model (``personalized = False``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.personalised._pfl import frozen_copy
from lowband.algorithms.base import NodeContext, register
from lowband.algorithms.server.fedavg import FedAvg, FedAvgHP
from lowband.train import Params


class FedNTDHP(FedAvgHP):
    beta: float = Field(1.0, ge=0, description="weight of the not-true distillation loss (0 would be FedAvg)")
    tau: float = Field(1.0, gt=0, description="distillation temperature")


def not_true(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(B, C-1) logits with each row's true class removed (order of the rest kept)."""
    b, c = logits.shape
    keep = torch.ones(b, c, dtype=torch.bool, device=logits.device)
    keep[torch.arange(b, device=logits.device), y] = False
    return logits[keep].reshape(b, c - 1)


def ntd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """tau^2 * KL(softmax(teacher_nt / tau) || softmax(student_nt / tau)), batch mean."""
    log_p = F.log_softmax(not_true(logits, y) / tau, dim=1)
    q = F.softmax(not_true(teacher_logits, y) / tau, dim=1)
    return tau ** 2 * F.kl_div(log_p, q, reduction="batchmean")


@register
class FedNTD(FedAvg):
    """FedAvg with not-true distillation from the global model."""

    name = "fedntd"
    stateless_clients = True  # a client keeps no model between rounds (config.bounds)
    paper = "Lee et al., Preservation of the Global Knowledge by Not-True Distillation in Federated Learning, NeurIPS 2022"
    Hyperparams = FedNTDHP
    personalized = False

    def loss_fn(self, ctx: NodeContext, global_params: Params):
        beta, tau = self.hp.beta, self.hp.tau
        teacher = frozen_copy(ctx.model, global_params)

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = model(x)
            ce = F.cross_entropy(logits, y)
            if beta == 0:
                return ce
            with torch.no_grad():
                t = teacher(x)
            return ce + beta * ntd_loss(logits, t, y, tau)

        return loss
