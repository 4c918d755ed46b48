"""Models: the papers' MLPs, CNNs, ResNet-18 and text classifiers, plus a registry.

Every model follows one convention (see :mod:`lowband.models.base`):
``features(x) -> (B, D)``, a final ``nn.Linear`` called ``head``, and
``forward(x) = head(features(x))``. Build them by name with :func:`build_model`.
"""

from .base import FeatureClassifier
from .registry import (
    MODELS,
    REQUIRED,
    ModelInfo,
    available_models,
    build_model,
    count_params,
)

__all__ = [
    "MODELS",
    "REQUIRED",
    "FeatureClassifier",
    "ModelInfo",
    "available_models",
    "build_model",
    "count_params",
]
