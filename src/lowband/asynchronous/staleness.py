"""Staleness weights of asynchronous aggregation.

An update trained from the server's model version ``tau`` arrives when the server is at
version ``t``; its *staleness* is ``s = t - tau`` (the number of server updates since the
client downloaded its model). The server trusts a stale update less:

- FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019/2020)
  mixes ``x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new`` with ``alpha_t = alpha * s(t - tau)``
  for one of three staleness functions: ``constant`` (1), ``polynomial``
  ``(s + 1) ** -a`` and ``hinge`` (1 while ``s <= b``, then ``1 / (a (s - b) + 1)``).
- FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
  AISTATS 2022) scales each buffered update by ``1 / sqrt(1 + s)``.

Pure functions of the staleness and the parameters, so every node computes the same weight.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = ["STALENESS_FUNCTIONS", "StalenessFn", "staleness_weight", "fedasync_alpha", "fedbuff_scale"]

StalenessFn = Literal["constant", "polynomial", "hinge"]
STALENESS_FUNCTIONS: tuple[str, ...] = ("constant", "polynomial", "hinge")


def staleness_weight(fn: str, s: int, a: float = 0.5, b: int = 4) -> float:
    """FedAsync's ``s(t - tau)`` for staleness ``s >= 0`` (module docstring)."""
    s = int(s)
    if s < 0:
        raise ValueError(f"staleness must be >= 0, got {s}")
    if fn == "constant":
        return 1.0
    if fn == "polynomial":
        return float((s + 1) ** (-float(a)))
    if fn == "hinge":
        return 1.0 if s <= int(b) else 1.0 / (float(a) * (s - int(b)) + 1.0)
    raise ValueError(f"staleness function must be one of {', '.join(STALENESS_FUNCTIONS)}, got {fn!r}")


def fedasync_alpha(alpha: float, fn: str, s: int, a: float = 0.5, b: int = 4) -> float:
    """The mixing weight ``alpha_t = alpha * s(t - tau)`` of FedAsync."""
    return float(alpha) * staleness_weight(fn, s, a, b)


def fedbuff_scale(s: int) -> float:
    """FedBuff's staleness scaling ``1 / sqrt(1 + s)``."""
    if int(s) < 0:
        raise ValueError(f"staleness must be >= 0, got {s}")
    return 1.0 / math.sqrt(1.0 + int(s))
