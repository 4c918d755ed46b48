"""SGD epochs with early stopping on a validation split (FOL's pre-training, fine-tuning
and distillation): the parameters of the best validation epoch are kept."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from lowband.train.evaluate import predict_logits
from lowband.train.params import Params, get_params
from lowband.train.sgd import batches

#: loss hook with the batch's row indices: (net, inputs, targets, indices) -> scalar loss
IndexedLossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def index_ce(net: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Cross-entropy (the indices unused)."""
    return F.cross_entropy(net(x), y)


@torch.no_grad()
def val_score(net: nn.Module, x: torch.Tensor, y: torch.Tensor, bs: int = 2000) -> tuple[float, float]:
    """(accuracy, -loss) of the loaded ``net`` on (x, y); a larger tuple is better."""
    if int(y.numel()) == 0:
        return (0.0, 0.0)
    logits = predict_logits(net, None, x, bs)
    return (float((logits.argmax(1) == y).float().mean()), -float(F.cross_entropy(logits, y)))


def fit(net: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, vx: torch.Tensor, vy: torch.Tensor, *,
        epochs: int, patience: int, lr: float, momentum: float, weight_decay: float, batch_size: int,
        gen: torch.Generator, loss_fn: IndexedLossFn = index_ce) -> tuple[Params, dict[str, float]]:
    """SGD epochs from ``params`` with early stopping on the validation split: returns the
    parameters of the epoch with the best validation (accuracy, -loss) (epochs >= 1), and
    stops after ``patience`` epochs without improvement. Without validation data, the last
    epoch. One optimiser for the whole fit (momentum carries over epochs). ``net`` is
    moved to the data's device first (a model rebuilt from a received descriptor is made
    on the CPU)."""
    net.to(x.device).load_state_dict(params)
    n = int(y.shape[0])
    if epochs <= 0 or n == 0:
        return {k: v.detach().clone() for k, v in params.items()}, {"epochs": 0.0, "val_acc": float("nan")}
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    best: Optional[Params] = None
    best_score = (-1.0, -float("inf"))
    bad, done = 0, 0
    for _ in range(epochs):
        net.train()
        for idx in batches(n, batch_size, gen):
            if has_bn and idx.numel() <= 1:
                continue
            opt.zero_grad(set_to_none=True)
            loss_fn(net, x[idx], y[idx], idx).backward()
            opt.step()
        done += 1
        if int(vy.numel()) == 0:
            continue
        score = val_score(net, vx, vy)
        if score > best_score:
            best, best_score, bad = get_params(net), score, 0
        else:
            bad += 1
            if bad >= patience:
                break
    if best is None:
        best = get_params(net)
    return best, {"epochs": float(done), "val_acc": best_score[0]}
