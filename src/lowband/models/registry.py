"""Model registry: build any model of the package by name with validated kwargs.

``MODELS`` maps a name to a :class:`ModelInfo` (builder, one-line description, accepted
kwargs with their defaults, the inputs it accepts). :func:`build_model` checks the name
and kwargs (scikit-learn style: one-line errors naming what is allowed) and can seed the
initialisation without disturbing the caller's RNG.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import torch
from torch import nn

from .cnn import (
    build_cnn_cifar,
    build_cnn_fmnist,
    build_fol_cnn,
    build_fol_wildfire_cnn,
    build_simplecnn,
)
from .lstm import build_char_lstm
from .mlp import build_logreg, build_mlp
from .pfl import build_pfl_simple_cnn
from .resnet import build_resnet18
from .text import build_text_bag, build_text_cnn

Inputs = Literal["image", "any", "tokens"]


class _Required:
    """Marker for a kwarg without a default (e.g. ``vocab_size``)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class ModelInfo:
    """What the registry knows about one model.

    ``kwargs`` maps each accepted keyword (besides ``num_classes`` and ``input_shape``) to
    its default, or to ``REQUIRED``. ``inputs`` is ``"image"`` (float (B, C, H, W)),
    ``"any"`` (float, flattened per sample) or ``"tokens"`` (int64 ids (B, L), pad id 0).
    """

    name: str
    builder: Callable[..., nn.Module]
    description: str
    inputs: Inputs
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def _info(name: str, builder: Callable[..., nn.Module], inputs: Inputs, description: str) -> ModelInfo:
    params = list(inspect.signature(builder).parameters.values())[2:]  # skip num_classes, input_shape
    kwargs = {
        p.name: (REQUIRED if p.default is inspect.Parameter.empty else p.default) for p in params
    }
    return ModelInfo(name, builder, description, inputs, kwargs)


MODELS: dict[str, ModelInfo] = {
    info.name: info
    for info in (
        _info(
            "mlp",
            build_mlp,
            "any",
            "NTK-DFL/SPARK MLP 784-100-10, Kaiming-normal init (79,510 params on FMNIST)",
        ),
        _info(
            "cnn_fmnist",
            build_cnn_fmnist,
            "image",
            "FedCSPACK FMNIST CNN, 2 conv + 3 fc (100,816 params on 1x28x28)",
        ),
        _info(
            "cnn_cifar",
            build_cnn_cifar,
            "image",
            "FedCSPACK CIFAR CNN, 3 conv + 2 fc (541,094 params on 3x32x32)",
        ),
        _info(
            "simplecnn",
            build_simplecnn,
            "image",
            "FedMA/MOON/KTA simple-cnn, LeNet-style (62,006 params on 3x32x32)",
        ),
        _info(
            "fol_cnn",
            build_fol_cnn,
            "image",
            "FOL table 7 CIFAR-10 CNN, 3 conv + linear (319,242 params on 3x32x32)",
        ),
        _info(
            "fol_wildfire_cnn",
            build_fol_wildfire_cnn,
            "image",
            "FOL table 9 Wildfire CNN, 4x(conv+BN+ReLU+pool) + GAP + linear",
        ),
        _info(
            "resnet18",
            build_resnet18,
            "image",
            "CIFAR ResNet-18, BatchNorm or GroupNorm (11,173,962 params, 10 classes)",
        ),
        _info(
            "text_bag",
            build_text_bag,
            "tokens",
            "mean of non-pad token embeddings -> fc 64 ReLU -> linear",
        ),
        _info(
            "text_cnn",
            build_text_cnn,
            "tokens",
            "Kim (2014) TextCNN, kernels 3/4/5, max over time",
        ),
        _info(
            "pfl_simple_cnn",
            build_pfl_simple_cnn,
            "image",
            "pfl-research's CIFAR-10 benchmark simple_cnn: conv 32, conv 64, pool, fc 128 (1,626,442 params)",
        ),
        _info(
            "char_lstm",
            build_char_lstm,
            "tokens",
            "LEAF/FedAvg Shakespeare LSTM: embedding 8 -> 2 x LSTM 256 -> linear (817,872 params, 80 symbols)",
        ),
        _info(
            "logreg",
            build_logreg,
            "any",
            "flatten -> linear (FedProx Synthetic, digits quick tests)",
        ),
    )
}


def register_model(name: str, builder: Callable[..., nn.Module], *, description: str = "",
                   inputs: Inputs = "any") -> ModelInfo:
    """Add a model to the registry (plugins): ``builder(num_classes, input_shape, **kwargs)``
    returns the module; its keyword arguments (with defaults) become the config's
    ``[model]`` options. Follow the package's convention (``features`` + a final
    ``head`` Linear) for algorithms that split the model."""
    if name in MODELS:
        raise ValueError(f"model {name!r} registered twice")
    info = _info(name, builder, inputs, description or f"plugin model ({getattr(builder, '__module__', '?')})")
    MODELS[name] = info
    return info


def available_models() -> list[str]:
    """Registered model names, in registration order."""
    return list(MODELS)


def count_params(model: nn.Module) -> int:
    """Number of parameters (trainable or not; buffers such as BN running stats excluded)."""
    return sum(p.numel() for p in model.parameters())


def build_model(
    name: str,
    *,
    num_classes: int,
    input_shape: Sequence[int],
    seed: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build model ``name`` for ``num_classes`` classes and per-sample ``input_shape``.

    ``input_shape`` is (C, H, W) for image models, any shape for flattening models, and
    (L,) for token models. With ``seed``, the initialisation is drawn inside
    ``torch.random.fork_rng()`` after ``torch.manual_seed(seed)``: the same seed gives an
    identical state_dict and the caller's global RNG state is left untouched. Without it,
    the init consumes torch's default RNG (models draw from nothing else).
    """
    info = MODELS.get(name)
    if info is None:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(MODELS)}")
    allowed = ", ".join(info.kwargs) or "none"
    for key in kwargs:
        if key not in info.kwargs:
            raise ValueError(f"model {name!r} got unknown kwarg {key!r}; allowed: {allowed}")
    missing = [k for k, v in info.kwargs.items() if v is REQUIRED and k not in kwargs]
    if missing:
        raise ValueError(f"model {name!r} needs kwarg {missing[0]!r}; allowed: {allowed}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f"model {name!r}: num_classes must be a positive int; got {num_classes!r}")
    shape = tuple(input_shape)
    if seed is None:
        return info.builder(num_classes, shape, **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return info.builder(num_classes, shape, **kwargs)
