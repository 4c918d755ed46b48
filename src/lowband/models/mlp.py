"""Fully connected models: the NTK-DFL / SPARK MLP and a linear (logistic) model.

- :class:`MLP`: Thompson et al., "NTK-DFL" (ICML 2025) and the SPARK paper, section 5:
  784-100-10 with biases and ReLU (d = 79,510 on Fashion-MNIST), Kaiming-normal
  (fan_in, ReLU gain) weights and zero biases (see specs/ntk_dfl_spark.md). The first
  layer is ``fc1`` and the last ``head`` so that the closed-form NTK code can read
  W1, b1, W2, b2 directly.
- :class:`LogReg`: flatten -> linear, the convex model of FedProx's Synthetic(alpha, beta)
  data (Li et al., MLSys 2020) and of quick tests on sklearn digits.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .base import FeatureClassifier, flat_dim


class MLP(FeatureClassifier):
    """Flatten -> [Linear -> ReLU] per hidden width -> ``head``.

    ``features(x)`` is the last hidden activation (after its ReLU). Layers: ``fc1``, then
    ``hidden_layers`` (empty for the paper's single hidden layer), then ``head``.
    """

    def __init__(self, in_dim: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        widths = [in_dim, *hidden]
        self.fc1 = nn.Linear(widths[0], widths[1])
        self.hidden_layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(widths[1:-1], widths[2:])
        )
        self.head = nn.Linear(widths[-1], num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-normal (fan_in, ReLU gain) weights and zero biases, as NTK-DFL does.

        Uses torch's default RNG only, so ``torch.manual_seed`` fixes the draw.
        """
        for layer in (self.fc1, *self.hidden_layers, self.head):
            nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(layer.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        for layer in self.hidden_layers:
            h = torch.relu(layer(h))
        return h


class LogReg(FeatureClassifier):
    """Multinomial logistic regression: ``features(x)`` is the flattened input."""

    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(in_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def build_mlp(
    num_classes: int, input_shape: Sequence[int], hidden: int | Sequence[int] = 100
) -> MLP:
    """MLP of NTK-DFL / SPARK; ``hidden`` is one width or a list of widths (deeper nets)."""
    widths = [hidden] if isinstance(hidden, int) else list(hidden)
    if not widths or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in widths):
        raise ValueError(f"model 'mlp': hidden must be a positive int or a list of them; got {hidden!r}")
    return MLP(flat_dim("mlp", input_shape), widths, num_classes)


def build_logreg(num_classes: int, input_shape: Sequence[int]) -> LogReg:
    """Linear model on the flattened input (PyTorch's default nn.Linear init)."""
    return LogReg(flat_dim("logreg", input_shape), num_classes)
