"""Small pieces the personalised-FL baselines share (MOON, FedALA, FedDBE, FedAS, FedNTD,
FedPAC, FedSPU): frozen teacher copies, base/head splits, class prototypes and a local SGD
loop with extra trainable tensors, frozen parameters and gradient masks.

Everything here runs on one node with that node's own data and model (design rule 1).
"""

from __future__ import annotations

import copy
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from lowband.algorithms.base import NodeContext, Params
from lowband.train import TrainStats, decayed_lr, load_params, sgd_train

HEAD_PREFIX = "head."


def frozen_copy(model: nn.Module, params: Params) -> nn.Module:
    """An eval-mode copy of ``model`` holding ``params``, with gradients off (a teacher)."""
    m = copy.deepcopy(model)
    load_params(m, params)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def head_names(model: nn.Module) -> list[str]:
    """Parameter names of the classifier ``head`` (the model convention)."""
    return [n for n, _ in model.named_parameters() if n.startswith(HEAD_PREFIX)]


def base_names(model: nn.Module) -> list[str]:
    """Parameter names of everything before the head (the representation)."""
    return [n for n, _ in model.named_parameters() if not n.startswith(HEAD_PREFIX)]


def is_head(name: str) -> bool:
    return name.startswith(HEAD_PREFIX)


@torch.no_grad()
def features_of(model: nn.Module, params: Optional[Params], x: torch.Tensor, batch_size: int = 2000) -> torch.Tensor:
    """Representations ``model.features(x)`` in eval mode (``params`` None: as loaded)."""
    if params is not None:
        load_params(model, params)
    model.eval()
    outs = [model.features(x[i:i + batch_size]) for i in range(0, int(x.shape[0]), batch_size)]
    return torch.cat(outs) if outs else torch.empty(0)


def class_prototypes(feats: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, D) per-class mean representation and a (C,) bool mask of the classes present."""
    d = feats.shape[1] if feats.ndim == 2 else 0
    protos = torch.zeros(num_classes, d, device=feats.device)
    counts = torch.bincount(y, minlength=num_classes)[:num_classes].to(torch.float32)
    protos.index_add_(0, y, feats.to(torch.float32))
    valid = counts > 0
    protos[valid] /= counts[valid, None]
    return protos, valid


LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def sgd_loop(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    gen: torch.Generator,
    loss_fn: LossFn,
    trainable: Optional[Sequence[str]] = None,
    extra: Iterable[torch.Tensor] = (),
    grad_hook: Optional[Callable[[nn.Module], None]] = None,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    grad_clip: Optional[float] = None,
) -> tuple[Params, TrainStats]:
    """:func:`lowband.train.sgd_train` (plain SGD, fresh optimiser every call) with the
    options the baselines use: ``trainable``, ``extra`` and ``grad_hook`` (see there)."""
    return sgd_train(model, params, x, y, epochs=epochs, batch_size=batch_size, lr=lr, gen=gen,
                     loss_fn=loss_fn, trainable=trainable, extra=extra, grad_hook=grad_hook,
                     momentum=momentum, weight_decay=weight_decay, grad_clip=grad_clip)


def local_lr(ctx: NodeContext) -> float:
    """The round's learning rate (``lr * lr_decay**(round-1)``), as ``local_train`` uses."""
    hp = ctx.hp
    return decayed_lr(hp.lr, hp.lr_decay, ctx.round)


def train_kwargs(ctx: NodeContext) -> dict:
    """The LocalSGD settings of ``ctx.hp`` as keyword arguments of :func:`sgd_loop`."""
    hp = ctx.hp
    return {"epochs": hp.local_epochs, "batch_size": hp.batch_size, "lr": local_lr(ctx),
            "momentum": hp.momentum, "weight_decay": hp.weight_decay, "grad_clip": hp.grad_clip}


def fedavg_reply(ctx: NodeContext, params: Params, glob: Params):
    """The message FedAvg's server expects from a client: weights, or weights minus the
    received global model when ``hp.upload == "delta"``; with the sample count (the only
    metadata the server uses)."""
    from lowband.comm.message import Message

    if ctx.hp.upload == "delta":
        payload = {k: (v - glob[k]) if v.is_floating_point() else v for k, v in params.items()}
        kind = "delta"
    else:
        payload, kind = params, "weights"
    return Message(kind, payload, meta={"num_examples": ctx.data.n_train})
