"""The model convention every algorithm relies on, and small shape helpers.

Representation-level methods (MOON, FedDBE, FedPAC, FedAS, FOL) need to reach the
representation before the classifier and the classifier itself. Every model in
:mod:`lowband.models` therefore subclasses :class:`FeatureClassifier`:

- ``features(x) -> Tensor (B, D)``: the representation before the classifier;
- ``head``: the final ``nn.Linear`` (``D -> num_classes``);
- ``forward(x) = head(features(x))``.

Nothing else (no hooks, no extra outputs): algorithms compose these two pieces.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn


class FeatureClassifier(nn.Module):
    """Base class: ``forward(x) = head(features(x))``; subclasses set ``head`` and
    implement :meth:`features`."""

    head: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Representation before the classifier, shape (B, D)."""
        raise NotImplementedError

    @property
    def feature_dim(self) -> int:
        """D, the width of :meth:`features` (the head's input size)."""
        return self.head.in_features

    @property
    def num_classes(self) -> int:
        """The head's output size."""
        return self.head.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def image_shape(model: str, input_shape: Sequence[int]) -> tuple[int, int, int]:
    """``input_shape`` as (C, H, W), or a one-line ValueError naming the model."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(
            f"model '{model}' needs an image input_shape (C, H, W); got {tuple(input_shape)}"
        )
    return shape  # type: ignore[return-value]


def flat_dim(model: str, input_shape: Sequence[int]) -> int:
    """Number of input features once a sample of ``input_shape`` is flattened."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 0 or min(shape) < 1:
        raise ValueError(f"model '{model}' needs a non-empty input_shape; got {tuple(input_shape)}")
    return math.prod(shape)


def conv_out(n: int, kernel: int, padding: int = 0, stride: int = 1) -> int:
    """Spatial size after a convolution (PyTorch's formula, dilation 1)."""
    return (n + 2 * padding - kernel) // stride + 1


def check_spatial(model: str, hw: tuple[int, int], size: tuple[int, int], need: str) -> None:
    """Fail clearly when the input is too small for the model's conv/pool stack."""
    if min(size) < 1:
        raise ValueError(f"model '{model}': input {hw[0]}x{hw[1]} is too small (needs {need})")
