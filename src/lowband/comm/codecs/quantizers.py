"""Bit-level quantisers: QSGD (``qsgd(s)``) and scaled sign (``sign``).

Both are stateless codecs of :mod:`lowband.comm.codecs` whose payload is a ``uint8``
leaf of packed bits (``bits``), so the bytes counted are the bits produced, rounded up
to a byte per tensor. Codes are fixed-width (the width depends on the codec's
parameters only), so a tensor's leaves depend on its shape only, as the wire decoder
requires (:meth:`~lowband.comm.codecs.Codec.check_leaves`). The ``bits`` leaf is not a
float, so a chain after these codecs leaves it alone (``qsgd(4)+fp16`` = ``qsgd(4)``).

Packing: entry ``i``'s ``w``-bit code occupies bits ``i*w .. i*w+w-1`` of the
little-endian bit stream (``numpy.packbits(..., bitorder="little")``); the padding bits of
the last byte are zero, and the decoder refuses any other value (one encoding per
message). Packing and unpacking run in chunks of :data:`_CHUNK` entries, so working
memory is about ``w`` bytes per entry of one chunk beside the float32 output.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .core import (
    AuxReader,
    HeaderSpecs,
    LeafSpec,
    _as_float,
    _aux_shape,
    _Base,
    _check_parts,
    _read_shape,
    _shape_part,
)

MAX_QSGD_LEVELS = 2**15
"""Most levels ``s`` of ``qsgd(s)`` (codes of at most 17 bits)."""
_CHUNK = 1 << 18  # entries per pack/unpack chunk (a multiple of 8: chunks are byte-aligned)


def pack_codes(codes: np.ndarray, width: int) -> np.ndarray:
    """``codes`` (non-negative ints below ``2**width``) as a little-endian bit stream of
    ``ceil(len * width / 8)`` bytes, zero-padded."""
    n = codes.size
    out = np.zeros(math.ceil(n * width / 8), dtype=np.uint8)
    shifts = np.arange(width, dtype=np.uint32)
    for lo in range(0, n, _CHUNK):
        c = codes[lo:lo + _CHUNK].astype(np.uint32)
        bits = ((c[:, None] >> shifts) & 1).astype(np.uint8).reshape(-1)
        packed = np.packbits(bits, bitorder="little")
        at = lo * width // 8  # lo is a multiple of 8: the chunk starts on a byte
        out[at:at + packed.size] = packed
    return out


def unpack_codes(data: np.ndarray, n: int, width: int) -> np.ndarray:
    """The ``n`` ``width``-bit codes (``width <= 30``) of :func:`pack_codes`' output ``data`` (int32);
    ValueError if ``data`` has the wrong length or non-zero padding bits."""
    if data.size != math.ceil(n * width / 8):
        raise ValueError(f"expected {math.ceil(n * width / 8)} bytes of {width}-bit codes for {n} entries, "
                         f"got {data.size}")
    pad = data.size * 8 - n * width
    if pad and int(data[-1]) >> (8 - pad):
        raise ValueError("non-zero padding bits after the last code")
    out = np.empty(n, dtype=np.int32)
    weights = (1 << np.arange(width, dtype=np.int32))
    for lo in range(0, n, _CHUNK):
        m = min(_CHUNK, n - lo)
        at = lo * width // 8
        chunk = data[at:at + math.ceil(m * width / 8)]
        bits = np.unpackbits(chunk, bitorder="little", count=m * width).reshape(m, width)
        out[lo:lo + m] = bits.astype(np.int32) @ weights
    return out


def _norm_up(v: Tensor) -> Tensor:
    """float64 norms as float32, rounded up (so ``|x_i| <= norm`` holds after rounding)."""
    f = v.to(torch.float32)
    low = f.to(torch.float64) < v
    return torch.where(low, torch.nextafter(f, torch.tensor(float("inf"))), f)


class QSGD(_Base):
    """QSGD (Alistarh et al., NeurIPS 2017): ``s`` levels, stochastic rounding, unbiased.

    Per bucket of ``bucket`` consecutive entries of the flattened tensor (``bucket=0``,
    the default: the whole tensor, as in the paper's Lemma 3.1) the L2 norm travels as a
    float32 (``_norm``, rounded up so that every ``|x_i| / norm <= 1``). Each entry becomes
    ``sign(x_i) * l_i`` with ``l_i = floor(s |x_i| / norm + u_i)``, ``u_i ~ U[0, 1)`` from
    the link's generator, so ``E[l_i] = s |x_i| / norm`` and the decoded
    ``norm * sign * l_i / s`` is unbiased. The ``2s + 1`` codes ``l_i * sign + s`` are
    packed at ``ceil(log2(2s + 1))`` bits each (2 bits for ``s = 1``, 4 for ``s = 4`` or
    ``s = 7``, 8 for ``s = 127``): ``ceil(n * width / 8)`` bytes, plus ``4`` per bucket
    and ``8`` per dimension (``_shape``). Fixed-width codes rather than the paper's Elias
    code: a tensor's size then depends on its shape only (what the wire decoder checks
    before it allocates); Elias coding saves more only when most levels are zero.
    """

    def __init__(self, s: int, bucket: int = 0) -> None:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_QSGD_LEVELS:
            raise ValueError(f"qsgd: s (levels) must be an int in 1..{MAX_QSGD_LEVELS}, got {s!r}")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
            raise ValueError(f"qsgd: bucket must be an int >= 0 (0: one bucket per tensor), got {bucket!r}")
        self.s, self.bucket = s, bucket
        self.width = (2 * s).bit_length()
        self.spec = f"qsgd({s})" if bucket == 0 else f"qsgd({s},bucket={bucket})"

    def buckets(self, n: int) -> int:
        """Number of norms sent for a tensor of ``n`` entries."""
        if n == 0:
            return 0
        return 1 if self.bucket == 0 else math.ceil(n / self.bucket)

    def _size(self, n: int) -> int:
        return n if self.bucket == 0 else self.bucket

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        flat = x.reshape(-1)
        n, nb = flat.numel(), self.buckets(flat.numel())
        if not bool(torch.isfinite(flat).all()):
            raise ValueError("codec qsgd: tensor has non-finite values (inf or nan)")
        size = self._size(n)
        padded = torch.zeros(nb * size, dtype=torch.float64)
        padded[:n] = flat.to(torch.float64)
        norms = _norm_up(padded.reshape(nb, size).norm(dim=1)) if nb else torch.zeros(0)
        per = norms.to(torch.float64).repeat_interleave(size)[:n] if nb else torch.zeros(0, dtype=torch.float64)
        ratio = torch.where(per > 0, flat.abs().to(torch.float64) / torch.where(per > 0, per, 1.0),
                            torch.zeros((), dtype=torch.float64))
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        level = torch.floor(ratio * self.s + u).clamp_(0, self.s).to(torch.int64)
        codes = torch.sign(flat).to(torch.int64) * level + self.s
        bits = pack_codes(codes.numpy(), self.width)
        return {"bits": torch.from_numpy(bits), "_norm": norms.to(torch.float32),
                "_shape": _shape_part(x.shape)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"bits": torch.uint8, "_norm": torch.float32, "_shape": torch.int64}, self.spec)
        shape = _read_shape(parts, self.spec)
        n, nb = math.prod(shape), self.buckets(math.prod(shape))
        norms = parts["_norm"].reshape(-1)
        if norms.numel() != nb:
            raise ValueError(f"{self.spec}: expected {nb} norms for shape {shape}, got {norms.numel()}")
        if nb and not (bool(torch.isfinite(norms).all()) and float(norms.min()) >= 0):
            raise ValueError(f"{self.spec}: _norm must be finite and >= 0")
        codes = unpack_codes(parts["bits"].reshape(-1).numpy(), n, self.width)
        if n and int(codes.max()) > 2 * self.s:
            raise ValueError(f"{self.spec}: a code exceeds {2 * self.s} (levels -s..s)")
        codes -= self.s
        out = torch.from_numpy(codes).to(torch.float32)
        per = (norms / self.s).repeat_interleave(self._size(n))[:n] if nb else torch.zeros(0)
        return out.mul_(per).reshape(shape)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        n = math.prod(shape)
        return {"bits": ((math.ceil(n * self.width / 8),), torch.uint8),
                "_norm": ((self.buckets(n),), torch.float32), "_shape": ((len(shape),), torch.int64)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _aux_shape(specs, read, self.spec)


def qsgd(s: int, bucket: int = 0) -> QSGD:
    """QSGD with ``s`` levels (see :class:`QSGD`)."""
    return QSGD(s, bucket)


class Sign(_Base):
    """Scaled sign (signSGD with a scale; EF-signSGD, Karimireddy et al. 2019): one bit
    per entry (1 for ``x_i >= 0``) and one float32 ``_scale = mean |x|``; decode is
    ``scale * (+1 or -1)``. ``ceil(n / 8) + 4`` bytes per tensor, plus ``8`` per dimension
    (``_shape``). Biased (the sign of a mean is not the mean of signs): wrap it in ``ef()``
    to carry what it loses, as EF-signSGD does."""

    spec = "sign"

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        flat = x.reshape(-1)
        if not bool(torch.isfinite(flat).all()):
            raise ValueError("codec sign: tensor has non-finite values (inf or nan)")
        scale = flat.abs().to(torch.float64).mean().to(torch.float32) if flat.numel() else torch.zeros(())
        bits = np.packbits((flat >= 0).numpy(), bitorder="little")
        return {"bits": torch.from_numpy(bits), "_scale": scale.reshape(()), "_shape": _shape_part(x.shape)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"bits": torch.uint8, "_scale": torch.float32, "_shape": torch.int64}, self.spec)
        shape = _read_shape(parts, self.spec)
        n = math.prod(shape)
        if parts["_scale"].numel() != 1:
            raise ValueError("sign: _scale must be a scalar")
        s = float(parts["_scale"].reshape(()))
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"sign: _scale must be finite and >= 0, got {s}")
        bits = unpack_codes(parts["bits"].reshape(-1).numpy(), n, 1)
        out = torch.from_numpy(bits).to(torch.float32).mul_(2.0).sub_(1.0)
        return out.mul_(parts["_scale"].reshape(())).reshape(shape)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        return {"bits": ((math.ceil(math.prod(shape) / 8),), torch.uint8), "_scale": ((), torch.float32),
                "_shape": ((len(shape),), torch.int64)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _aux_shape(specs, read, self.spec)


def sign() -> Sign:
    """Scaled sign: 1 bit per entry + a float32 mean |x| (see :class:`Sign`)."""
    return Sign()
