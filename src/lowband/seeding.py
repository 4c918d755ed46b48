"""Addressed randomness (design rule 4).

Every random choice takes a generator derived from ``(seed, *keys)`` — typically
``(seed, round, node, purpose)`` — instead of consuming a shared stream. Results then do
not depend on the order in which nodes are processed, on the executor, or on whether a
run was resumed from a checkpoint.
"""

from __future__ import annotations

import hashlib
from typing import Union

import numpy as np
import torch

Key = Union[int, str]


def derive_seed(seed: int, *keys: Key) -> int:
    """A 63-bit integer seed that is a stable hash of ``seed`` and ``keys``.

    Stable across processes and Python versions (no use of ``hash()``), so a Ray worker
    derives the same stream as the serial executor.
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((int(seed),) + tuple(keys)).encode())
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def torch_gen(seed: int, *keys: Key) -> torch.Generator:
    """A CPU ``torch.Generator`` addressed by ``(seed, *keys)``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, *keys))
    return g


def np_gen(seed: int, *keys: Key) -> np.random.Generator:
    """A numpy ``Generator`` addressed by ``(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))
