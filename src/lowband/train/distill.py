"""Training on targets other than the node's labels: distillation to soft targets on a
public reference set (KTA), and Adam epochs to any target with a loss hook (FedMD's
transfer, digest and revisit)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lowband.train.evaluate import evaluate
from lowband.train.params import Params, get_params, load_params
from lowband.train.sgd import TrainStats, batches


def has_bn(model: nn.Module) -> bool:
    """Whether ``model`` has BatchNorm (then a batch of one sample is skipped: the BN-safe rule)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def distill(model: nn.Module, params: Params, ref_x: torch.Tensor, q: torch.Tensor,
            priv_x: torch.Tensor, priv_y: torch.Tensor, *, epochs: int, batch_size: int, lr: float,
            momentum: float, weight_decay: float, temperature: float, lam: float, gen: torch.Generator,
            bn_skip: bool = True, grad_clip: Optional[float] = None) -> tuple[Params, TrainStats]:
    """Stage 2: ``epochs`` passes over D_ref, each step on one D_ref batch (KL to ``q`` at
    temperature T, scaled by T^2 and lambda) plus one private batch (CE, 1 - lambda)."""
    load_params(model, params)
    model.train()
    nref, npriv = int(ref_x.shape[0]), int(priv_y.shape[0])
    if nref == 0 or epochs == 0:
        return get_params(model), TrainStats(float("nan"), 0, 0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    skip = bn_skip and has_bn(model)
    use_priv = lam < 1 and npriv > 0
    priv_iter = iter(())
    total = torch.zeros((), dtype=torch.float64, device=ref_x.device)
    steps = seen = 0
    t2 = temperature * temperature
    for _ in range(epochs):
        for idx in batches(nref, batch_size, gen):
            pidx = None
            if use_priv:
                pidx = next(priv_iter, None)
                if pidx is None:
                    priv_iter = iter(batches(npriv, batch_size, gen))
                    pidx = next(priv_iter)
            if skip and (idx.numel() <= 1 or (pidx is not None and pidx.numel() <= 1)):
                continue
            opt.zero_grad(set_to_none=True)
            xr = ref_x[idx]
            if pidx is not None:
                out = model(torch.cat([xr, priv_x[pidx]]))
                out_r, out_p = out[: idx.numel()], out[idx.numel():]
            else:
                out_r, out_p = model(xr), None
            kl = F.kl_div(F.log_softmax(out_r / temperature, dim=1), q[idx], reduction="batchmean")
            loss = lam * t2 * kl
            if out_p is not None:
                loss = loss + (1 - lam) * F.cross_entropy(out_p, priv_y[pidx])
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            total += loss.detach().double() * idx.numel()
            seen += idx.numel()
            steps += 1
    return get_params(model), TrainStats(float(total) / max(seen, 1), steps, seen)


def adam_fit(model: nn.Module, params: Params, x: torch.Tensor, target: torch.Tensor, loss_fn, *, epochs: int,
             batch_size: int, lr: float, gen: torch.Generator, bn_skip: bool = True,
             val: Optional[tuple[torch.Tensor, torch.Tensor]] = None, patience: int = 0,
             min_delta: float = 0.0) -> tuple[Params, TrainStats]:
    """Epochs of Adam from ``params``; with ``val`` (x, y) and ``patience``, Keras-style
    early stopping on the validation accuracy (the last weights are kept)."""
    load_params(model, params)
    n = int(target.shape[0])
    if n == 0 or epochs == 0:
        return get_params(model), TrainStats(float("nan"), 0, 0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    skip = bn_skip and has_bn(model)
    best, wait = -float("inf"), 0
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    steps = seen = 0
    for _ in range(epochs):
        model.train()
        for idx in batches(n, batch_size, gen):
            if skip and idx.numel() <= 1:
                continue
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, x[idx], target[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double() * idx.numel()
            seen += idx.numel()
            steps += 1
        if val is not None and patience > 0 and int(val[1].numel()) > 0:
            acc = evaluate(model, None, val[0], val[1])[0]
            if acc > best + min_delta:
                best, wait = acc, 0
            else:
                wait += 1
                if wait >= patience:
                    break
    return get_params(model), TrainStats(float(total) / max(seen, 1), steps, seen)
