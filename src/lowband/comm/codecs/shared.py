"""The codec of ``sharedmask(frac)``: random-k drawn from the round's shared seed, so every
sender of a kind in a round keeps the same coordinates (summable under secure aggregation).
Why and how privacy uses it: :mod:`lowband.privacy.sparsify`. It lives with the codecs so
the wire and the network can name it without importing the privacy package."""

from __future__ import annotations

from typing import Any

import torch

from ...seeding import torch_gen
from .core import RandMask

__all__ = ["SHARED_PURPOSE", "SharedMask", "round_shared", "shared_gen", "sharedmask"]

SHARED_PURPOSE = "codec-shared"
"""The purpose key of a round-shared codec's generator (see :func:`shared_gen`)."""


class SharedMask(RandMask):
    """Random-k with the round's shared seed (module docstring)."""

    round_shared = True

    def __init__(self, frac: float) -> None:
        super().__init__(frac, scale=False)
        self.spec = f"sharedmask({self.frac!r})"


def sharedmask(frac: float) -> SharedMask:
    """The summable random-k sparsifier (see :class:`SharedMask`)."""
    return SharedMask(frac)


def round_shared(codec: Any) -> bool:
    """Whether ``codec`` (or a codec inside its chain or error feedback) draws round-shared
    randomness: then its whole generator is the round's shared one."""
    if getattr(codec, "round_shared", False):
        return True
    inner = [*getattr(codec, "codecs", ()), *([codec.inner] if hasattr(codec, "inner") else [])]
    return any(round_shared(c) for c in inner)


def shared_gen(seed: int, round: int, kind: str) -> torch.Generator:
    """The generator every sender of ``kind`` in ``round`` hands a round-shared codec."""
    return torch_gen(seed, SHARED_PURPOSE, int(round), kind)
