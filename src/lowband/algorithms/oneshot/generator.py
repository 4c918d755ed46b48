"""The synthetic-data generator and helpers shared by DENSE and Co-Boosting.

:class:`Generator` is DENSE's (Zhang et al., NeurIPS 2022; also used by Co-Boosting):
``z -> linear -> BN -> [upsample x2 -> conv 3x3 -> BN -> LeakyReLU(0.2)] x 2 -> conv 3x3
-> sigmoid``, producing images in ``[0, 1]`` at the data's size (specs/fol.md). Images
are normalised with the dataset's per-channel statistics before they reach a classifier
(:func:`normalise`). :func:`augment_batch` is the synthesis-time augmentation of the
reference code (random crop with 4 pixels of padding, horizontal flip) in plain torch;
:class:`BNStatLoss` is DeepInversion's BatchNorm-statistics matching term.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: per-channel mean/std of the image sources lowband normalises with (CIFAR-10 by default)
DEFAULT_STATS = {3: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)), 1: ((0.5,), (0.5,))}


class Generator(nn.Module):
    """DENSE's generator for ``(C, H, W)`` images (``H`` and ``W`` multiples of 4)."""

    def __init__(self, nz: int, ngf: int, image_shape: Sequence[int]) -> None:
        super().__init__()
        c, h, w = (int(s) for s in image_shape)
        if h % 4 or w % 4:
            raise ValueError(f"Generator: image height and width must be multiples of 4, got {h}x{w}")
        self.nz, self.shape = nz, (c, h, w)
        self.h0, self.w0 = h // 4, w // 4
        self.l1 = nn.Linear(nz, ngf * 2 * self.h0 * self.w0)
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(ngf * 2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(ngf * 2, ngf * 2, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(ngf * 2, ngf, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, c, 3, stride=1, padding=1),
            nn.Sigmoid(),
        )
        self.ngf = ngf

    def reset(self) -> None:
        """The reference code's ``reset_model`` (DCGAN initialisation), applied before every
        synthesis: conv/linear weights ``N(0, 0.02)``, biases 0, BatchNorm weights
        ``N(1, 0.02)``, BatchNorm biases 0. Small weights make the first images nearly
        uniform grey, so the teachers' gradients, not a random init, shape them."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.normal_(m.weight, 1.0, 0.02)
                nn.init.zeros_(m.bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z).view(z.shape[0], self.ngf * 2, self.h0, self.w0)
        return self.conv_blocks(out)


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``[0, 1]`` images -> the classifiers' normalised input space."""
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def augment_batch(x: torch.Tensor, gen: torch.Generator, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop (zero padding ``pad``) and, with ``flip``, horizontal flip, per image
    (differentiable)."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)  # CPU draws: the same on any device
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen).to(x.device)
    flips = (torch.rand(n, generator=gen) < 0.5).to(x.device)
    if not flip:
        flips = torch.zeros_like(flips)
    rows = (dy[:, None] + torch.arange(h, device=x.device)[None, :])  # (n, h)
    cols = (dx[:, None] + torch.arange(w, device=x.device)[None, :])  # (n, w)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    idx_r = rows[:, None, :, None].expand(n, x.shape[1], h, padded.shape[3])
    out = padded.gather(2, idx_r)
    idx_c = cols[:, None, None, :].expand(n, x.shape[1], h, w)
    return out.gather(3, idx_c)


class BNStatLoss:
    """DeepInversion's BatchNorm term: for every BatchNorm of the given modules,
    ``||mean(x) - running_mean||_2 + ||var(x) - running_var||_2`` of its input batch,
    summed. Hooks are removed with :meth:`close`."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self.terms: list[torch.Tensor] = []
        self.handles = []
        for m in modules:
            for bn in m.modules():
                if isinstance(bn, nn.BatchNorm2d):
                    self.handles.append(bn.register_forward_hook(self._hook))

    def _hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.permute(1, 0, 2, 3).reshape(x.shape[1], -1).var(dim=1, unbiased=False)
        self.terms.append(torch.norm(module.running_mean - mean, 2) + torch.norm(module.running_var - var, 2))

    def pop(self) -> torch.Tensor:
        """The summed term of the forward passes since the last call (0 without BatchNorm)."""
        total = sum(self.terms) if self.terms else torch.zeros(())
        self.terms = []
        return total

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
