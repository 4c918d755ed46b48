"""Cheaper local training, same numbers (issue 18, FedAvg FMNIST): the CNNs' training
max-pooling (:class:`lowband.models.cnn._MaxPool2`), and ``sgd_train``'s per-step
bookkeeping (one gather per epoch, a fused plain-SGD update, the loss summed once).
Each test also checks that the fast path is the one that ran."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lowband import train
from lowband.models import build_model, cnn
from lowband.train import batches, epoch_batches, get_params, load_params, sgd_train


class _Ops(TorchDispatchMode):
    """Records the aten ops dispatched inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _inputs(shape: tuple[int, ...], kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if kind == "ties":
        x = x.round()
    elif kind == "zeros":  # +0.0 and -0.0 tied in every window
        x = x * 0.0
    elif kind == "dropout2d":  # whole channels of signed zeros, as conv2_drop makes them
        x = x * (torch.rand(shape[0], shape[1], 1, 1, generator=g) < 0.5)
    elif kind == "nan":
        x = x.round()
        x.view(-1)[::5] = float("nan")
    elif kind == "-inf":
        x = x.round()
        x.view(-1)[::3] = -float("inf")
    return x


@pytest.mark.parametrize("shape", [(16, 10, 24, 24), (16, 20, 8, 8), (2, 3, 7, 9), (1, 1, 2, 2)])
@pytest.mark.parametrize("kind", ["randn", "ties", "zeros", "dropout2d", "nan", "-inf"])
def test_training_pool2_is_max_pool2d_bit_for_bit(shape: tuple[int, ...], kind: str) -> None:
    """Values (sign of zero included), indices and input gradients equal max_pool2d's."""
    x = _inputs(shape, kind, seed=sum(shape))
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    fast = cnn.pool2(a)
    assert type(fast.grad_fn).__name__.startswith("_MaxPool2")  # the fast path, not MaxPool2DWithIndices
    ref, ref_idx = F.max_pool2d(b, 2, return_indices=True)
    assert torch.equal(cnn._window_argmax(x)[1], ref_idx)
    assert torch.equal(fast.nan_to_num(7.0), ref.nan_to_num(7.0))
    assert torch.equal(torch.signbit(fast), torch.signbit(ref))
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    fast.backward(g)
    ref.backward(g)
    assert torch.equal(a.grad, b.grad)


def test_training_pool2_skips_the_native_forward_kernel() -> None:
    """The fast path really runs: no max_pool2d_with_indices in the forward pass of a
    finite input (its backward is the native one, on our indices)."""
    x = torch.randn(4, 3, 12, 12, requires_grad=True)
    with _Ops() as rec:
        y = cnn.pool2(x)
    assert not any("max_pool2d" in op for op in rec.ops), rec.ops
    with _Ops() as rec:
        y.sum().backward()
    assert any("max_pool2d_with_indices_backward" in op for op in rec.ops)


def test_pool2_uses_max_pool2d_under_fx_and_torch_func() -> None:
    """FOL's pruning traces the CNNs with torch.fx (it must see F.max_pool2d); torch.func
    transforms get the native op too."""
    model = build_model("fol_cnn", num_classes=10, input_shape=(3, 32, 32))
    gm = torch.fx.symbolic_trace(model)
    assert any(n.target is F.max_pool2d for n in gm.graph.nodes)
    x = torch.randn(3, 2, 6, 6)
    grads = torch.func.vmap(torch.func.grad(lambda t: cnn.pool2(t.unsqueeze(0)).sum()))(x)
    ref = torch.func.vmap(torch.func.grad(lambda t: F.max_pool2d(t.unsqueeze(0), 2).sum()))(x)
    assert torch.equal(grads, ref)


def _old_sgd_train(model: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
                   batch_size: int, lr: float, gen: torch.Generator, momentum: float = 0.0,
                   weight_decay: float = 0.0, pool: bool = False) -> tuple[dict, float, int]:
    """sgd_train as it was before (torch.optim.SGD, two gathers a step, a running float64
    loss), with the native max_pool2d when ``pool``: the reference."""
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
    """The new loop (fused update, per-epoch gather, fast pooling) gives the old loop's
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
    with monkeypatch.context() as m:
        m.setattr(cnn, "pool2", lambda t: F.max_pool2d(t, 2))  # the native op
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
