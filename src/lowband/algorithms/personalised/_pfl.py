"""Small pieces the personalised-FL baselines share (MOON, FedALA, FedDBE, FedAS, FedNTD,
FedPAC, FedSPU): frozen teacher copies, base/head splits, class prototypes, and the local
SGD settings as keyword arguments of :func:`lowband.train.sgd_train` (whose ``trainable``,
``extra`` and ``grad_hook`` serve their frozen parameters, extra tensors and masks).

Everything here runs on one node with that node's own data and model (design rule 1).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from lowband.algorithms.base import NodeContext, Params
from lowband.algorithms.common import round_lr
from lowband.train import load_params

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


def train_kwargs(ctx: NodeContext) -> dict:
    """The LocalSGD settings of ``ctx.hp`` as keyword arguments of :func:`lowband.train.sgd_train`."""
    hp = ctx.hp
    return {"epochs": hp.local_epochs, "batch_size": hp.batch_size, "lr": round_lr(ctx),
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
