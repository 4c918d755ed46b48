"""What nodes say to each other: a :class:`Message` of named tensors plus small metadata.

A message is the unit that the wire format (:mod:`lowband.comm.wire`) turns into bytes
and the :class:`~lowband.comm.ledger.Ledger` counts (design rule 2). It deliberately
holds only tensors and JSON-able scalars, so that every backend (serial, Ray, Flower)
can carry it and every byte it weighs can be counted.

A :class:`DeclaredTensor` stands for a payload too large to build (NTK-DFL's full
Jacobians): it travels as a name, dtype and shape only and is counted as *declared*
bytes, apart from the encoded bytes, so nobody mistakes one for the other.

``Message.stand_in`` holds the *equivalent inputs* of a declared payload: tensors that
travel uncounted only because a declared tensor of at least their information content
is counted in their place (NTK-DFL: the replying node's inputs ``X_j``, from which the
receiver recomputes the declared Jacobian ``J(X_j; w)`` it asked for). The network
refuses a message that has a stand-in but no declared entry, never encodes a stand-in
into the wire bytes, and hands the receiver a clone of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

import torch

from lowband.heap import heap_clone

SERVER: int = -1
"""Node id of the server in star topologies. Clients and peers are ``0..n-1``."""

DIRECTIONS: tuple[str, ...] = ("up", "down", "peer")
"""Link directions the ledger knows: client->server, server->client, node->node."""

MetaValue = Union[int, float, str, bool, None]


@dataclass(frozen=True)
class DeclaredTensor:
    """A payload that is counted from its shape and dtype but never materialised."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"DeclaredTensor shape must be non-negative, got {shape}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"DeclaredTensor dtype must be a torch.dtype, got {self.dtype!r}")
        object.__setattr__(self, "shape", shape)

    @property
    def numel(self) -> int:
        """Number of elements the payload would have."""
        return math.prod(self.shape)

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the payload in its own dtype, before any codec."""
        return self.numel * _itemsize(self.dtype)


@dataclass
class Message:
    """Named tensors plus small JSON-able metadata, of a given ``kind``.

    ``kind`` says what the message is ("weights", "delta", "jacobian", "logits", ...);
    it selects the codec (by-kind codec configuration) and labels the ledger record.
    Tensor names are flat strings such as ``"fc1.weight"``.
    """

    kind: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, MetaValue] = field(default_factory=dict)
    declared: dict[str, DeclaredTensor] = field(default_factory=dict)
    #: uncounted equivalent inputs of the declared tensors (see the module docstring);
    #: allowed only next to at least one declared entry; never part of the wire bytes
    stand_in: dict[str, torch.Tensor] = field(default_factory=dict)

    def clone(self) -> "Message":
        """A deep copy: tensors cloned, dicts copied (declared tensors are immutable)."""
        return Message(
            kind=self.kind,
            tensors={k: heap_clone(v) for k, v in self.tensors.items()},  # reusable heap memory (lowband.heap)
            meta=dict(self.meta),
            declared=dict(self.declared),
            stand_in={k: v.clone() for k, v in self.stand_in.items()},
        )

    def raw_nbytes(self) -> int:
        """Bytes of the tensors in their own dtypes (no header, no codec): a reference size."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def _itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()
