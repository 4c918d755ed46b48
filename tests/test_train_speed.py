"""Cheaper local training, same numbers (issue 18, FedAvg FMNIST): ``sgd_train``'s
per-step bookkeeping (one gather per epoch, a fused plain-SGD update, the loss summed
once). Each test also checks that the fast path is the one that ran.

(A strided-slice max-pool with max_pool2d's indices for training was tried and measured:
no faster than the native kernel within a whole step on a quiet machine, so not kept.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lowband.train import sgd as train
from lowband.models import build_model
from lowband.train import batches, epoch_batches, get_params, load_params, sgd_train


def _old_sgd_train(model: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
                   batch_size: int, lr: float, gen: torch.Generator, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> tuple[dict, float, int]:
    """sgd_train as it was before (torch.optim.SGD, two gathers a step, a running float64
    loss): the reference."""
    load_params(model, params)
    model.train()
    opt = torch.optim.SGD(list(model.parameters()), lr=lr, momentum=momentum, weight_decay=weight_decay)
    total = torch.zeros((), dtype=torch.float64)
    seen = 0
    for _ in range(epochs):
        for idx in batches(int(y.shape[0]), batch_size, gen):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double() * idx.numel()
            seen += idx.numel()
    return get_params(model), float(total) / seen, seen


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 1e-4)])
def test_sgd_train_equals_the_old_loop_on_the_fmnist_cnn(monkeypatch: pytest.MonkeyPatch, momentum: float,
                                                         weight_decay: float) -> None:
    """The new loop (fused update, per-epoch gather) gives the old loop's
    parameters and loss bit for bit, on the FedAvg FMNIST CNN with dropout (an odd last
    batch included)."""
    torch.manual_seed(0)
    model = build_model("cnn_fmnist", num_classes=10, input_shape=(1, 28, 28))
    p0 = get_params(model)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(53, 1, 28, 28, generator=g), torch.randint(0, 10, (53,), generator=g)
    torch.manual_seed(7)  # dropout masks: the same draws in both runs
    new, stats = sgd_train(model, p0, x, y, epochs=2, batch_size=16, lr=0.05, gen=torch.Generator().manual_seed(5),
                           momentum=momentum, weight_decay=weight_decay)
    torch.manual_seed(7)
    old, loss, seen = _old_sgd_train(model, p0, x, y, epochs=2, batch_size=16, lr=0.05,
                                     gen=torch.Generator().manual_seed(5), momentum=momentum,
                                     weight_decay=weight_decay)
    assert stats.samples == seen == 106 and stats.steps == 8
    assert stats.loss == loss and math.isfinite(loss)
    for k in old:
        assert torch.equal(new[k], old[k]), k
    assert any(not torch.equal(new[k], p0[k]) for k in p0)


def test_plain_sgd_skips_the_optimiser_and_momentum_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    orig = torch.optim.SGD.step
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    model = nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    sgd_train(model, get_params(model), x, y, epochs=1, batch_size=4, lr=0.1, gen=torch.Generator().manual_seed(0))
    assert calls == []  # the fused update ran
    sgd_train(model, get_params(model), x, y, epochs=1, batch_size=4, lr=0.1, momentum=0.5,
              gen=torch.Generator().manual_seed(0))
    assert calls == [1, 1]


@pytest.mark.parametrize("n,bs,drop_last", [(53, 16, False), (53, 16, True), (10, 16, True), (0, 4, False)])
def test_epoch_batches_equal_indexed_batches(monkeypatch: pytest.MonkeyPatch, n: int, bs: int,
                                             drop_last: bool) -> None:
    x, y = torch.randn(n, 3), torch.arange(n)
    ref = [(x[i], y[i]) for i in batches(n, bs, torch.Generator().manual_seed(2), drop_last=drop_last)]
    for cap in (train.EPOCH_GATHER_BYTES, 0):  # one gather per epoch, and per batch above the cap
        monkeypatch.setattr(train, "EPOCH_GATHER_BYTES", cap)
        got = list(epoch_batches(x, y, bs, torch.Generator().manual_seed(2), drop_last=drop_last))
        assert len(got) == len(ref)
        for (a, b), (c, d) in zip(got, ref):
            assert torch.equal(a, c) and torch.equal(b, d)
