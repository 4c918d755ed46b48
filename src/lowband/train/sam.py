"""Sharpness-aware minimisation: local epochs of (adaptive) SAM with an SGD base optimiser
(DFedSAM's local update; Foret et al. 2021, Kwon et al. 2021 for the adaptive radius)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lowband.train.params import Params, get_params, load_params
from lowband.train.sgd import TrainStats, batches


def sam_train(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
              batch_size: int, lr: float, gen: torch.Generator, rho: float, adaptive: bool = True,
              momentum: float = 0.0, weight_decay: float = 0.0,
              grad_clip: Optional[float] = None) -> tuple[Params, TrainStats]:
    """Epochs of (adaptive) SAM with an SGD base optimiser; ``rho = 0`` is plain SGD."""
    load_params(model, params)
    model.train()
    n = int(y.shape[0])
    if n == 0 or epochs == 0:
        return get_params(model), TrainStats(loss=float("nan"), steps=0, samples=0)
    ps = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(ps, lr=lr, momentum=momentum, weight_decay=weight_decay)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    steps = seen = 0
    for _ in range(epochs):
        for idx in batches(n, batch_size, gen):
            xb, yb = x[idx], y[idx]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            eps: list[Optional[torch.Tensor]] = []
            with torch.no_grad():
                norms = [((p.abs() if adaptive else 1.0) * p.grad).norm(2) for p in ps if p.grad is not None]
                scale = rho / (torch.norm(torch.stack(norms), 2) + 1e-12) if norms else 0.0
                for p in ps:
                    if p.grad is None:
                        eps.append(None)
                        continue
                    e = (p.pow(2) if adaptive else 1.0) * p.grad * scale
                    p.add_(e)
                    eps.append(e)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            with torch.no_grad():
                for p, e in zip(ps, eps):
                    if e is not None:
                        p.sub_(e)
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(ps, grad_clip)
            opt.step()
            total += loss.detach().double() * idx.numel()
            seen += idx.numel()
            steps += 1
    return get_params(model), TrainStats(loss=float(total) / max(seen, 1), steps=steps, samples=seen)
