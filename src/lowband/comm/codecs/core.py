"""The codec protocol, the stateless codecs (casts, int8, top-k, random masks, count
sketches) and chains of codecs; see :mod:`lowband.comm.codecs` for the whole picture."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Protocol, runtime_checkable

import torch
from torch import Tensor

MAX_NUMEL = 2**31 - 1
"""Largest tensor a codec accepts (int32 indices; 31-bit hashing in ``sketch``)."""

MAX_NDIM = 32
"""Most dimensions of a tensor on the wire (and of an original shape in ``_shape``)."""
MAX_SPEC_CHARS = 256
"""Longest codec spec string ``parse_codec`` accepts."""
MAX_CHAIN = 8
"""Most codecs in one chain."""
MAX_SKETCH_ROWS = 8
"""Most hash rows of a ``sketch``: decode does rows estimates per element (about 20 ns
each on one core), so this bounds its time per decoded element."""
MAX_SKETCH_COLS = 2**24
"""Most buckets per row of a ``sketch``."""

_SEED_HIGH = 2**62  # seeds travel as int64 in [0, 2**62)
_PRIME = 2**31 - 1  # Mersenne prime for the sketch's universal hashes

LeafSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]
HeaderSpecs = dict[str, tuple[tuple[int, ...], Optional[torch.dtype]]]
"""Leaves as a wire header describes them: ``{part: (shape, dtype)}``; dtype ``None`` (in
chains only) stands for a float leaf that a later codec re-encoded."""
AuxReader = Callable[[str], list[int]]
"""Reads the int64 contents of a small aux part (``_shape``) by part name."""


class ShapeLimitError(ValueError):
    """An original shape has more elements than the receiver allows (no tensor was built)."""

    def __init__(self, where: str, shape: tuple[int, ...], numel: int, limit: int) -> None:
        super().__init__(f"{where}: original shape {shape} has {numel} elements, more than "
                         f"the {limit} allowed")
        self.shape, self.numel, self.limit = shape, numel, limit


@runtime_checkable
class Codec(Protocol):
    """An encode/decode pair for one float tensor (see the module docstring)."""

    spec: str
    """Canonical spec string; ``parse_codec(spec)`` rebuilds an equal codec."""

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        """Leaves for float tensor ``x``; randomness only from ``gen``."""
        ...

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        """Float32 tensor of the original shape, from the leaves alone."""
        ...

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        """``{part: (shape, dtype)}`` that ``encode`` yields for a tensor of ``shape``."""
        ...

    def size_of(self, shape: tuple[int, ...]) -> int:
        """Encoded buffer bytes for a float tensor of ``shape``."""
        ...


class _Base:
    """Shared helpers: ``size_of`` from ``leaves``, input checks, repr."""

    spec: str = ""

    def size_of(self, shape: tuple[int, ...]) -> int:
        """Encoded bytes (buffers only, no wire header) for a float tensor of ``shape``."""
        return sum(math.prod(s) * _itemsize(d) for s, d in self.leaves(tuple(shape)).values())

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:  # pragma: no cover - abstract
        raise NotImplementedError

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        """The shape ``decode`` would return, from header entries (and ``_shape``) alone."""
        raise NotImplementedError  # pragma: no cover - abstract

    def check_leaves(self, specs: HeaderSpecs, read: AuxReader,
                     limit: Optional[int] = None) -> tuple[int, ...]:
        """See :meth:`Codec.check_leaves`; raises ValueError (:class:`ShapeLimitError` for
        the limit) with one line naming the part. Reads no buffer but ``_shape``."""
        shape = self.original_shape(specs, read)
        _check_limit(shape, limit, self.spec)
        _match_leaves(specs, self.leaves(shape), self.spec)
        return shape

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Base) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _as_float(x: Tensor, name: str) -> Tensor:
    """Detach ``x`` to a float32 CPU tensor, checking that a codec may take it."""
    if not (x.is_floating_point()):
        raise TypeError(f"codec {name} takes floating-point tensors, got {x.dtype}")
    if x.numel() > MAX_NUMEL:
        raise ValueError(f"codec {name}: tensor of {x.numel()} elements exceeds {MAX_NUMEL}")
    return x.detach().to("cpu", torch.float32)


def _draw_seed(gen: torch.Generator) -> int:
    return int(torch.randint(0, _SEED_HIGH, (1,), generator=gen))


def _shape_part(shape: tuple[int, ...]) -> Tensor:
    return torch.tensor(shape, dtype=torch.int64).reshape(len(shape))


def _valid_shape(shape: tuple[int, ...], name: str) -> tuple[int, ...]:
    if len(shape) > MAX_NDIM or any(d < 0 or d > MAX_NUMEL for d in shape) \
            or math.prod(shape) > MAX_NUMEL:
        raise ValueError(f"{name}: invalid original shape {shape} (at most {MAX_NDIM} "
                         f"non-negative dims, {MAX_NUMEL} elements)")
    return shape


def _read_shape(parts: dict[str, Tensor], name: str) -> tuple[int, ...]:
    """The original shape from the ``_shape`` aux part, validated."""
    s = parts["_shape"]
    if s.dtype != torch.int64 or s.dim() != 1 or s.numel() > MAX_NDIM:
        raise ValueError(f"{name}: _shape must be a 1-d int64 tensor of at most {MAX_NDIM} "
                         f"entries")
    return _valid_shape(tuple(int(v) for v in s.tolist()), name)


def _aux_shape(specs: HeaderSpecs, read: AuxReader, name: str) -> tuple[int, ...]:
    """The original shape from the header entry and contents of the ``_shape`` part."""
    if "_shape" not in specs:
        raise ValueError(f"{name}: missing part '_shape'")
    shape, dt = specs["_shape"]
    if dt != torch.int64 or len(shape) != 1 or shape[0] > MAX_NDIM:
        raise ValueError(f"{name}: part '_shape' must be a 1-d int64 tensor of at most "
                         f"{MAX_NDIM} entries, got {dt} of shape {tuple(shape)}")
    return _valid_shape(tuple(read("_shape")), name)


def _part_shape(specs: HeaderSpecs, part: str, name: str) -> tuple[int, ...]:
    if part not in specs:
        raise ValueError(f"{name}: missing part {part!r}, got {sorted(specs)}")
    return _valid_shape(tuple(specs[part][0]), name)


def _check_limit(shape: tuple[int, ...], limit: Optional[int], name: str) -> None:
    n = math.prod(shape)
    if limit is not None and n > limit:
        raise ShapeLimitError(name, shape, n, limit)


def check_leaves_of(codec: Any, specs: HeaderSpecs, read: AuxReader, limit: Optional[int] = None) -> tuple[int, ...]:
    """``codec.check_leaves`` where the codec has it (every built-in codec); for a plugin codec
    that implements only the basic protocol (``encode``/``decode``/``leaves``), the original
    shape is taken to be one of the header's own leaf shapes whose ``leaves(shape)`` matches
    the header exactly, so what it decodes is never larger than a buffer that is present."""
    check = getattr(codec, "check_leaves", None)
    if check is not None:
        return check(specs, read, limit)
    name = getattr(codec, "spec", type(codec).__name__)
    for shape in sorted({tuple(s) for s, _ in specs.values()}, key=lambda t: -math.prod(t)):
        try:
            _match_leaves(specs, codec.leaves(shape), name)
        except ValueError:
            continue
        _check_limit(shape, limit, name)
        return shape
    raise ValueError(f"{name}: the header's parts match no shape this codec encodes")


def _match_leaves(got: HeaderSpecs, expected: LeafSpec, name: str) -> None:
    """``got`` (from a header) must be exactly ``expected`` (from ``leaves``)."""
    if set(got) != set(expected):
        raise ValueError(f"{name}: expected parts {sorted(expected)}, got {sorted(got)}")
    for p, (shape, dt) in expected.items():
        gshape, gdt = got[p]
        if tuple(gshape) != tuple(shape):
            raise ValueError(f"{name}: part {p!r} must have shape {tuple(shape)}, got "
                             f"{tuple(gshape)}")
        if gdt is None and not dt.is_floating_point or gdt is not None and gdt != dt:
            raise ValueError(f"{name}: part {p!r} must be {dt}, got {gdt or 'coded parts'}")


def _check_seed(parts: dict[str, Tensor], name: str) -> int:
    s = parts["_seed"]
    seed = int(s.reshape(())) if s.numel() == 1 else -1
    if not 0 <= seed < _SEED_HIGH:
        raise ValueError(f"{name}: _seed must be one int64 in [0, 2**62)")
    return seed


def _check_parts(parts: dict[str, Tensor], expected: dict[str, torch.dtype], name: str) -> None:
    if set(parts) != set(expected):
        raise ValueError(f"{name}: expected parts {sorted(expected)}, got {sorted(parts)}")
    for p, dt in expected.items():
        if parts[p].dtype != dt:
            raise ValueError(f"{name}: part {p!r} must be {dt}, got {parts[p].dtype}")


# --------------------------------------------------------------------------- elementwise


class _Cast(_Base):
    """Elementwise cast to a float dtype (fp32 identity, fp16, bf16)."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.spec = name
        self.dtype = dtype

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        return {"": _as_float(x, self.spec).to(self.dtype)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        # Any float dtype is accepted: a later codec in a chain hands back float32.
        if set(parts) != {""} or not parts[""].is_floating_point():
            raise ValueError(f"{self.spec}: expected one floating part '', got {sorted(parts)}")
        return parts[""].to(torch.float32)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        return {"": (tuple(shape), self.dtype)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _part_shape(specs, "", self.spec)


def fp32() -> _Cast:
    """Identity: float32 values (other float dtypes are cast to float32)."""
    return _Cast("fp32", torch.float32)


def fp16() -> _Cast:
    """IEEE half precision, round to nearest (values beyond +-65504 become inf)."""
    return _Cast("fp16", torch.float16)


def bf16() -> _Cast:
    """bfloat16, round to nearest: float32's range, 8 bits of mantissa."""
    return _Cast("bf16", torch.bfloat16)


class Int8(_Base):
    """Per-tensor symmetric int8 with stochastic rounding (unbiased).

    ``scale = max|x| / 127`` travels as a float32 aux part; ``q = floor(x/scale + u)``
    with ``u ~ U[0, 1)`` from the generator, so ``E[q * scale] = x`` and
    ``|q * scale - x| < scale`` per element.
    """

    spec = "int8"

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        if x.numel() == 0:
            return {"q": torch.zeros(x.shape, dtype=torch.int8), "_scale": torch.zeros(())}
        amax = x.abs().max()
        if not torch.isfinite(amax):
            raise ValueError("codec int8: tensor has non-finite values (inf or nan)")
        scale = (amax / 127.0).to(torch.float32)
        if float(scale) == 0.0:
            return {"q": torch.zeros(x.shape, dtype=torch.int8), "_scale": scale}
        u = torch.rand(x.shape, generator=gen, dtype=torch.float32)
        q = torch.floor(x / scale + u).clamp_(-127, 127).to(torch.int8)
        return {"q": q, "_scale": scale}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"q": torch.int8, "_scale": torch.float32}, self.spec)
        if parts["_scale"].numel() != 1:
            raise ValueError("int8: _scale must be a scalar")
        scale = parts["_scale"].reshape(())
        s = float(scale)
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"int8: _scale must be finite and >= 0, got {s}")
        return parts["q"].to(torch.float32).mul_(scale)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        return {"q": (tuple(shape), torch.int8), "_scale": ((), torch.float32)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _part_shape(specs, "q", self.spec)


def int8() -> Int8:
    """Per-tensor symmetric int8, stochastic rounding (see :class:`Int8`)."""
    return Int8()


# --------------------------------------------------------------------------- sparsifiers


def _fmt_num(v: float | int) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


class TopK(_Base):
    """Keep the ``k`` entries of largest magnitude: int32 indices + float32 values.

    ``k`` is an integer count (``topk(1000)``, capped at the tensor's size) or a fraction
    of the tensor's size (``topk(0.01)``: ``k = ceil(frac * numel)``, at least 1). The
    original shape travels as the aux part ``_shape``; decode scatters the values into
    zeros. Indices are sent in increasing order.
    """

    def __init__(self, k: float | int) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ValueError(f"topk: k must be an int count or a float fraction, got {k!r}")
        if isinstance(k, int):
            if not 1 <= k <= MAX_NUMEL:
                raise ValueError(f"topk: count must be in 1..{MAX_NUMEL}, got {k}")
        elif not (0.0 < k <= 1.0):
            raise ValueError(f"topk: fraction must be in (0, 1], got {k} (use an int for a count)")
        self.k = k
        self.spec = f"topk({_fmt_num(k)})"

    def k_for(self, numel: int) -> int:
        """Number of kept entries for a tensor of ``numel`` elements."""
        if numel == 0:
            return 0
        if isinstance(self.k, int):
            return min(self.k, numel)
        return min(numel, max(1, math.ceil(self.k * numel)))

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        flat = x.reshape(-1)
        k = self.k_for(flat.numel())
        if k == flat.numel():
            idx = torch.arange(k, dtype=torch.int64)
        else:
            idx = torch.topk(flat.abs(), k, sorted=False).indices
            idx, _ = torch.sort(idx)
        return {"idx": idx.to(torch.int32), "val": flat[idx], "_shape": _shape_part(x.shape)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"idx": torch.int32, "val": torch.float32, "_shape": torch.int64},
                     self.spec)
        shape = _read_shape(parts, self.spec)
        n = math.prod(shape)
        idx, val = parts["idx"].reshape(-1), parts["val"].reshape(-1)  # int32 indexes directly
        k = idx.numel()
        if k != self.k_for(n) or val.numel() != k:
            raise ValueError(f"{self.spec}: expected {self.k_for(n)} indices and values for "
                             f"shape {shape}, got {k} and {val.numel()}")
        if k:
            a = idx.numpy()  # numpy: cheaper than torch for these small checks
            if k > 1 and not (a[1:] > a[:-1]).all():
                raise ValueError(f"{self.spec}: indices must be strictly increasing")
            if int(a[0]) < 0 or int(a[-1]) >= n:  # increasing: the ends bound the rest
                raise ValueError(f"{self.spec}: index out of range for shape {shape}")
        out = torch.zeros(n, dtype=torch.float32)
        out[idx] = val
        return out.reshape(shape)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        k = self.k_for(math.prod(shape))
        return {"idx": ((k,), torch.int32), "val": ((k,), torch.float32),
                "_shape": ((len(shape),), torch.int64)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _aux_shape(specs, read, self.spec)


def topk(k: float | int) -> TopK:
    """Top-k by magnitude; ``k`` an int count or a float fraction (see :class:`TopK`)."""
    return TopK(k)


def _seeded_gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


class RandMask(_Base):
    """Random subset of ``ceil(frac * numel)`` coordinates; only the values travel.

    The subset is drawn from a seed (taken from the link's generator) that travels as
    the int64 aux scalar ``_seed``; the receiver regenerates the same indices from it.
    With ``scale=True`` the values are multiplied by ``numel / k`` so that the decoded
    tensor is an unbiased estimate of the input.
    """

    def __init__(self, frac: float, scale: bool = False) -> None:
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0:
            raise ValueError(f"randmask: fraction must be in (0, 1], got {frac!r}")
        self.frac = float(frac)
        self.scale = bool(scale)
        self.spec = f"randmask({self.frac!r}" + (",scale=true)" if self.scale else ")")

    def k_for(self, numel: int) -> int:
        """Number of kept coordinates for a tensor of ``numel`` elements."""
        return 0 if numel == 0 else min(numel, max(1, math.ceil(self.frac * numel)))

    def _mask(self, seed: int, n: int) -> Tensor:
        """Boolean mask of the kept coordinates (``x[mask]`` lists them in index order).

        The permutation is drawn as int32 (the same permutation as int64 for the same
        seed, half the memory) and no sort is needed: decode's working memory is 5 bytes
        per element beside its float32 output."""
        k = self.k_for(n)
        if k == n:
            return torch.ones(n, dtype=torch.bool)
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.randperm(n, generator=_seeded_gen(seed), dtype=torch.int32)[:k]] = True
        return mask

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        flat = x.reshape(-1)
        seed = _draw_seed(gen)
        val = flat[self._mask(seed, flat.numel())]
        if self.scale and val.numel():
            val = val * (flat.numel() / val.numel())
        return {"val": val, "_seed": torch.tensor(seed, dtype=torch.int64),
                "_shape": _shape_part(x.shape)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"val": torch.float32, "_seed": torch.int64, "_shape": torch.int64},
                     self.spec)
        shape = _read_shape(parts, self.spec)
        n = math.prod(shape)
        val = parts["val"].reshape(-1)
        if val.numel() != self.k_for(n) or parts["_seed"].numel() != 1:
            raise ValueError(f"{self.spec}: expected {self.k_for(n)} values and one seed for "
                             f"shape {shape}, got {val.numel()} values")
        seed = _check_seed(parts, self.spec)
        out = torch.zeros(n, dtype=torch.float32)
        out[self._mask(seed, n)] = val
        return out.reshape(shape)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        k = self.k_for(math.prod(shape))
        return {"val": ((k,), torch.float32), "_seed": ((), torch.int64),
                "_shape": ((len(shape),), torch.int64)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _aux_shape(specs, read, self.spec)


def randmask(frac: float, scale: bool = False) -> RandMask:
    """Seeded random coordinate subset (see :class:`RandMask`)."""
    return RandMask(frac, scale)


class Sketch(_Base):
    """Count sketch of the flattened tensor: a ``rows x cols`` float32 table.

    Row ``r`` adds ``s_r(i) * x_i`` into bucket ``h_r(i)``, with 2-universal hashes
    ``((a i + b) mod p) mod cols`` and sign from ``((c i + d) mod p)``'s parity
    (``p = 2**31 - 1``). The hash coefficients come from a seed that travels as the aux
    part ``_seed``. Decode is the median over rows of ``s_r(i) * table[r, h_r(i)]``
    (the mean of the two middle values for an even number of rows): exact for a
    coordinate that no other non-zero coordinate collides with in most rows.
    """

    _CHUNK = 1 << 20
    _DECODE_WORK = 1 << 15  # row estimates per decode chunk: bounds decode's working memory

    def __init__(self, rows: int, cols: int) -> None:
        for nm, v, hi in (("rows", rows, MAX_SKETCH_ROWS), ("cols", cols, MAX_SKETCH_COLS)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ValueError(f"sketch: {nm} must be an int in 1..{hi}, got {v!r}")
        self.rows, self.cols = rows, cols
        self.spec = f"sketch({rows},{cols})"

    def _coeffs(self, seed: int) -> Tensor:
        return torch.randint(1, _PRIME, (self.rows, 4), generator=_seeded_gen(seed))

    def _hash(self, coeffs: Tensor, r: int, i: Tensor) -> tuple[Tensor, Tensor]:
        a, b, c, d = (int(v) for v in coeffs[r])
        h = ((a * i + b) % _PRIME) % self.cols
        s = 1.0 - 2.0 * (((c * i + d) % _PRIME) & 1).to(torch.float32)
        return h, s

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        x = _as_float(x, self.spec)
        flat = x.reshape(-1).to(torch.float64)
        seed = _draw_seed(gen)
        coeffs = self._coeffs(seed)
        table = torch.zeros(self.rows, self.cols, dtype=torch.float64)
        for lo in range(0, flat.numel(), self._CHUNK):
            i = torch.arange(lo, min(lo + self._CHUNK, flat.numel()), dtype=torch.int64)
            for r in range(self.rows):
                h, s = self._hash(coeffs, r, i)
                table[r].index_add_(0, h, s.to(torch.float64) * flat[i])
        return {"table": table.to(torch.float32), "_seed": torch.tensor(seed, dtype=torch.int64),
                "_shape": _shape_part(x.shape)}

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        _check_parts(parts, {"table": torch.float32, "_seed": torch.int64,
                             "_shape": torch.int64}, self.spec)
        shape = _read_shape(parts, self.spec)
        table = parts["table"]
        if tuple(table.shape) != (self.rows, self.cols) or parts["_seed"].numel() != 1:
            raise ValueError(f"{self.spec}: table must be {self.rows}x{self.cols}, "
                             f"got {tuple(table.shape)}")
        coeffs = self._coeffs(_check_seed(parts, self.spec))
        a, b, c, d = (coeffs[:, j:j + 1] for j in range(4))  # (rows, 1) each
        n = math.prod(shape)
        out = torch.empty(n, dtype=torch.float32)
        lo_mid, hi_mid = (self.rows - 1) // 2, self.rows // 2
        # all rows at once, in chunks of _DECODE_WORK row estimates: the same arithmetic
        # as _hash (bit-identical results), working memory about 32 bytes per estimate
        chunk = max(1, self._DECODE_WORK // self.rows)
        for lo in range(0, n, chunk):
            i = torch.arange(lo, min(lo + chunk, n), dtype=torch.int64)
            h = (a * i).add_(b).remainder_(_PRIME).remainder_(self.cols)
            est = torch.gather(table, 1, h)  # (rows, m)
            del h
            bit = (c * i).add_(d).remainder_(_PRIME).bitwise_and_(1)
            est.mul_(bit.to(torch.float32).mul_(-2.0).add_(1.0))
            del bit
            srt = torch.sort(est, dim=0).values
            out[lo:lo + i.numel()] = 0.5 * (srt[lo_mid] + srt[hi_mid])
        return out.reshape(shape)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        return {"table": ((self.rows, self.cols), torch.float32), "_seed": ((), torch.int64),
                "_shape": ((len(shape),), torch.int64)}

    def original_shape(self, specs: HeaderSpecs, read: AuxReader) -> tuple[int, ...]:
        return _aux_shape(specs, read, self.spec)


def sketch(rows: int, cols: int) -> Sketch:
    """Count sketch with ``rows`` hash rows of ``cols`` buckets (see :class:`Sketch`)."""
    return Sketch(rows, cols)


# --------------------------------------------------------------------------- chain


def _join(prefix: str, part: str) -> str:
    return prefix if part == "" else f"{prefix}/{part}"


def _split(leaf: str) -> tuple[str, str]:
    head, sep, rest = leaf.partition("/")
    return head, rest


class Chain(_Base):
    """``chain(a, b, ...)``: ``a``, then ``chain(b, ...)`` on each non-aux float leaf of ``a``."""

    def __init__(self, *codecs: Codec) -> None:
        flat: list[Codec] = []
        for c in codecs:
            flat.extend(c.codecs if isinstance(c, Chain) else [c])
        if len(flat) < 2:
            raise ValueError("chain needs at least two codecs")
        if len(flat) > MAX_CHAIN:
            raise ValueError(f"chain of {len(flat)} codecs; the limit is {MAX_CHAIN}")
        if any(getattr(c, "receiver_state", False) for c in flat):
            raise ValueError("ef21 must be the whole codec (its receiver adds its estimate to what the whole "
                             "spec decodes): wrap the chain instead, e.g. ef21(topk(0.01)+fp16)")
        self.codecs = tuple(flat)
        self.head = flat[0]
        self.rest: Codec = flat[1] if len(flat) == 2 else Chain(*flat[1:])
        self.spec = "+".join(c.spec for c in flat)
        self.stateful = any(is_stateful(c) for c in flat)

    @staticmethod
    def _passes(name: str, t_is_float: bool) -> bool:
        """Whether a head leaf goes through the rest of the chain."""
        return not name.startswith("_") and t_is_float

    def encode(self, x: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, t in self.head.encode(x, gen).items():
            if "/" in name:
                raise ValueError(f"codec {self.head.spec}: part name {name!r} contains '/'")
            if not self._passes(name, t.is_floating_point()):
                out[name] = t
                continue
            for part, s in self.rest.encode(t, gen).items():
                if part == "" and not s.is_floating_point():
                    raise ValueError(f"codec {self.rest.spec}: part '' must be floating")
                out[_join(name, part)] = s
        return out

    def encode_stateful(self, x: Tensor, gen: torch.Generator, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """:meth:`encode` with each stateful member keeping its state in ``state`` under
        a prefix: ``"<"`` for the head, ``"<leaf>>"`` for the rest applied to a head leaf."""
        out: dict[str, Tensor] = {}
        for name, t in _encode_in(self.head, x, gen, state, "<").items():
            if "/" in name:
                raise ValueError(f"codec {self.head.spec}: part name {name!r} contains '/'")
            if not self._passes(name, t.is_floating_point()):
                out[name] = t
                continue
            for part, s in _encode_in(self.rest, t, gen, state, f"{name}>").items():
                if part == "" and not s.is_floating_point():
                    raise ValueError(f"codec {self.rest.spec}: part '' must be floating")
                out[_join(name, part)] = s
        return out

    def decode(self, parts: dict[str, Tensor]) -> Tensor:
        groups: dict[str, dict[str, Tensor]] = {}
        for leaf, t in parts.items():
            head, rest = _split(leaf)
            groups.setdefault(head, {})[rest] = t
        head_parts: dict[str, Tensor] = {}
        for name, sub in groups.items():
            if set(sub) == {""} and not self._passes(name, sub[""].is_floating_point()):
                head_parts[name] = sub[""]
            elif name.startswith("_"):
                raise ValueError(f"{self.spec}: aux part {name!r} has sub-parts")
            else:
                head_parts[name] = self.rest.decode(sub)
        return self.head.decode(head_parts)

    def check_leaves(self, specs: HeaderSpecs, read: AuxReader,
                     limit: Optional[int] = None) -> tuple[int, ...]:
        """Like :meth:`_Base.check_leaves`, mirroring :meth:`decode`: each head leaf that
        the rest of the chain re-encoded is checked by the rest first (its shape must then
        be what the head's ``leaves`` say), then the head's leaves are checked."""
        groups: dict[str, HeaderSpecs] = {}
        for leaf, spec in specs.items():
            head, rest = _split(leaf)
            groups.setdefault(head, {})[rest] = spec
        head_specs: HeaderSpecs = {}
        for name, sub in groups.items():
            if set(sub) == {""}:
                dt = sub[""][1]
                if not self._passes(name, dt is None or dt.is_floating_point):
                    head_specs[name] = sub[""]
                    continue
            if name.startswith("_"):
                raise ValueError(f"{self.spec}: aux part {name!r} has sub-parts")

            def sub_read(part: str, _name: str = name) -> list[int]:
                return read(_join(_name, part))

            # the head's leaf is rebuilt by the rest before the head decodes: a transient
            # tensor, held to the same limit (a sketch table can outgrow its input)
            head_specs[name] = (self.rest.check_leaves(sub, sub_read, limit), None)
        return self.head.check_leaves(head_specs, read, limit)

    def leaves(self, shape: tuple[int, ...]) -> LeafSpec:
        out: LeafSpec = {}
        for name, (s, dt) in self.head.leaves(tuple(shape)).items():
            if not self._passes(name, dt.is_floating_point):
                out[name] = (s, dt)
                continue
            for part, spec in self.rest.leaves(s).items():
                out[_join(name, part)] = spec
        return out


def is_stateful(codec: Any) -> bool:
    """Whether ``codec`` keeps sender state between messages (``ef``, ``powersgd``, a
    chain holding one): such a codec must be driven by :func:`encode_with_state`."""
    return bool(getattr(codec, "stateful", False))


def encode_with_state(codec: Codec, x: Tensor, gen: torch.Generator,
                      state: Optional[dict[str, Tensor]]) -> dict[str, Tensor]:
    """``codec.encode`` for a stateless codec (or no ``state``), else
    ``codec.encode_stateful(x, gen, state)`` (which updates ``state``)."""
    if state is None or not is_stateful(codec):
        return codec.encode(x, gen)
    return codec.encode_stateful(x, gen, state)  # type: ignore[attr-defined]


def _encode_in(codec: Codec, x: Tensor, gen: torch.Generator, state: dict[str, Tensor],
               prefix: str) -> dict[str, Tensor]:
    """Encode with ``codec``, keeping its state in ``state``'s entries under ``prefix``."""
    if not is_stateful(codec):
        return codec.encode(x, gen)
    sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    parts = codec.encode_stateful(x, gen, sub)  # type: ignore[attr-defined]
    for k in [k for k in state if k.startswith(prefix)]:
        del state[k]
    state.update({prefix + k: v for k, v in sub.items()})
    return parts


def chain(*codecs: Codec) -> Codec:
    """Compose codecs left to right; ``chain(c)`` is ``c`` (see :class:`Chain`)."""
    if len(codecs) == 1:
        return codecs[0]
    return Chain(*codecs)
