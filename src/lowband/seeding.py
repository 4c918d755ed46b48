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


def seed_torch(seed: int) -> None:
    """Seed torch's global CPU generator (dropout and other module-level draws) with ``seed``,
    and the CUDA generators when CUDA is in use: what ``torch.manual_seed(seed)`` does.

    ``torch.manual_seed`` also queues a seeding call for every lazily initialised device
    backend (CUDA, XPU, MTIA), each with a captured Python stack: about 0.5 ms and a few kB
    per call on a CPU-only machine, which a per-node step pays once per node (at 10,000
    clients, 5 s of start-up and a list of queued calls that only grows). The CPU stream
    is the same bit for bit: the same generator, the same seed."""
    torch.default_generator.manual_seed(int(seed))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(int(seed))


def np_gen(seed: int, *keys: Key) -> np.random.Generator:
    """A numpy ``Generator`` addressed by ``(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))
