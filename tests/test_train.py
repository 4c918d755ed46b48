"""sgd_train's options for the personalised baselines: trainable subsets, extra tensors,
gradient hooks (what _pfl.sgd_loop forwards)."""

from __future__ import annotations

import torch
from torch import nn

from lowband.train import get_params, sgd_train


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    return model, get_params(model), x, y


def test_trainable_subset_freezes_the_rest_and_restores_grad_flags() -> None:
    model, p0, x, y = _setup()
    new, stats = sgd_train(model, p0, x, y, epochs=1, batch_size=8, lr=0.1, gen=torch.Generator().manual_seed(0),
                           trainable=["2.weight", "2.bias"])
    assert stats.steps == 4
    assert torch.equal(new["0.weight"], p0["0.weight"]) and torch.equal(new["0.bias"], p0["0.bias"])
    assert not torch.equal(new["2.weight"], p0["2.weight"])
    assert all(p.requires_grad for p in model.parameters())


def test_extra_tensors_are_optimised_and_the_hook_sees_every_step() -> None:
    model, p0, x, y = _setup()
    bias = torch.zeros(3, requires_grad=True)
    calls = []

    def loss_fn(m: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(m(xb) + bias, yb)

    def hook(m: nn.Module) -> None:
        calls.append(1)
        m[0].weight.grad.zero_()  # e.g. a mask: this layer then never moves

    new, stats = sgd_train(model, p0, x, y, epochs=2, batch_size=16, lr=0.1, gen=torch.Generator().manual_seed(0),
                           loss_fn=loss_fn, extra=[bias], grad_hook=hook)
    assert len(calls) == stats.steps == 4
    assert bias.abs().sum() > 0
    assert torch.equal(new["0.weight"], p0["0.weight"])
    assert not torch.equal(new["2.weight"], p0["2.weight"])
