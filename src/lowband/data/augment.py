"""Per-client augmentation at partition time (FOL's "different viewpoints").

The FOL paper (section 4, *Data partition*) applies "rotation, flipping, cropping,
resizing, normalization, and the addition of small Gaussian noise" to each image while
partitioning, "to mimic the variability introduced by different satellite
perspectives", so that each client holds its own version of its images. This module
does that once, when the federation is built (never per batch), with plain torch ops:

- rotation by an angle uniform in ``[-rotation, rotation]`` degrees, via
  ``affine_grid`` / ``grid_sample`` (bilinear, zero padding = the dataset mean, since
  images are already normalised);
- horizontal flip with probability ``flip``;
- random resized crop: an area fraction uniform in ``crop_scale`` and an aspect ratio
  log-uniform in ``crop_ratio``, resized back to the full size (the same affine grid);
- additive Gaussian noise of standard deviation ``noise_std`` (in normalised units).

Every image gets its own random parameters; the generator is addressed by
``(seed, "augment", client)`` (design rule 4), so a client's images are the same in
every run with the same seed and do not depend on other clients. Labels are unchanged.
Only image tensors ``(N, C, H, W)`` can be augmented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..seeding import torch_gen

__all__ = ["AugmentSpec", "AUGMENTS", "augment_images", "augment_spec"]


@dataclass(frozen=True)
class AugmentSpec:
    """Ranges of the random per-image transforms (see the module docstring)."""

    rotation: float = 15.0
    flip: float = 0.5
    crop_scale: tuple[float, float] = (0.8, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    noise_std: float = 0.05


#: named presets for ``build_federation(augment=...)``. "fol": the FOL paper's list of
#: transforms with moderate ranges (the paper gives no numbers; ours are documented in
#: docs/algorithms/fol.md).
AUGMENTS: dict[str, AugmentSpec] = {"fol": AugmentSpec()}


def augment_spec(name: str) -> AugmentSpec:
    """The preset ``name`` or a one-line ValueError naming the allowed presets."""
    if name not in AUGMENTS:
        raise ValueError(f"augment must be one of {', '.join(AUGMENTS)} (or unset); got {name!r}")
    return AUGMENTS[name]


def _uniform(n: int, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)


def augment_images(x: torch.Tensor, spec: AugmentSpec, gen: torch.Generator,
                   batch_size: int = 1024) -> torch.Tensor:
    """A randomly transformed copy of the images ``x`` (float ``(N, C, H, W)``).

    All random numbers are drawn up front from ``gen`` in a fixed order, so the result
    depends only on ``gen``'s seed and ``N``, not on ``batch_size``.
    """
    if x.dim() != 4 or not x.is_floating_point():
        raise ValueError(f"augment: needs float images (N, C, H, W); got {tuple(x.shape)} {x.dtype}")
    n = int(x.shape[0])
    if n == 0:
        return x.clone()
    h, w = int(x.shape[2]), int(x.shape[3])
    angle = _uniform(n, -spec.rotation, spec.rotation, gen) * (math.pi / 180.0)
    flip = torch.rand(n, generator=gen, dtype=torch.float64) < spec.flip
    area = _uniform(n, spec.crop_scale[0], spec.crop_scale[1], gen)
    log_r = _uniform(n, math.log(spec.crop_ratio[0]), math.log(spec.crop_ratio[1]), gen)
    ratio = torch.exp(log_r)
    # crop size as a fraction of the side (clamped to the image); centre uniform in what is left
    sw = torch.sqrt(area * ratio).clamp(max=1.0)
    sh = torch.sqrt(area / ratio).clamp(max=1.0)
    cx = (1.0 - sw) * (2.0 * torch.rand(n, generator=gen, dtype=torch.float64) - 1.0)
    cy = (1.0 - sh) * (2.0 * torch.rand(n, generator=gen, dtype=torch.float64) - 1.0)
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float32) * spec.noise_std

    # output pixel (u, v) in [-1, 1]^2 samples input at  c + S R F (u, v)
    cos, sin = torch.cos(angle), torch.sin(angle)
    fx = torch.where(flip, -1.0, 1.0).to(torch.float64)
    theta = torch.zeros(n, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = sw * cos * fx
    theta[:, 0, 1] = -sw * sin
    theta[:, 1, 0] = sh * sin * fx
    theta[:, 1, 1] = sh * cos
    theta[:, 0, 2] = cx
    theta[:, 1, 2] = cy
    out = torch.empty_like(x)
    for i in range(0, n, batch_size):
        sl = slice(i, i + batch_size)
        grid = F.affine_grid(theta[sl].to(x.dtype), [int(x[sl].shape[0]), x.shape[1], h, w], align_corners=False)
        out[sl] = F.grid_sample(x[sl], grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out + noise.to(x.dtype)


def augment_client(x: torch.Tensor, name: str, seed: int, client: int, split: str) -> torch.Tensor:
    """Augment client ``client``'s ``split`` images with preset ``name`` (addressed RNG)."""
    return augment_images(x, augment_spec(name), torch_gen(seed, "augment", client, split))
