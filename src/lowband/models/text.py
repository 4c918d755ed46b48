"""Small text classifiers over int64 token ids (B, L), padding id 0 (AG News).

- :class:`TextBag`: fastText-style bag of embeddings (Joulin et al., EACL 2017): the mean
  of the non-padding token embeddings -> fc hidden + ReLU (``features``) -> ``head``.
- :class:`TextCNN`: Kim, "Convolutional Neural Networks for Sentence Classification"
  (EMNLP 2014): embedding -> parallel Conv1d with kernel sizes 3/4/5 -> ReLU ->
  max over time -> dropout (``features``) -> ``head``.

Both ignore padding: the pad embedding is the zero vector and receives no gradient,
TextBag averages only non-pad tokens, and TextCNN keeps only windows that start on a
real token (windows running past the end see zero embeddings, as with zero padding), so
appending pad tokens never changes the output.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .base import FeatureClassifier

PAD_ID = 0


def _check_tokens(model: str, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"model '{model}' needs integer token ids of shape (B, L); got {tuple(x.shape)} {x.dtype}"
        )


class TextBag(FeatureClassifier):
    """Masked mean of token embeddings -> Linear(embed_dim, hidden) + ReLU -> ``head``."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, mode="mean", padding_idx=PAD_ID)
        self.fc = nn.Linear(embed_dim, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        _check_tokens("text_bag", x)
        # EmbeddingBag excludes padding_idx from the mean; an all-pad row gives zeros.
        return F.relu(self.fc(self.embedding(x.long())))


class TextCNN(FeatureClassifier):
    """Embedding -> Conv1d per kernel size -> ReLU -> masked max over time -> dropout."""

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        num_filters: int,
        kernel_sizes: Sequence[int],
        dropout: float,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.kernel_sizes = tuple(kernel_sizes)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD_ID)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, num_filters, k) for k in self.kernel_sizes)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(num_filters * len(self.kernel_sizes), num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        _check_tokens("text_cnn", x)
        x = x.long()
        length = x.shape[1]
        # Right-pad so that every real token starts a full window of every kernel size.
        ids = F.pad(x, (0, max(self.kernel_sizes) - 1), value=PAD_ID)
        emb = self.embedding(ids).transpose(1, 2)  # (B, E, L + kmax - 1)
        real = (x != PAD_ID).unsqueeze(1)  # (B, 1, L): windows starting on a real token
        any_real = real.any(dim=2)  # (B, 1); all-pad rows pool to 0
        pooled = []
        for conv in self.convs:
            h = F.relu(conv(emb))[..., :length]  # windows starting at positions 0..L-1
            h = h.masked_fill(~real, float("-inf")).amax(dim=2)
            pooled.append(torch.where(any_real, h, torch.zeros_like(h)))
        return self.drop(torch.cat(pooled, dim=1))


def _check_text_args(model: str, input_shape: Sequence[int], vocab_size: int) -> None:
    if len(tuple(input_shape)) != 1:
        raise ValueError(f"model '{model}' needs a token input_shape (L,); got {tuple(input_shape)}")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 2:
        raise ValueError(
            f"model '{model}': vocab_size must be an int >= 2 (id 0 is padding); got {vocab_size!r}"
        )


def _positive_int(model: str, name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"model '{model}': {name} must be a positive int; got {value!r}")
    return value


def build_text_bag(
    num_classes: int,
    input_shape: Sequence[int],
    vocab_size: int,
    embed_dim: int = 64,
    hidden: int = 64,
) -> TextBag:
    """Bag-of-embeddings classifier; ``vocab_size`` comes from the dataset's meta."""
    _check_text_args("text_bag", input_shape, vocab_size)
    return TextBag(
        vocab_size,
        _positive_int("text_bag", "embed_dim", embed_dim),
        _positive_int("text_bag", "hidden", hidden),
        num_classes,
    )


def build_text_cnn(
    num_classes: int,
    input_shape: Sequence[int],
    vocab_size: int,
    embed_dim: int = 64,
    num_filters: int = 128,
    kernel_sizes: Sequence[int] = (3, 4, 5),
    dropout: float = 0.5,
) -> TextCNN:
    """Kim (2014) TextCNN; ``vocab_size`` comes from the dataset's meta."""
    _check_text_args("text_cnn", input_shape, vocab_size)
    ks = [_positive_int("text_cnn", "kernel_sizes entries", k) for k in kernel_sizes]
    if not ks:
        raise ValueError("model 'text_cnn': kernel_sizes must not be empty")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"model 'text_cnn': dropout must be in [0, 1); got {dropout!r}")
    return TextCNN(
        vocab_size,
        _positive_int("text_cnn", "embed_dim", embed_dim),
        _positive_int("text_cnn", "num_filters", num_filters),
        ks,
        float(dropout),
        num_classes,
    )
