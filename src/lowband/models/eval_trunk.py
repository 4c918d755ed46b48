"""Evaluation of a two-convolution trunk in oneDNN's own tensor layout, the same bits.

The FMNIST CNN's trunk (conv 5x5 -> maxpool 2 -> ReLU, twice) spends most of an
evaluation pass in layout conversions: PyTorch's dense NCHW convolution hands oneDNN a
plain tensor, oneDNN reorders it to its blocked layout, convolves, and reorders back, and
the max-pooling then runs on the plain tensor. Kept in oneDNN's layout (``Tensor.to_mkldnn``)
from the input to the trunk's output, the same convolution primitive runs without the
round trips and the pooling and ReLU are oneDNN's: 1.3-1.4x faster for the whole trunk on
one core (benchmarks/README.md, "Evaluation against its FLOP floor").

Two conditions keep the result bit for bit equal to the dense path, and each is checked,
not assumed:

- oneDNN's max-pooling does not propagate NaN (a window holding a NaN and a 5 gives 5;
  ``F.max_pool2d`` and :func:`lowband.models.cnn.pool2` give NaN). No NaN or infinity can
  arise in the trunk when the inputs and weights are finite and a bound on every
  convolution output (sum of ``|w|`` times the largest ``|input|``, plus ``|bias|``) stays
  far below float32's range: :func:`trunk_bound` checks that per call, and the dense
  path runs otherwise (a diverged model, non-finite data).
- The blocked and the plain convolution must take the same kernel. They do on the
  machines this was measured on, but oneDNN picks kernels per ISA and shape, so the
  first call per (shapes, threads) compares the two paths on a probe batch and the
  oneDNN layout is used only where they agree to the bit (:func:`layout_agrees`).

Only in evaluation: no autograd, eval mode (no dropout), float32 on the CPU.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

#: rows per oneDNN pass: a sample's trunk output does not depend on its batch companions,
#: so the chunking is free; 128 rows keep the activations of a pass in the core's cache
TRUNK_ROWS = 128
#: the largest bound on a convolution output for which the oneDNN layout is used (float32
#: overflows at 3.4e38; any value under this cannot become inf, hence no NaN from inf - inf)
SAFE_BOUND = 1e30

_agree: dict[tuple, bool] = {}


def _dispatch_mode_active() -> bool:
    """Whether a ``TorchDispatchMode`` (e.g. ``FlopCounterMode``) watches the ops: it then
    sees the dense path, the reference, and not the probe of :func:`layout_agrees`."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:  # pragma: no cover - another torch: take the dense path
        return True
    return _get_current_dispatch_mode() is not None


def usable(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether the oneDNN layout may be tried at all: evaluation (no autograd, eval mode),
    float32 4-d input on the CPU, oneDNN present and enabled, no dispatch mode watching."""
    return (not torch.is_grad_enabled() and not module.training and x.dtype == torch.float32
            and x.device.type == "cpu" and x.dim() == 4 and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled and not _dispatch_mode_active())


def trunk_bound(convs: tuple[nn.Conv2d, ...], x: torch.Tensor) -> float:
    """An upper bound on ``|output|`` of every convolution of the trunk (max-pool and ReLU
    never increase the largest magnitude); ``inf`` or NaN when an input or weight is not
    finite (then the comparison with :data:`SAFE_BOUND` fails and the dense path runs)."""
    bound = 0.0
    if x.numel():  # one pass (linalg.vector_norm(x, inf) took ~1 ms per 500 images); a NaN stays NaN
        lo, hi = torch.aminmax(x)
        bound = float(torch.maximum(hi, -lo))
    for conv in convs:
        per_out = conv.weight.detach().abs().flatten(1).sum(1) * bound
        if conv.bias is not None:
            per_out = per_out + conv.bias.detach().abs()
        bound = float(per_out.amax())
    return bound


def _mkldnn_pass(convs: tuple[nn.Conv2d, ...], x: torch.Tensor) -> torch.Tensor:
    """conv -> maxpool 2 -> ReLU for each of ``convs``, in oneDNN's layout, flattened."""
    weights = [c.weight.detach().to_mkldnn() for c in convs]
    outs = []
    for i in range(0, int(x.shape[0]), TRUNK_ROWS):
        h = x[i:i + TRUNK_ROWS].contiguous().to_mkldnn()
        for conv, w in zip(convs, weights):
            h = torch.relu(F.max_pool2d(F.conv2d(h, w, conv.bias, conv.stride, conv.padding, conv.dilation,
                                                 conv.groups), 2))
        outs.append(h.to_dense())
    return torch.cat(outs).flatten(1) if outs else x.new_empty((0, 0))


def layout_agrees(convs: tuple[nn.Conv2d, ...], x: torch.Tensor, dense: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Whether the oneDNN layout gives the dense trunk's bits on this machine for these
    shapes and this many threads: checked once (a seeded probe batch of a full pass and a
    short one) and remembered."""
    key = (tuple(x.shape[1:]), tuple((tuple(c.weight.shape), c.stride, c.padding) for c in convs),
           torch.get_num_threads())
    if key not in _agree:
        g = torch.Generator().manual_seed(0)
        probe = torch.randn((TRUNK_ROWS + 5, *x.shape[1:]), generator=g)
        try:
            _agree[key] = torch.equal(_mkldnn_pass(convs, probe), dense(probe))
        except RuntimeError:  # a shape or build oneDNN does not take
            _agree[key] = False
    return _agree[key]


def fast_trunk(module: nn.Module, convs: tuple[nn.Conv2d, ...], x: torch.Tensor,
               dense: Callable[[torch.Tensor], torch.Tensor]) -> Optional[torch.Tensor]:
    """The trunk's output through oneDNN's layout, or None where the dense path must run
    (training, autograd, a bound over :data:`SAFE_BOUND` or non-finite, a machine where the
    two layouts disagree)."""
    if not usable(module, x) or not trunk_bound(convs, x) < SAFE_BOUND:
        return None
    if not layout_agrees(convs, x, dense):
        return None
    return _mkldnn_pass(convs, x)
