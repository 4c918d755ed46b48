"""Codecs with state: error feedback (``ef(c)``), EF21 (``ef21(c)``) and PowerSGD (``powersgd(r)``).

The state is a flat ``{name: Tensor}`` dict that the :class:`~lowband.comm.network.Network`
keeps per sender, link (receiver or broadcast, and message kind) and tensor name, and
passes to ``encode_stateful``; it is never sent, it is checkpointed with the run and it
lives where the sender's messages are encoded (the sender's Ray shard). Decoding needs
no state: the receiver decodes the bytes alone, exactly as for a stateless codec.

A codec replaces state entries, never mutates them in place, so the network can commit a
message's new state only once the whole message has encoded.

EF21 (:class:`EF21`) is the exception to "decoding needs no state": its receiver keeps a
mirror of the sender's estimate, and the network (not the codec) moves both copies
together, on accepted delivery only (:meth:`Network.receive
<lowband.comm.network.Network.receive>`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .core import (
    AuxReader,
    Codec,
    HeaderSpecs,
    LeafSpec,
    _as_float,
    _aux_shape,
    _Base,
    _check_parts,
    _read_shape,
    _shape_part,
    check_leaves_of,
    is_stateful,
)

MAX_POWERSGD_RANK = 32
"""Largest rank of ``powersgd(r)``: decode costs ``r`` multiply-adds per decoded element."""


def _residual(state: dict[str, Tensor], key: str, like: Tensor, spec: str) -> Optional[Tensor]:
    e = state.get(key)
    if e is not None and e.shape != like.shape:
        raise ValueError(f"codec {spec}: the kept residual has shape {tuple(e.shape)}, the tensor "
                         f"{tuple(like.shape)} (a tensor of one name must keep its shape on a link: an algorithm "
                         f"whose messages change shape lists their kind in Algorithm.unaligned_kinds, "
                         f"and a stateless codec must carry them)")
    return e


class ErrorFeedback(_Base):
    """Error feedback around a lossy codec (Seide et al. 2014; Stich et al. 2018).

    The sender keeps a residual ``e`` (zero at first) and sends ``C(x + e)``; then
    ``e <- x + e - decode(C(x + e))``. So what every message loses is added to the next
    one: the sum of what was sent plus the current residual equals the sum of the
    inputs, whatever ``C`` drops (top-k's small entries, sign's magnitudes). The bytes are
    ``C``'s; the receiver decodes as for ``C``. The residual stays bounded only for a
    contractive ``C`` (``||C(v) - v|| < ||v||``: top-k, sign, int8, QSGD with enough levels
    per bucket); around a high-variance unbiased codec (``qsgd(1)`` over a whole tensor,
    ``randmask(0.01,scale=true)``) it grows without bound, as the theory says. A message with non-finite values is
    refused (nothing sent, the residual unchanged) rather than poisoning the residual.
    """

    stateful = True

    def __init__(self, inner: Codec) -> None:
        if is_stateful(inner):
            raise ValueError(f"ef: the wrapped codec {inner.spec!r} keeps state of its own; wrap a "
                             f"stateless lossy codec, e.g. ef(topk(0.01))")
        self.inner = inner
        self.spec = f"ef({inner.spec})"

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        return self.inner.encode(x, gen)

    def encode_stateful(self, x: Tensor, gen: torch.Generator, state: dict[str, Tensor]) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"codec {self.spec}: tensor has non-finite values (inf or nan)")
        e = _residual(state, "e", x, self.spec)
        v = x if e is None else x + e
        parts = self.inner.encode(v, gen)
        state["e"] = v - self.inner.decode(dict(parts))
        return parts

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        return self.inner.decode(parts)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        return self.inner.leaves(shape)

    def check_leaves(self, specs: HeaderSpecs, read: AuxReader, limit: Optional[int] = None) -> tuple[int, ...]:
        return check_leaves_of(self.inner, specs, read, limit)

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:  # pragma: no cover
        raise NotImplementedError("ef checks leaves through the wrapped codec")


def ef(inner: Codec) -> ErrorFeedback:
    """Error feedback around ``inner`` (see :class:`ErrorFeedback`)."""
    return ErrorFeedback(inner)


class EF21(_Base):
    """EF21 (Richtarik, Sokolov, Fatkhullin, NeurIPS 2021) around a contractive codec ``C``.

    The sender and the receiver of a link both keep an estimate ``g`` of the sender's
    tensor (zero at first). To send ``x`` the sender transmits ``c = C(x - g)``; the receiver
    decodes ``x_hat = g + decode(c)`` and both set ``g <- g + decode(c)``, so ``g`` tracks
    ``x`` and, for a constant ``x``, converges to it geometrically (``||x - g||`` shrinks by
    the contraction factor of ``C`` each message). The bytes are ``C``'s.

    This codec only encodes ``C(x - g)``: it reads the sender's ``g`` (state key ``"g"``) and
    never changes it, and its ``decode`` returns the correction ``decode(c)``. The network
    applies the update to both copies when the receiver *accepts* the message (see
    :meth:`lowband.comm.network.Network.receive`): a message that is dropped (dropout, a
    deadline) or refused (the validator) moves neither copy, so they stay equal. Hence: a
    broadcast is encoded once per receiver (each link has its own estimate), the whole
    codec spec (a codec chained after it would change what the receiver decodes: wrap the
    chain, ``ef21(topk(0.01)+fp16)``), and a stateless ``C``. A message with non-finite
    values is refused at the sender (nothing sent, nothing moved).
    """

    stateful = True
    #: the receiver keeps state too: the network commits it on accepted delivery
    receiver_state = True

    def __init__(self, inner: Codec) -> None:
        if is_stateful(inner):
            raise ValueError(f"ef21: the wrapped codec {inner.spec!r} keeps state of its own; wrap a "
                             f"stateless lossy codec, e.g. ef21(topk(0.01))")
        self.inner = inner
        self.spec = f"ef21({inner.spec})"

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        return self.inner.encode(x, gen)

    def encode_stateful(self, x: Tensor, gen: torch.Generator, state: dict[str, Tensor]) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"codec {self.spec}: tensor has non-finite values (inf or nan)")
        g = _residual(state, "g", x, self.spec)
        return self.inner.encode(x if g is None else x - g, gen)

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        """The correction ``decode(c)``; the receiver's estimate is added by the network."""
        return self.inner.decode(parts)

    def step(self, state: dict[str, Tensor], c: Tensor) -> Tensor:
        """The estimate after correction ``c``: ``g + c`` (``c`` itself while ``g`` is zero)."""
        g = _residual(state, "g", c, self.spec)
        return c.clone() if g is None else g + c

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        return self.inner.leaves(shape)

    def check_leaves(self, specs: HeaderSpecs, read: AuxReader, limit: Optional[int] = None) -> tuple[int, ...]:
        return check_leaves_of(self.inner, specs, read, limit)

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:  # pragma: no cover
        raise NotImplementedError("ef21 checks leaves through the wrapped codec")


