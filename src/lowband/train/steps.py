"""Optimiser steps and small loops that algorithms with their own objective run: one
descent step on any loss (DENSE's generator and distillation, FOL's gate training), masked
SGD (DisPFL's sparse local training), the ensemble weights of a mixture of logits (FOL's
eq. 11). The objective stays in the algorithm file, where it reads as the paper writes
it; the update is written here, once."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from lowband.train.params import Params, get_params, load_params
from lowband.train.sgd import batches


def descend(opt: Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]], loss: torch.Tensor, *,
            clip: Optional[tuple[Iterable[torch.Tensor], float]] = None, set_to_none: bool = True) -> None:
    """One step of ``opt`` (or of each optimiser in turn) on ``loss``: zero the gradients,
    backward, clip the gradient norm of ``clip = (tensors, max_norm)`` if given, step.
    (The gradients are zeroed after ``loss`` was computed: a forward pass does not touch
    them, so this is the usual zero-forward-backward-step order.)"""
    opts = [opt] if isinstance(opt, torch.optim.Optimizer) else list(opt)
    for o in opts:
        o.zero_grad(set_to_none=set_to_none)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(clip[0], clip[1])
    for o in opts:
        o.step()


def masked_sgd_train(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                     masks: dict[str, torch.Tensor], *, epochs: int, batch_size: int, lr: float,
                     gen: torch.Generator, momentum: float = 0.0, weight_decay: float = 0.0,
                     grad_clip: Optional[float] = None) -> Params:
    """Epochs of SGD from ``params`` on ``(x, y)`` keeping the model sparse: after every
    step each masked parameter is multiplied by its 0/1 mask (DisPFL's local training of a
    personalised sparse model). A fresh optimiser per call."""
    load_params(model, params)
    model.train()
    n = int(y.shape[0])
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    named = dict(model.named_parameters())
    for _ in range(epochs if n else 0):
        for idx in batches(n, batch_size, gen):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            with torch.no_grad():
                for k, m in masks.items():
                    named[k].mul_(m)
    return get_params(model)


def fit_mixture_weights(logits: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float) -> torch.Tensor:
    """``w = softmax(beta)`` minimising the cross-entropy of ``sum_i w_i logits_i`` on labels
    ``y`` (``logits``: (K, N, C)), by ``steps`` Adam steps from ``beta = 0`` (uniform)."""
    k = int(logits.shape[0])
    beta = torch.zeros(k, device=logits.device, requires_grad=True)
    if steps == 0 or int(y.numel()) == 0 or k == 1:
        return torch.softmax(beta.detach(), 0)
    opt = torch.optim.Adam([beta], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        w = torch.softmax(beta, 0)
        F.cross_entropy(torch.einsum("k,knc->nc", w, logits), y).backward()
        opt.step()
    return torch.softmax(beta.detach(), 0)


def sgd_update(params: Params, grad: Params, lr: float) -> Params:
    """One plain gradient step on a parameter dict: ``params[k] - lr * grad[k]`` for every
    ``k`` in ``grad`` (new tensors), the other entries (buffers) as they are (D-PSGD's
    ``x_i <- sum_j W_ij x_j - lr * g_i`` after the mixing)."""
    return {k: v - lr * grad[k] if k in grad else v for k, v in params.items()}


def projected_step(w: torch.Tensor, grad: torch.Tensor, lr: float, *, scale: Optional[torch.Tensor] = None,
                   lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    """One gradient step on weights kept in a box: ``clamp(w - lr * grad [* scale], lo, hi)``
    (a new tensor). Co-Boosting's ensemble weights take it with ``grad = sign(dL/dw)``;
    FedALA's aggregation weights with ``scale`` the difference of the local and global
    parameters."""
    step = lr * grad if scale is None else lr * grad * scale
    return torch.clamp(w - step, lo, hi)


__all__ = ["descend", "fit_mixture_weights", "masked_sgd_train", "projected_step", "sgd_update"]
