"""LEAF's (and McMahan et al.'s) next-character model: embedding 8 -> 2 stacked LSTMs of 256
-> linear over the vocabulary, applied to the last step's output.

Parameterised as LEAF's TensorFlow ``BasicLSTMCell`` is: one bias per gate, not PyTorch's two
(``b_ih`` and ``b_hh`` add up to one free vector). Each layer is an ``nn.LSTM`` without biases
whose input carries a constant 1 feature, so the input weight's last column *is* the gate bias
and the fused LSTM kernel still runs. Parameters (vocabulary V, embedding E, hidden H)::

    V*E + 4H(E + 1 + H) + 4H(H + 1 + H) + (H*V + V)
    = 640 + 271,360 + 525,312 + 20,560 = 817,872   (V = 80, E = 8, H = 256)

which is what LEAF's stacked_lstm has; with PyTorch's default double bias it would be 819,920.
Initialisation follows TensorFlow's defaults for that graph: Glorot-uniform embedding and
dense kernel, Glorot-uniform LSTM kernels over the cell's joint (input + hidden) x 4H matrix,
zero biases, and the forget-gate bias at 1.0 (``BasicLSTMCell(forget_bias=1.0)`` adds 1.0 to
that gate; here it is the bias's starting value, the same function at every step of training).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .base import FeatureClassifier

__all__ = ["CharLSTM", "build_char_lstm", "char_lstm_params"]


def char_lstm_params(vocab_size: int, embed_dim: int = 8, hidden: int = 256, layers: int = 2,
                     num_classes: int | None = None) -> int:
    """The hand count of :class:`CharLSTM`'s parameters (one bias per gate)."""
    v_out = vocab_size if num_classes is None else num_classes
    total = vocab_size * embed_dim
    width = embed_dim
    for _ in range(layers):
        total += 4 * hidden * (width + 1 + hidden)
        width = hidden
    return total + hidden * v_out + v_out


class CharLSTM(FeatureClassifier):
    """Token ids (B, L) -> logits (B, num_classes) of the character after the window."""

    def __init__(self, vocab_size: int, embed_dim: int, hidden: int, layers: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstms = nn.ModuleList()
        width = embed_dim
        for _ in range(layers):
            self.lstms.append(nn.LSTM(width + 1, hidden, num_layers=1, bias=False, batch_first=True))
            width = hidden
        self.head = nn.Linear(hidden, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TensorFlow 1.x defaults of LEAF's graph (see the module docstring)."""
        nn.init.xavier_uniform_(self.embedding.weight)
        for lstm in self.lstms:
            w_ih, w_hh = lstm.weight_ih_l0, lstm.weight_hh_l0  # (4H, in + 1), (4H, H)
            h4, in1 = w_ih.shape
            bound = math.sqrt(6.0 / ((in1 - 1 + w_hh.shape[1]) + h4))
            with torch.no_grad():
                w_ih.uniform_(-bound, bound)
                w_hh.uniform_(-bound, bound)
                w_ih[:, -1] = 0.0
                w_ih[h4 // 4: h4 // 2, -1] = 1.0  # PyTorch gate order i, f, g, o
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.is_floating_point():
            raise ValueError(f"model 'char_lstm' needs integer character ids of shape (B, L); got "
                             f"{tuple(x.shape)} {x.dtype}")
        h = self.embedding(x.long())
        ones = h.new_ones(h.shape[0], h.shape[1], 1)
        for lstm in self.lstms:
            h, _ = lstm(torch.cat([h, ones], dim=2))
        return h[:, -1, :]


def build_char_lstm(
    num_classes: int,
    input_shape: Sequence[int],
    vocab_size: int,
    embed_dim: int = 8,
    hidden: int = 256,
    layers: int = 2,
) -> CharLSTM:
    """LEAF's Shakespeare model; ``vocab_size`` comes from the dataset's meta (80 for LEAF)."""
    if len(tuple(input_shape)) != 1:
        raise ValueError(f"model 'char_lstm' needs a token input_shape (L,); got {tuple(input_shape)}")
    for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("hidden", hidden), ("layers", layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"model 'char_lstm': {name} must be a positive int; got {value!r}")
    return CharLSTM(vocab_size, embed_dim, hidden, layers, num_classes)
