"""The cohort step of the FedCSPACK FMNIST CNN (``cnn_fmnist``): many nodes' local SGD at once.

The per-node step of this small CNN at batch 16 is bound by per-operation overhead and by
small single-node kernels (benchmarks/README.md: ~2.6 ms a step on one core, ~20x its
FLOPs). Here the nodes of a cohort train together: both convolutions as one *grouped*
convolution over the nodes (node ``k``'s batch in input channel ``k``, its filters in group
``k``), in channels-last layout (oneDNN's fast path for these shapes, also for the 2x2 max
pool), the fully connected layers as batched products (``baddbmm``), one autograd pass for
the sum of the nodes' losses (each node's parameters reach only its own loss). Measured
1.2 ms a node-step at 5 nodes against 2.6 ms per node (one core; benchmarks/README.md).

**The same training as the per-node path** (:func:`lowband.train.sgd_train`), within float
tolerance (tests/test_cohort.py): each node's minibatches from its own generator (the
caller's schedule), its loss the mean over its real samples, a node whose schedule has
ended frozen. **Dropout**: the per-node path draws the masks of ``Dropout2d`` then
``Dropout`` from the global RNG, seeded per node and step by the executor; here each node
draws the same masks, in the same order and shapes, from a generator holding the state the
global RNG would have had (the caller's ``rngs``), so the masks are the per-node path's bit
for bit, and the generator ends where the global RNG would (the caller restores it).

**A node's result does not depend on its cohort** (bit for bit, tested at one and at two
threads): on one thread (the caller, :func:`lowband.train.cohort.train_cohort`, pins it:
with more, oneDNN splits the work among threads by the number of groups, which changes how
a node's sums are added) oneDNN's grouped convolution computes each group alike for any
number of groups >= 2 (one group takes another kernel), so a lone node is trained beside a
zero dummy.

Only on a CPU (elsewhere dropout draws from the device's generator, which this cannot
reproduce) and only for exactly :class:`~lowband.models.cnn.FedCSPackFMNISTCNN`.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["is_cohort_cnn", "train_cnn"]

#: the parameter names of the CNN, in the model's order
_NAMES = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias",
          "fc2.weight", "fc2.bias", "head.weight", "head.bias")


def is_cohort_cnn(model: nn.Module) -> bool:
    """Whether ``model`` is exactly the FMNIST CNN (not a subclass: its ``forward`` may
    differ) with the layers and dropout rates this step writes out."""
    from lowband.models.cnn import FedCSPackFMNISTCNN

    if type(model) is not FedCSPackFMNISTCNN:
        return False
    names = [k for k, _ in model.named_parameters()]
    return (tuple(names) == _NAMES and not any(True for _ in model.buffers())
            and model.conv2_drop.p == 0.5 and model.drop.p == 0.5
            and model.conv1.kernel_size == (5, 5) and model.conv2.kernel_size == (5, 5)
            and all(m.stride == (1, 1) and m.padding == (0, 0) and m.dilation == (1, 1) and m.groups == 1
                    for m in (model.conv1, model.conv2)))


def _conv_leaf(stack: torch.Tensor) -> torch.Tensor:
    """``(G, O, C, k, k)`` filters stored so that ``flatten(0, 1)`` is a channels-last
    ``(G*O, C, k, k)`` view (the grouped convolution's weight, no copy per step)."""
    g, o, c, kh, kw = stack.shape
    leaf = torch.empty_strided((g, o, c, kh, kw), (o * kh * kw * c, kh * kw * c, 1, kw * c, c),
                               dtype=stack.dtype, device=stack.device)
    leaf.copy_(stack)
    return leaf


#: the weights kept transposed (:func:`_fc_leaf`) at batch >= 2: the two large ones, where
#: the products' bits were measured unchanged by the layout (batch 2-100, 2-10 nodes); the
#: head's ``(10, 50)`` forward product, and every product at batch 1 (a matrix-vector
#: kernel), round differently with it, so they stay row-major
_TRANSPOSED = ("fc1.weight", "fc2.weight")


def _fc_leaf(stack: torch.Tensor) -> torch.Tensor:
    """``(G, O, I)`` weights stored transposed (``transpose(1, 2)`` is a contiguous
    ``(G, I, O)``): the layout in which ``baddbmm``'s backward returns their gradient, so
    the SGD update adds two tensors of one layout (a row-major ``fc1`` weight took a
    strided add of its transposed gradient: 0.71 ms a step of 10 nodes against 0.11 ms for
    all ten tensors in matching layouts; the same values either way)."""
    g, o, i = stack.shape
    leaf = torch.empty_strided((g, o, i), (o * i, 1, o), dtype=stack.dtype, device=stack.device)
    leaf.copy_(stack)
    return leaf


def _leaf(name: str, stack: torch.Tensor, batch: int) -> torch.Tensor:
    """The trained tensor for one stacked parameter: filters (and, see
    :data:`_TRANSPOSED`, the large weights) in the layouts their kernels return their
    gradients in, the rest as they are."""
    if stack.dim() == 5:
        return _conv_leaf(stack)
    if name in _TRANSPOSED and batch >= 2:
        return _fc_leaf(stack)
    return stack.clone()


def train_cnn(params: dict[str, torch.Tensor], names: Sequence[str], xcat: torch.Tensor, ycat: torch.Tensor,
              index: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor, denom: torch.Tensor,
              rngs: Sequence[Optional[torch.Generator]], update: Callable[..., None],
              read_ends: Callable[[int], None], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """The cohort's steps (see the module docstring). ``params``: stacked ``(G, ...)``
    parameters by name, the nodes in decreasing order of their step counts (so the nodes
    still training at step ``t`` are a prefix, the only ones computed: at least two, see
    the module docstring); ``index`` / ``mask`` ``(T, G, B)``: each step's rows of
    ``xcat`` / ``ycat`` and which are real; ``counts`` ``(T, G)``: real rows; ``rngs``: each
    node's dropout generator (None: a padding node, no masks drawn). Fills ``leaves`` (the
    tensors ``update(grads, t, k)`` and ``read_ends`` step and read, in ``names`` order,
    each indexed by node first) and returns each step's per-node losses."""
    G, B = int(index.shape[1]), int(index.shape[2])
    leaf = {k: _leaf(k, params[k], B).requires_grad_() for k in names}
    leaves[:] = [leaf[k] for k in names]
    c_in, h, w = int(xcat.shape[1]), int(xcat.shape[2]), int(xcat.shape[3])
    c2, f1 = int(params["conv2.weight"].shape[1]), int(params["fc1.weight"].shape[1])  # the dropout widths
    wts = mask / denom.unsqueeze(-1)  # (T, G, B): each sample's weight in its node's loss
    active = (counts > 0).sum(1).clamp(min=min(2, G)).tolist()  # (T,): the prefix trained at each step
    values: list[torch.Tensor] = []
    for t in range(index.shape[0]):
        k = int(active[t])
        p = {n: leaf[n][:k] for n in names}  # views: the gradients are the prefix's
        m2 = torch.zeros((k, B, c2), dtype=xcat.dtype)
        m1 = torch.zeros((k, B, f1), dtype=xcat.dtype)
        for c in range(k):  # the per-node path's masks: Dropout2d's, then Dropout's
            nb, gen = int(counts[t, c]), rngs[c]
            if nb and gen is not None:
                m2[c, :nb] = torch.empty((nb, c2, 1, 1), dtype=xcat.dtype).bernoulli_(0.5, generator=gen) \
                    .div_(0.5).view(nb, c2)
                m1[c, :nb] = torch.empty((nb, f1), dtype=xcat.dtype).bernoulli_(0.5, generator=gen).div_(0.5)
        # node c's sample b in input channel block c: (B, k*C, H, W), channels last
        it = index[t, :k]
        x = xcat.index_select(0, it.t().reshape(-1)).view(B, k * c_in, h, w)
        x = x.contiguous(memory_format=torch.channels_last)
        z = F.conv2d(x, p["conv1.weight"].flatten(0, 1), p["conv1.bias"].flatten(), groups=k)
        z = F.relu(F.max_pool2d(z, 2))
        z = F.conv2d(z, p["conv2.weight"].flatten(0, 1), p["conv2.bias"].flatten(), groups=k)
        z = z * m2.transpose(0, 1).reshape(B, k * c2, 1, 1)
        z = F.relu(F.max_pool2d(z, 2))  # (B, k*20, 4, 4)
        z = z.reshape(B, k, -1).transpose(0, 1)  # (k, B, 320): each node's flatten(1)
        z = torch.baddbmm(p["fc1.bias"].unsqueeze(1), z, p["fc1.weight"].transpose(1, 2))
        z = F.relu(z) * m1
        z = torch.baddbmm(p["fc2.bias"].unsqueeze(1), z, p["fc2.weight"].transpose(1, 2))
        z = torch.baddbmm(p["head.bias"].unsqueeze(1), z, p["head.weight"].transpose(1, 2))
        yb = ycat.index_select(0, it.reshape(-1))
        ce = F.cross_entropy(z.reshape(k * B, -1), yb, reduction="none").view(k, B)
        per_node = (ce * wts[t, :k]).sum(1)
        grads = torch.autograd.grad(per_node.sum(), [p[n] for n in names])
        loss = torch.zeros(G, dtype=per_node.dtype)
        loss[:k] = per_node.detach()
        values.append(loss)
        update(list(grads), t, k)
        read_ends(t)
    return values
