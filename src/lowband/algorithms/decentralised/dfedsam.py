"""DFedSAM (Shi et al., "Improving the Model Consistency of Decentralized Federated Learning",
ICML 2023), as run by the NTK-DFL reference code (specs/ntk_dfl_spark.md, baselines).

Round: every node trains locally with (adaptive) sharpness-aware minimisation, then sends
its weights to its neighbours in the round's graph and replaces them by the uniform
closed-neighbourhood average (synchronous), like DFedAvg.

One local step on a batch (the SAM code the reference imports, ``adaptive=True``):

    g      = grad L(w)
    g_norm = || |w| * g ||_2                      (over all parameters)
    e      = w^2 * g * rho / (g_norm + 1e-12)     (adaptive; plain SAM: g * rho / ||g||)
    g'     = grad L(w + e)
    w      <- SGD step (momentum, weight decay) from w with g'

Defaults are the reference's: lr 0.01 * 0.95^(r-1) (1-based rounds), batch 32, 5 local
epochs, momentum 0.99 (a fresh optimiser every round), rho 0.01, weight decay 5e-4.
"""

from __future__ import annotations

from pydantic import Field

from lowband.algorithms.base import Envelope, NodeContext, Outbox, State, register
from lowband.algorithms.common import LocalSGD
from lowband.algorithms.decentralised.gossip import GossipAlgorithm
from lowband.comm.message import Message
from lowband.train import decayed_lr
from lowband.train.sam import sam_train


class DFedSAMHP(LocalSGD):
    lr: float = Field(0.01, gt=0, description="local learning rate (decayed by lr_decay per round)")
    lr_decay: float = Field(0.95, gt=0, le=1, description="lr_r = lr * lr_decay**(r-1)")
    batch_size: int = Field(32, ge=1, description="local minibatch size")
    local_epochs: int = Field(5, ge=0, description="local epochs per round")
    momentum: float = Field(0.99, ge=0, lt=1, description="SGD momentum (fresh optimiser every round)")
    weight_decay: float = Field(5e-4, ge=0, description="L2 weight decay")
    rho: float = Field(0.01, gt=0, description="SAM neighbourhood radius")
    adaptive: bool = Field(True, description="adaptive SAM (ASAM): perturbation scaled by |w|")


@register
class DFedSAM(GossipAlgorithm):
    """Local adaptive-SAM training, then synchronous closed-neighbourhood averaging."""

    name = "dfedsam"
    paper = "Shi et al., Improving the Model Consistency of Decentralized Federated Learning, ICML 2023"
    Hyperparams = DFedSAMHP

    def train_send(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        hp = self.hp
        lr = decayed_lr(hp.lr, hp.lr_decay, ctx.round)
        params, stats = sam_train(ctx.model, state["params"], ctx.data.train_x, ctx.data.train_y,
                                  epochs=hp.local_epochs, batch_size=hp.batch_size, lr=lr, gen=ctx.rng("local"),
                                  rho=hp.rho, adaptive=hp.adaptive, momentum=hp.momentum,
                                  weight_decay=hp.weight_decay, grad_clip=hp.grad_clip)
        out = Outbox().broadcast(ctx.neighbors, Message("weights", params))
        return {"params": params, "loss": stats.loss}, out
