"""pfl-research's CIFAR-10 benchmark CNN (``simple_cnn`` in apple/pfl-research
``benchmarks/model/pytorch/cnn.py``), for setting lowband's speed beside pfl-research's.

conv 3x3 32 (no padding) -> ReLU -> conv 3x3 64 -> ReLU -> max-pool 2 -> dropout 0.25 ->
flatten -> fc 128 -> ReLU -> dropout 0.5 (``features``) -> fc ``num_classes`` (``head``).
Weights Glorot/Xavier-uniform (pfl-research matches its TF2 model that way); biases keep
PyTorch's default. On 3x32x32: 896 + 18,496 + 1,605,760 + 1,290 = 1,626,442 parameters.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .base import FeatureClassifier, check_spatial, conv_out, image_shape

__all__ = ["PflSimpleCNN", "build_pfl_simple_cnn"]


class PflSimpleCNN(FeatureClassifier):
    """pfl-research's ``simple_cnn`` with the package's features/head split."""

    def __init__(self, in_channels: int, hw: tuple[int, int], num_classes: int) -> None:
        super().__init__()
        h, w = (conv_out(conv_out(s, 3), 3) // 2 for s in hw)
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Dropout(0.25), nn.Flatten(), nn.Linear(64 * h * w, 128), nn.ReLU(), nn.Dropout(0.5),
        )
        self.head = nn.Linear(128, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build_pfl_simple_cnn(num_classes: int, input_shape: Sequence[int]) -> PflSimpleCNN:
    """pfl-research's CIFAR-10 benchmark CNN for ``input_shape`` (C, H, W)."""
    c, h, w = image_shape("pfl_simple_cnn", input_shape)
    check_spatial("pfl_simple_cnn", (h, w), ((h - 4) // 2, (w - 4) // 2), "at least 6x6")
    return PflSimpleCNN(c, (h, w), num_classes)