def ef21(inner: Codec) -> EF21:
    """EF21 around ``inner`` (see :class:`EF21`)."""
    return EF21(inner)


def has_receiver_state(codec: object) -> bool:
    """Whether ``codec`` keeps state at the receiver too (``ef21(...)``)."""
    return bool(getattr(codec, "receiver_state", False))


class PowerSGD(_Base):
    """PowerSGD (Vogels et al., NeurIPS 2019): rank-``r`` factors, warm start, error feedback.

    A tensor of 2 or more dimensions is a matrix ``M`` (``shape[0]`` rows, the product of
    the rest as columns) plus the kept residual ``e``. One power-iteration step from the
    kept ``Q`` (``m x r``; first i.i.d. normal from the link's generator): ``P = M Q``,
    ``P <- orthonormalise(P)`` (reduced QR), ``Q = M^T P``; the leaves are ``p`` (``n x r``)
    and ``q`` (``m x r``), the receiver decodes ``P Q^T`` and the sender keeps ``Q`` (warm
    start) and ``e = M - P Q^T`` (error feedback). Exact for a matrix of rank ``<= r``.

    A tensor of fewer than 2 dimensions, or a matrix whose factors would not be smaller
    (``r (n + m) >= n m``), travels uncompressed, as the paper does for biases: ``p`` is
    the flattened tensor and ``q`` is empty. Here each sender compresses its own message
    (the paper all-reduces ``P`` and ``Q`` over workers that share one ``Q``; a server
    that averages decoded messages gets the mean of per-sender rank-``r`` approximations).
    Leaves: ``p``, ``q``, ``_shape``; ``r`` is capped at ``min(n, m)``.
    """

    stateful = True

    def __init__(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_POWERSGD_RANK:
            raise ValueError(f"powersgd: rank must be an int in 1..{MAX_POWERSGD_RANK}, got {rank!r}")
        self.rank = rank
        self.spec = f"powersgd({rank})"

    def factors(self, shape: tuple[int, ...]) -> Optional[tuple[int, int, int]]:
        """``(n, m, r)`` of a tensor that is compressed, None for one sent as it is."""
        if len(shape) < 2:
            return None
        n, m = shape[0], math.prod(shape[1:])
        r = min(self.rank, n, m)
        return (n, m, r) if r * (n + m) < n * m else None

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        return self.encode_stateful(x, gen, {})

    def encode_stateful(self, x: Tensor, gen: torch.Generator, state: dict[str, Tensor]) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        f = self.factors(tuple(x.shape))
        if f is None:
            return {"p": x.reshape(-1).clone(), "q": torch.zeros(0), "_shape": _shape_part(x.shape)}
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"codec {self.spec}: tensor has non-finite values (inf or nan)")
        n, m, r = f
        mat = x.reshape(n, m)
        e = _residual(state, "e", mat, self.spec)
        if e is not None:
            mat = mat + e
        q = state.get("q")
        if q is None or tuple(q.shape) != (m, r):
            q = torch.randn(m, r, generator=gen, dtype=torch.float32)
        p = torch.linalg.qr(mat @ q, mode="reduced").Q
        q = mat.T @ p
        state["q"] = q
        state["e"] = mat - p @ q.T
        return {"p": p.contiguous(), "q": q.contiguous(), "_shape": _shape_part(x.shape)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"p": torch.float32, "q": torch.float32, "_shape": torch.int64}, self.spec)
        shape = _read_shape(parts, self.spec)
        want = self.leaves(shape)
        for k in ("p", "q"):
            if tuple(parts[k].shape) != want[k][0]:
                raise ValueError(f"{self.spec}: part {k!r} must have shape {want[k][0]} for shape {shape}, "
                                 f"got {tuple(parts[k].shape)}")
        if self.factors(shape) is None:
            return parts["p"].to(torch.float32).reshape(shape)
        return (parts["p"] @ parts["q"].T).reshape(shape)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        f = self.factors(tuple(shape))
        nd = (len(shape),)
        if f is None:
            return {"p": ((math.prod(shape),), torch.float32), "q": ((0,), torch.float32),
                    "_shape": (nd, torch.int64)}
        n, m, r = f
        return {"p": ((n, r), torch.float32), "q": ((m, r), torch.float32), "_shape": (nd, torch.int64)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _aux_shape(specs, read, self.spec)


def powersgd(rank: int) -> PowerSGD:
    """PowerSGD of rank ``rank`` with warm start and error feedback (see :class:`PowerSGD`)."""
    return PowerSGD(rank)
