"""Pieces several algorithms share: the local-training hyperparameters and step."""

from __future__ import annotations

from typing import Callable, Optional

from pydantic import Field
from torch import nn

from lowband.algorithms.base import Hyperparams, NodeContext, Params
from lowband.train import LossFn, TrainStats, cross_entropy, decayed_lr
from lowband.train.cohort import SGDJob


class LocalSGD(Hyperparams):
    """Local SGD settings shared by most methods (each method overrides the defaults)."""

    lr: float = Field(0.05, gt=0, description="local learning rate")
    batch_size: int = Field(32, ge=1, description="local minibatch size")
    local_epochs: int = Field(5, ge=0, description="local epochs per round")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (reset every round)")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay")
    lr_decay: float = Field(1.0, gt=0, le=1, description="multiply lr by lr_decay**(round-1)")
    grad_clip: Optional[float] = Field(None, gt=0, description="clip the gradient norm (None: off)")


def round_lr(ctx: NodeContext, hp: Optional[LocalSGD] = None) -> float:
    """The local learning rate of round ``ctx.round``: ``lr * lr_decay**(round - 1)``."""
    hp = hp or ctx.hp
    return decayed_lr(hp.lr, hp.lr_decay, ctx.round)


def local_job(ctx: NodeContext, params: Params, loss_fn: LossFn = cross_entropy,
              hp: Optional[LocalSGD] = None, purpose: str = "local",
              grad_hook: Optional[Callable[[nn.Module], None]] = None) -> SGDJob:
    """The local SGD :func:`local_train` runs, as a job (``job.run(ctx.model)`` runs it; the
    executor may run many nodes' jobs as one vectorised cohort, lowband.train.cohort)."""
    hp = hp or ctx.hp
    return SGDJob(params=params, x=ctx.data.train_x, y=ctx.data.train_y, epochs=hp.local_epochs,
                  batch_size=hp.batch_size, lr=round_lr(ctx, hp), gen=ctx.rng(purpose), momentum=hp.momentum,
                  weight_decay=hp.weight_decay, loss_fn=loss_fn, grad_clip=hp.grad_clip, grad_hook=grad_hook)


def local_train(ctx: NodeContext, params: Params, loss_fn: LossFn = cross_entropy,
                hp: Optional[LocalSGD] = None, purpose: str = "local",
                grad_hook: Optional[Callable[[nn.Module], None]] = None) -> tuple[Params, TrainStats]:
    """Run ``hp.local_epochs`` of SGD on the node's own train split from ``params``
    (``grad_hook(model)`` may edit the gradients after each backward: SCAFFOLD's correction)."""
    return local_job(ctx, params, loss_fn, hp, purpose, grad_hook).run(ctx.model)
