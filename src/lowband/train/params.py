"""Parameters as plain dicts (``state_dict`` layout, buffers included): load, read, copy,
average and combine them. One module per worker is loaded with each node's parameters in
turn, so algorithms pass these dicts around rather than modules."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from lowband.heap import heap_clone, heap_zeros_like

Params = dict[str, torch.Tensor]


def get_params(model: nn.Module) -> Params:
    """Detached copies of the module's state (parameters and buffers), in reusable heap
    memory (:mod:`lowband.heap`: a node's state outlives its step)."""
    return {k: heap_clone(v) for k, v in model.state_dict().items()}


def load_params(model: nn.Module, params: Params) -> nn.Module:
    """Load ``params`` into ``model`` (strict) and return it."""
    model.load_state_dict(params, strict=True)
    return model


def clone_params(params: Params) -> Params:
    """Detached copies (in reusable heap memory, :mod:`lowband.heap`)."""
    return {k: heap_clone(v) for k, v in params.items()}


def is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point()


def weighted_average(items: list[Params], weights: Optional[list[float]] = None) -> Params:
    """Weighted average of parameter dicts (weights normalised). Integer buffers such as
    BatchNorm's ``num_batches_tracked`` are not averaged: the maximum is kept."""
    if not items:
        raise ValueError("weighted_average: no parameter sets to average")
    w = torch.tensor(weights if weights is not None else [1.0] * len(items), dtype=torch.float64)
    if (w < 0).any() or float(w.sum()) <= 0:
        raise ValueError("weighted_average: weights must be >= 0 with a positive sum")
    w = (w / w.sum()).tolist()
    out: Params = {}
    for k, v0 in items[0].items():
        if is_float(v0):
            acc = heap_zeros_like(v0, torch.float32)  # the new state's memory (lowband.heap)
            for wi, p in zip(w, items):
                acc.add_(p[k].to(torch.float32), alpha=wi)
            out[k] = acc.to(v0.dtype)
        else:
            out[k] = torch.stack([p[k] for p in items]).max(dim=0).values.clone()
    return out


def add_scaled(a: Params, b: Params, alpha: float = 1.0) -> Params:
    """``a + alpha * b`` on floating tensors; other tensors are taken from ``a``."""
    return {k: (v + alpha * b[k]) if is_float(v) else v.clone() for k, v in a.items()}


def sub(a: Params, b: Params) -> Params:
    """``a - b`` on floating tensors (non-float tensors are taken from ``a``)."""
    return {k: (v - b[k]) if is_float(v) else v.clone() for k, v in a.items()}


def flatten(params: Params, names: Optional[list[str]] = None) -> torch.Tensor:
    """Concatenate the floating tensors (or ``names``) into one vector."""
    keys = names if names is not None else [k for k, v in params.items() if is_float(v)]
    return torch.cat([params[k].reshape(-1).to(torch.float32) for k in keys])
