"""A summable sparsifier: ``sharedmask(frac)``, random-k whose coordinate set is the same for
every sender of a round.

Top-k, and lowband's ``randmask``, choose each client's coordinates on that client (from its
update, or from its own seed), so the sum of two sparse updates lives on the union of their
supports and secure aggregation, which sums fixed-length vectors position by position,
cannot carry them. ``sharedmask(frac)`` draws its coordinates from the round's shared seed
instead: the network hands a round-shared codec the generator ``torch_gen(seed,
"codec-shared", round, kind)`` (not the per-link one), so every client sending a message of
that kind in a round keeps the same ``k = ceil(frac * numel)`` coordinates of each tensor.
The sum of their sparse vectors is the sparse vector of their sum: summable.

On a plain link it is a codec like any other: the values of the kept coordinates (float32)
and the 8-byte seed travel; nothing is rescaled (the server's mean of the sparse updates is
the mean update restricted to the round's coordinates, a random-subspace step). Under
``secagg.enabled = true`` the masked field vector carries only the ``k`` kept coordinates of
the update (the same coordinates as the codec's, :func:`message_support`):
``ceil(k * modulus_bits / 8)`` bytes instead of ``ceil(d * modulus_bits / 8)``; with
distributed DP the Skellam mechanism runs in those ``k`` dimensions. Under central DP the
server knows the round's support (it is public, derived from the seed and the round, never
from data), so it adds the Gaussian noise
on those coordinates only; the sensitivity is unchanged (each clipped update still has norm
at most ``S``), so the accounting is the same and the noise norm shrinks by ``sqrt(frac)``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..comm.codecs.shared import SHARED_PURPOSE, SharedMask, round_shared, shared_gen, sharedmask

__all__ = ["SHARED_PURPOSE", "SharedMask", "message_support", "round_shared", "shared_fraction", "shared_gen",
           "sharedmask", "support_size"]

def shared_fraction(spec: str) -> Optional[float]:
    """``frac`` when the codec spec is ``sharedmask(frac)`` or ``ef(sharedmask(frac))``, else None."""
    from ..comm.codecs import parse_codec

    codec = parse_codec(spec)
    if isinstance(getattr(codec, "inner", None), SharedMask):
        codec = codec.inner
    return codec.frac if isinstance(codec, SharedMask) else None


def message_support(frac: float, seed: int, round: int, kind: str,
                    shapes: Sequence[tuple[str, tuple[int, ...]]]) -> torch.Tensor:
    """The flat boolean support of a ``sharedmask(frac)`` message of ``kind`` in ``round``
    whose float tensors are ``shapes`` (name, shape), concatenated in the given order: the
    coordinates every client's decoded message can be non-zero on (as the wire format derives
    each tensor's generator, :func:`lowband.comm.wire.encode_message`)."""
    from ..comm.codecs.core import _draw_seed
    from ..comm.wire import _tensor_gen

    codec = SharedMask(frac)
    base = int(torch.randint(0, 2**62, (1,), generator=shared_gen(seed, round, kind)))
    return torch.cat([codec._mask(_draw_seed(_tensor_gen(base, name)), math.prod(shape)) for name, shape in shapes])


def support_size(frac: float, shapes: Sequence[tuple[int, ...]]) -> int:
    """Coordinates a ``sharedmask(frac)`` message keeps: ``sum ceil(frac * numel)`` over its tensors."""
    codec = SharedMask(frac)
    return sum(codec.k_for(math.prod(s)) for s in shapes)
