"""Local SGD on in-memory tensors: minibatches, the loss hook, :func:`sgd_train`.

Data lives in memory; a batch is an index slice of a seeded permutation (no DataLoader in
the inner loop). One module per worker is loaded with each node's parameters in turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lowband.train.params import Params, get_params, load_params

_DIVERGED = [0]  # local trainings in this process whose loss ended non-finite (see diverged_count)


def note_divergence() -> None:
    """Record that a local training diverged to a non-finite loss. :func:`sgd_train` calls
    it; a custom training loop may too. The executor reads :func:`diverged_count` around
    each node's step and reports the node in the round's ``faults/diverged`` count (its
    non-finite update is then rejected by the receivers, see lowband.comm.validate)."""
    _DIVERGED[0] += 1


def diverged_count() -> int:
    """How many local trainings diverged in this process so far (a counter, never reset)."""
    return _DIVERGED[0]


#: loss hook: (model, inputs, targets) -> scalar loss. Default: cross-entropy.
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def batches(n: int, batch_size: int, gen: torch.Generator, drop_last: bool = False,
            device: Optional[torch.device] = None) -> Iterator[torch.Tensor]:
    """Index batches of a seeded permutation of ``range(n)``, drawn on the CPU generator
    (the same batches on every device) and moved to ``device`` (that of the data) if given."""
    perm = torch.randperm(n, generator=gen)
    if device is not None and perm.device != torch.device(device):
        perm = perm.to(device)
    stop = n - (n % batch_size) if drop_last and n >= batch_size else n
    for i in range(0, stop, batch_size):
        yield perm[i : i + batch_size]


#: :func:`epoch_batches` gathers a whole epoch's permuted data at once up to this many bytes
EPOCH_GATHER_BYTES = 64 * 2**20


def epoch_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, gen: torch.Generator,
                  drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The minibatches ``(x[idx], y[idx])`` of :func:`batches` (the same permutation from
    ``gen``, the same values): the epoch's rows are gathered in one indexing call and the
    batches are slices of it (one gather per epoch instead of two per step), unless the
    data exceeds :data:`EPOCH_GATHER_BYTES` (then per batch, no second copy of the data)."""
    n = int(y.shape[0])
    if x.element_size() * x.nelement() + y.element_size() * y.nelement() > EPOCH_GATHER_BYTES:
        for idx in batches(n, batch_size, gen, drop_last=drop_last, device=x.device):
            yield x[idx], y[idx]
        return
    perm = torch.randperm(n, generator=gen)
    if perm.device != x.device:
        perm = perm.to(x.device)
    xp, yp = x[perm], y[perm]
    stop = n - (n % batch_size) if drop_last and n >= batch_size else n
    for i in range(0, stop, batch_size):
        yield xp[i : i + batch_size], yp[i : i + batch_size]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


@dataclass
class TrainStats:
    loss: float
    steps: int
    samples: int


def sgd_train(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    gen: torch.Generator,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    loss_fn: LossFn = cross_entropy,
    grad_clip: Optional[float] = None,
    max_steps: Optional[int] = None,
    drop_last: bool = False,
    skip_singleton_bn: bool = False,
    trainable: Optional[Sequence[str]] = None,
    extra: Iterable[torch.Tensor] = (),
    grad_hook: Optional[Callable[[nn.Module], None]] = None,
) -> tuple[Params, TrainStats]:
    """Epochs of minibatch SGD from ``params`` on ``(x, y)``; returns new params and stats.

    A fresh optimiser is created on every call (the NTK-DFL and PFLlib reference codes
    reset momentum each round). ``skip_singleton_bn`` skips batches of one sample when the
    model has BatchNorm (KTA's "BN-safe skip rule"). For the personalised baselines:
    ``trainable`` names the parameters to train (the others are frozen for the call),
    ``extra`` tensors with ``requires_grad`` are optimised by the same SGD (FedDBE's
    personal bias), and ``grad_hook(model)`` runs after ``backward`` (FedSPU's masks).
    """
    load_params(model, params)
    model.train()
    named = dict(model.named_parameters())
    train_names = list(named) if trainable is None else list(trainable)
    frozen = [k for k in named if k not in set(train_names)]
    n = int(y.shape[0])
    if n == 0 or epochs == 0:
        return get_params(model), TrainStats(loss=float("nan"), steps=0, samples=0)
    opt_params = [named[k] for k in train_names] + list(extra)
    opt = torch.optim.SGD(opt_params, lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0,
                          weight_decay=weight_decay)  # plain SGD steps below without it (same update)
    has_bn = skip_singleton_bn and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    # plain SGD (no momentum, no weight decay): one fused ``p -= lr * grad`` over the tensors,
    # what torch.optim.SGD computes per tensor, the same bits, without its per-step overhead
    plain = momentum == 0 and weight_decay == 0
    losses: list[torch.Tensor] = []  # per step, summed once at the end (as the running sum would)
    counts: list[int] = []
    steps = 0
    for k in frozen:
        named[k].requires_grad_(False)
    try:
        for _ in range(epochs):
            for xb, yb in epoch_batches(x, y, batch_size, gen, drop_last=drop_last):
                nb = int(yb.shape[0])
                if has_bn and nb <= 1:
                    continue
                if plain:
                    for p in opt_params:
                        p.grad = None
                else:
                    opt.zero_grad(set_to_none=True)
                loss = loss_fn(model, xb, yb)
                loss.backward()
                if grad_hook is not None:
                    grad_hook(model)
                if grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(opt_params, grad_clip)
                if plain:
                    with torch.no_grad():
                        have = [p for p in opt_params if p.grad is not None]
                        if have:
                            torch._foreach_add_(have, [p.grad for p in have], alpha=-lr)
                else:
                    opt.step()
                losses.append(loss.detach())
                counts.append(nb)
                steps += 1
                if max_steps is not None and steps >= max_steps:
                    break
            if max_steps is not None and steps >= max_steps:
                break
    finally:
        for k in frozen:
            named[k].requires_grad_(True)
    total, seen = 0.0, 0
    # the float64 running sum of loss x batch size, in step order: the same bits as summing per step
    for value, nb in zip(torch.stack(losses).double().tolist() if losses else [], counts):
        total += value * nb
        seen += nb
    mean_loss = float(total) / max(seen, 1)
    if seen and not math.isfinite(mean_loss):
        note_divergence()
    return get_params(model), TrainStats(loss=mean_loss, steps=steps, samples=seen)
