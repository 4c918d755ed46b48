"""The wire format: a :class:`~lowband.comm.message.Message` as ``bytes`` and back.

Every message really becomes bytes (design rule 2); the ledger counts ``len(bytes)``.
Never pickle: the format is a small binary header followed by raw buffers, so any
receiver can check and decode it, and its size is exactly what a real link would carry.

Layout (all integers little-endian; ``str`` = u16 byte length + UTF-8 bytes)::

    magic      4 bytes  b"LBW1"
    version    u8       1
    kind       str      message kind ("weights", "jacobian", ...)
    codec      str      canonical codec spec ("topk(0.01)+fp16"): decodable without config
    meta       u32 length + compact JSON object (sorted keys)
    n_tensors  u32
      per tensor:
        name      str     e.g. "fc1.weight"
        form      u8      0 = raw (integer/bool tensors, sent as their own dtype)
                          1 = coded (float tensors, passed through the codec)
        n_leaves  u16     raw: 1; coded: the codec's parts
          per leaf:
            part   str    "" for the tensor itself, else "idx", "val/q", "_scale", ...
                          (the leaf's full name is "fc1.weight/idx")
            dtype  u8     code from DTYPE_CODES
            ndim   u8     at most 32
            dims   u32 x ndim
    n_declared u32
      per declared tensor (counted, never built; no buffer):
        name str, dtype u8, ndim u8 (at most 32), dims u64 x ndim (at most 2**62 bytes)
    buffers    every leaf's elements, C order, little-endian, in header order, unpadded;
               the message ends exactly at the last buffer byte.

Float tensors arrive as float32 of their original shape (whatever survived the codec);
integer and bool tensors arrive bit-identical. Malformed input of any kind raises
:class:`WireError` with one line saying what was wrong and at which byte offset.

**Hostile bytes cost no more than the receiver's budget** (design rule 8). The receiver
passes a :class:`DecodeBudget` (elements, bytes, metadata size and depth, tensor count;
:data:`DEFAULT_BUDGET` when it passes none, :meth:`DecodeBudget.for_elements` to derive
one from the model it expects). The decoder reads the whole header first and checks,
before it allocates anything:

- every leaf's dims (at most 32, each within the element budget) and that the buffers
  the header promises are exactly the bytes present;
- raw leaves hold integers or bools only; a coded tensor's leaves are *exactly* those its
  codec produces for its original shape (part names, dtypes, shapes; see
  :meth:`~lowband.comm.codecs.Codec.check_leaves`), the original shape being read from
  the header or the small ``_shape`` part; so a flipped form or dtype byte, or a
  ``_shape`` that claims more than the leaves carry, is refused;
- the decoded elements of all tensors (the original shapes, not the buffer sizes: a
  96-byte top-k message may claim 2**31 elements) against ``max_elements``;
- metadata with :func:`~lowband.comm.meta.parse_meta` (length, depth, number sizes,
  finite numbers, the schema of known keys such as ``num_examples``).

Only then are buffers copied and codecs decoded; codecs still check contents (index
ranges and order, seeds, scales). A decode then allocates at most about
``2 * budget.nbytes`` and takes time linear in the budget (a sketch: rows x elements).
There is no checksum: the link (TCP/TLS) protects integrity; the decoder bounds cost and
structure.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import NamedTuple, Optional

import numpy as np
import torch

from .codecs import (
    MAX_NDIM,
    MAX_SPEC_CHARS,
    Codec,
    ShapeLimitError,
    check_leaves_of,
    encode_with_state,
    is_stateful,
    parse_codec,
)
from .message import DeclaredTensor, Message
from .meta import MetaError, parse_meta

MAGIC = b"LBW1"
VERSION = 1


class WireError(ValueError):
    """A message could not be encoded or decoded (malformed, truncated, unknown codec...)."""


_DTYPES: list[tuple[int, torch.dtype]] = [
    (1, torch.float32), (2, torch.float64), (3, torch.float16), (4, torch.bfloat16),
    (5, torch.int8), (6, torch.uint8), (7, torch.int16), (8, torch.int32), (9, torch.int64),
    (10, torch.bool), (11, torch.complex64), (12, torch.complex128),
]
for _code, _name in ((13, "uint16"), (14, "uint32"), (15, "uint64")):
    if hasattr(torch, _name):
        _DTYPES.append((_code, getattr(torch, _name)))

DTYPE_CODES: dict[torch.dtype, int] = {dt: code for code, dt in _DTYPES}
"""Wire code of each supported dtype (code 0 is never used)."""
_CODE_DTYPES: dict[int, torch.dtype] = {code: dt for code, dt in _DTYPES}
_ITEMSIZE: dict[int, int] = {c: torch.empty((), dtype=dt).element_size() for c, dt in _DTYPES}

_FORM_RAW, _FORM_CODED = 0, 1
_U8, _U16, _U32, _FORM = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<BH")
_MAX_DIM = 2**32 - 1
MAX_DECLARED_BYTES = 2**62
"""Most bytes one message may declare (counted, never built): keeps the ledger's
arithmetic sane whatever a header claims."""
# raw (uncoded) leaves: integer and bool dtypes only; floats always go through the codec
_RAW_CODES = frozenset(c for c, dt in _DTYPES if not dt.is_floating_point and not dt.is_complex)

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("lowband's wire format needs a little-endian host")


@lru_cache(maxsize=256)
def codec_from_spec(spec: str) -> Codec:
    """Parsed codec for ``spec`` (cached: parsing happens once per spec string)."""
    return parse_codec(spec)


# --------------------------------------------------------------------------- encode


def _str(s: str, what: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 0xFFFF:
        raise WireError(f"{what} is {len(b)} bytes of UTF-8; the limit is 65535")
    return _U16.pack(len(b)) + b


def _dtype_code(dt: torch.dtype, what: str) -> int:
    try:
        return DTYPE_CODES[dt]
    except KeyError:
        raise WireError(f"{what}: dtype {dt} cannot travel on the wire") from None


def _leaf_header(part: str, t: torch.Tensor, what: str) -> bytes:
    if t.dim() > MAX_NDIM or any(d > _MAX_DIM for d in t.shape):
        raise WireError(f"{what}: shape {tuple(t.shape)} does not fit the wire header")
    return (_str(part, f"{what} part name")
            + struct.pack(f"<BB{t.dim()}I", _dtype_code(t.dtype, what), t.dim(), *t.shape))


def _buffer(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order, without a copy where possible."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return memoryview(t.view(torch.uint8).numpy())


def _meta_json(meta: dict) -> bytes:
    clean: dict = {}
    for k, v in meta.items():
        if isinstance(v, np.generic):
            v = v.item()
        if not isinstance(k, str) or not (v is None or isinstance(v, (bool, int, float, str))):
            raise WireError(f"meta[{k!r}] must be int, float, str, bool or None under a str key, "
                            f"got {type(v).__name__}")
        clean[k] = v
    return json.dumps(clean, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _tensor_gen(base: int, name: str) -> torch.Generator:
    from ..seeding import torch_gen

    return torch_gen(base, "tensor", name)


def encode_message(msg: Message, codec: Codec, gen: torch.Generator,
                   state: Optional[dict[str, dict[str, torch.Tensor]]] = None) -> bytes:
    """``msg`` as bytes; float tensors go through ``codec`` (see the module docstring).

    One seed is drawn from ``gen`` and each tensor's codec randomness is derived from it
    and the tensor's name, so it does not depend on the order of ``msg.tensors``.

    ``state``: the sender's codec state for this link, ``{tensor name: codec state}``,
    used and updated by a stateful codec (``ef``, ``powersgd``); it is updated only when
    the whole message encodes (a refused message leaves it as it was). Without it a
    stateful codec encodes statelessly (zero residual, fresh warm start).
    """
    stateful = state is not None and is_stateful(codec)
    new_state: dict[str, dict[str, torch.Tensor]] = {}
    head = [MAGIC, bytes([VERSION]), _str(msg.kind, "kind"), _str(codec.spec, "codec spec")]
    meta = _meta_json(msg.meta)
    head += [_U32.pack(len(meta)), meta, _U32.pack(len(msg.tensors))]
    bufs: list[memoryview] = []
    base = int(torch.randint(0, 2**62, (1,), generator=gen))
    for name, t in msg.tensors.items():
        if not isinstance(t, torch.Tensor):
            raise WireError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        what = f"tensor {name!r}"
        t = t.detach().cpu()  # encoded on the CPU: the same bytes (and codec state) on every device
        if t.is_floating_point():
            try:
                if stateful:
                    st = dict(state.get(name, {}))  # type: ignore[union-attr]
                    parts = encode_with_state(codec, t, _tensor_gen(base, name), st)
                    new_state[name] = st
                else:
                    parts = codec.encode(t, _tensor_gen(base, name))
            except (ValueError, TypeError, RuntimeError) as e:
                raise WireError(f"{what}: codec {codec.spec} failed: {_line(e)}") from e
            form = _FORM_CODED
        elif t.is_complex():
            raise WireError(f"{what}: complex tensors cannot travel on the wire (send the "
                            f"real and imaginary parts as two float tensors)")
        else:
            parts, form = {"": t}, _FORM_RAW
        head += [_str(name, "tensor name"), struct.pack("<BH", form, len(parts))]
        for part, leaf in parts.items():
            head.append(_leaf_header(part, leaf, what))
            bufs.append(_buffer(leaf))
    head.append(_U32.pack(len(msg.declared)))
    total = 0
    for name, d in msg.declared.items():
        if len(d.shape) > MAX_NDIM:
            raise WireError(f"declared {name!r}: {len(d.shape)} dimensions; the limit is "
                            f"{MAX_NDIM}")
        total += d.raw_nbytes
        if total > MAX_DECLARED_BYTES or any(x > MAX_DECLARED_BYTES for x in d.shape):
            raise WireError(f"declared {name!r}: the message would declare more than 2**62 "
                            f"bytes")
        head += [_str(name, "declared name"),
                 struct.pack(f"<BB{len(d.shape)}Q", _dtype_code(d.dtype, f"declared {name!r}"),
                             len(d.shape), *d.shape)]
    out = b"".join(head + bufs)  # type: ignore[arg-type]
    if stateful:
        state.update(new_state)  # type: ignore[union-attr]
    return out


def declared_bytes(msg: Message, codec: Codec) -> int:
    """Bytes the declared tensors of ``msg`` would weigh on the wire after ``codec``.

    Floating declared tensors count ``codec.size_of(shape)``; others their raw size
    (they would travel raw). Buffers only: their header entries are already in the
    encoded message.
    """
    total = 0
    for d in msg.declared.values():
        total += codec.size_of(d.shape) if d.dtype.is_floating_point else d.raw_nbytes
    return total


# --------------------------------------------------------------------------- budget


_ELEMENT_FLOOR = 2**16
_BYTE_FLOOR = 2**20


@dataclass(frozen=True)
class DecodeBudget:
    """What a receiver accepts to spend on decoding one message (design rule 8).

    ``max_elements``: total elements of the tensors the decode materialises (raw tensors
    plus the *original* shapes of coded ones, i.e. the dense size the receiver gets, not
    the bytes that carried it). ``max_bytes``: length of the message. ``max_meta_bytes``
    and ``max_meta_depth``: the metadata JSON's length and nesting (the top-level object
    is depth 1). ``max_tensors``: tensors, and separately declared tensors, per message.

    A decode within budget allocates at most about ``2 * nbytes`` (its leaf copies, its
    float32 results and the codecs' working memory) and takes time linear in
    ``max_elements`` (a sketch: rows x elements). The defaults are :data:`DEFAULT_BUDGET`;
    a receiver that knows its model should use :meth:`for_elements`.
    """

    max_elements: int = 2**26
    max_bytes: int = 8 * 2**26 + _BYTE_FLOOR
    max_meta_bytes: int = 2**16
    max_meta_depth: int = 4
    max_tensors: int = 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            lo = 1 if f.name == "max_meta_depth" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"DecodeBudget.{f.name} must be an int >= {lo}, got {v!r}")

    @classmethod
    def for_elements(cls, n: int, *, slack: float = 2.0, tensors: Optional[int] = None,
                     **limits: int) -> "DecodeBudget":
        """A budget for a receiver that expects messages of about ``n`` elements (e.g. its
        model's parameter count, or ``numel`` of the logits it asked for) in about
        ``tensors`` tensors (e.g. ``len(model.state_dict())``).

        ``max_elements = ceil(n * slack) + 65536`` (the floor leaves room for counters,
        masks and small extras); ``max_bytes = 8 * max_elements + 1 MiB`` (8 bytes per
        element covers int64 tensors and top-k's index + value pairs; the MiB covers the
        header, the metadata, aux parts and sketch tables); ``max_tensors =
        ceil(tensors * slack) + 16`` when ``tensors`` is given (a decode costs up to about
        0.2 ms per tensor, so a receiver should not accept a thousand when it expects
        ten), else the default 1024. ``limits`` (``max_meta_bytes``, ``max_meta_depth``,
        ``max_tensors``) override any field.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"DecodeBudget.for_elements: n must be an int >= 0, got {n!r}")
        if isinstance(slack, bool) or not (isinstance(slack, (int, float)) and math.isfinite(slack)
                                           and slack >= 1.0):
            raise ValueError(f"DecodeBudget.for_elements: slack must be a finite number >= 1, "
                             f"got {slack!r}")
        elements = math.ceil(n * slack) + _ELEMENT_FLOOR
        derived: dict[str, int] = {"max_elements": elements, "max_bytes": 8 * elements + _BYTE_FLOOR}
        if tensors is not None:
            if isinstance(tensors, bool) or not isinstance(tensors, int) or tensors < 0:
                raise ValueError(f"DecodeBudget.for_elements: tensors must be an int >= 0, "
                                 f"got {tensors!r}")
            derived["max_tensors"] = math.ceil(tensors * slack) + 16
        return cls(**{**derived, **limits})

    @property
    def nbytes(self) -> int:
        """The memory a receiver commits to one decode: its input (``max_bytes``) plus
        the float32 tensors it may get (``4 * max_elements``)."""
        return self.max_bytes + 4 * self.max_elements


DEFAULT_BUDGET = DecodeBudget()
"""The budget of a receiver that names none: 2**26 elements (256 MiB as float32), messages
of up to 513 MiB, 64 KiB of metadata nested at most 4 deep, 1,024 tensors. Bounded, but
generous: a receiver that knows its model should pass ``DecodeBudget.for_elements(n)``."""

_HEADER_ONLY = DecodeBudget(max_elements=2**62, max_bytes=2**62, max_meta_bytes=2**32,
                            max_meta_depth=64, max_tensors=2**32)


# --------------------------------------------------------------------------- decode


def _line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


class _Reader:
    """Bounds-checked cursor over the message bytes; every failure names the offset."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n > len(self.data) - self.pos:
            raise WireError(f"truncated message: {what} needs {n} bytes at offset {self.pos}, "
                            f"only {len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, s: struct.Struct, what: str) -> tuple:
        if s.size > len(self.data) - self.pos:
            self.take(s.size, what)  # raises
        out = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return out

    def dims(self, ndim: int, fmt: str, what: str) -> tuple[int, ...]:
        n = ndim * struct.calcsize(fmt)
        if n > len(self.data) - self.pos:
            self.take(n, what)  # raises
        out = struct.unpack_from(f"<{ndim}{fmt}", self.data, self.pos)
        self.pos += n
        return out

    def string(self, what: str) -> str:
        (n,) = self.unpack(_U16, f"{what} length")
        at = self.pos
        raw = self.take(n, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise WireError(f"{what} is not valid UTF-8 at offset {at}") from None

    def dtype(self, what: str) -> int:
        at = self.pos
        (code,) = self.unpack(_U8, f"{what} dtype")
        if code not in _CODE_DTYPES:
            raise WireError(f"unknown dtype code {code} for {what} at offset {at}")
        return code


class _Leaf(NamedTuple):
    part: str
    code: int
    shape: tuple[int, ...]
    offset: int  # of its buffer, from the start of the buffers
    nbytes: int


class _Entry(NamedTuple):
    name: str
    form: int
    at: int  # header offset of the tensor's entry
    leaves: tuple[_Leaf, ...]


class _Header(NamedTuple):
    kind: str
    spec: str
    codec: Codec
    meta: dict
    entries: list[_Entry]
    declared: dict[str, DeclaredTensor]
    raw_elements: int
    nbuf: int
    end: int  # offset of the first buffer byte


@lru_cache(maxsize=256)
def _leaf_count(codec: Codec) -> int:
    """Number of leaves ``codec`` produces per float tensor (the same for every shape)."""
    return len(codec.leaves((1,)))


def _read_leaf(r: _Reader, name: str, budget: DecodeBudget, nbuf: int) -> tuple[_Leaf, str]:
    part = r.string(f"tensor {name!r} part name")
    leaf = f"leaf {name + '/' + part if part else name!r}"
    code = r.dtype(leaf)
    at = r.pos
    (ndim,) = r.unpack(_U8, f"{leaf} ndim")
    if ndim > MAX_NDIM:
        raise WireError(f"{leaf}: ndim {ndim} at offset {at}; the limit is {MAX_NDIM}")
    shape = r.dims(ndim, "I", f"{leaf} dims")
    if any(d > budget.max_elements for d in shape):
        raise WireError(f"{leaf}: dims {shape} at offset {at + 1}: a dim exceeds the "
                        f"receiver's budget of {budget.max_elements} elements")
    nbytes = math.prod(shape) * _ITEMSIZE[code]
    if nbuf + nbytes > len(r.data) - r.pos:
        raise WireError(f"{leaf}: dims {shape} at offset {at + 1} need {nbytes} buffer bytes; "
                        f"the message has {len(r.data) - r.pos} bytes after this point and "
                        f"{nbuf} of them are already promised")
    return _Leaf(part, code, shape, nbuf, nbytes), leaf


def _read_header(data: memoryview, budget: DecodeBudget) -> _Header:
    """Parse and check everything but the buffers (see the module docstring)."""
    r = _Reader(data)
    if bytes(r.take(4, "magic")) != MAGIC:
        raise WireError(f"bad magic at offset 0: expected {MAGIC!r}, got {bytes(data[:4])!r}")
    (version,) = r.unpack(_U8, "version")
    if version != VERSION:
        raise WireError(f"unsupported wire version {version} at offset 4 (this reader: {VERSION})")
    kind = r.string("kind")
    at = r.pos
    (slen,) = _U16.unpack_from(data, at) if len(data) - at >= 2 else (0,)
    if slen > MAX_SPEC_CHARS:
        raise WireError(f"codec spec at offset {at} is {slen} bytes; the limit is {MAX_SPEC_CHARS}")
    spec = r.string("codec spec")
    try:
        codec = codec_from_spec(spec)
    except ValueError as e:
        raise WireError(f"unknown codec at offset {at}: {_line(e)}") from None
    at = r.pos
    (mlen,) = r.unpack(_U32, "meta length")
    if mlen > budget.max_meta_bytes:
        raise WireError(f"meta length {mlen} at offset {at} exceeds the receiver's budget of "
                        f"{budget.max_meta_bytes} bytes (DecodeBudget.max_meta_bytes)")
    raw_meta = r.take(mlen, "meta")
    try:
        meta = parse_meta(bytes(raw_meta), budget.max_meta_depth)
    except MetaError as e:
        raise WireError(f"meta at offset {at + 4}: {_line(e)}") from None

    at = r.pos
    (ntensors,) = r.unpack(_U32, "tensor count")
    if ntensors > budget.max_tensors:
        raise WireError(f"tensor count {ntensors} at offset {at} exceeds the receiver's budget "
                        f"of {budget.max_tensors} (DecodeBudget.max_tensors)")
    n_coded = _leaf_count(codec)
    entries: list[_Entry] = []
    names: set[str] = set()
    nbuf = raw_elements = 0
    for _ in range(ntensors):
        t_at = r.pos
        name = r.string("tensor name")
        if name in names:
            raise WireError(f"duplicate tensor name {name!r} at offset {t_at}")
        names.add(name)
        form, nleaves = r.unpack(_FORM, f"tensor {name!r} form")
        want = {_FORM_RAW: 1, _FORM_CODED: n_coded}.get(form)
        if want is None or nleaves != want:
            raise WireError(f"tensor {name!r} at offset {t_at}: form {form} with {nleaves} "
                            f"leaves (raw = form 0 with 1 leaf; coded = form 1 with {n_coded} "
                            f"leaves under codec {spec})")
        leaves: list[_Leaf] = []
        parts: set[str] = set()
        for _ in range(nleaves):
            lf, what = _read_leaf(r, name, budget, nbuf)
            if lf.part in parts:
                raise WireError(f"tensor {name!r} at offset {t_at}: duplicate part {lf.part!r}")
            parts.add(lf.part)
            leaves.append(lf)
            nbuf += lf.nbytes
        if form == _FORM_RAW:
            lf = leaves[0]
            if lf.part != "" or lf.code not in _RAW_CODES:
                raise WireError(f"raw tensor {name!r} at offset {t_at} must be one part '' of "
                                f"an integer or bool dtype, got part {lf.part!r} of "
                                f"{_CODE_DTYPES[lf.code]} (float tensors travel coded)")
            raw_elements += math.prod(lf.shape)
            if raw_elements > budget.max_elements:
                raise WireError(f"raw tensor {name!r} at offset {t_at}: the message's tensors "
                                f"exceed the receiver's budget of {budget.max_elements} "
                                f"elements (DecodeBudget.max_elements)")
        entries.append(_Entry(name, form, t_at, tuple(leaves)))

    at = r.pos
    (ndecl,) = r.unpack(_U32, "declared count")
    if ndecl > budget.max_tensors:
        raise WireError(f"declared count {ndecl} at offset {at} exceeds the receiver's budget "
                        f"of {budget.max_tensors} (DecodeBudget.max_tensors)")
    declared: dict[str, DeclaredTensor] = {}
    total = 0
    for _ in range(ndecl):
        d_at = r.pos
        name = r.string("declared name")
        if name in declared:
            raise WireError(f"duplicate declared name {name!r} at offset {d_at}")
        code = r.dtype(f"declared {name!r}")
        at = r.pos
        (ndim,) = r.unpack(_U8, f"declared {name!r} ndim")
        if ndim > MAX_NDIM:
            raise WireError(f"declared {name!r}: ndim {ndim} at offset {at}; the limit is "
                            f"{MAX_NDIM}")
        shape = r.dims(ndim, "Q", f"declared {name!r} dims")
        nbytes = math.prod(shape) * _ITEMSIZE[code]
        total += nbytes
        if total > MAX_DECLARED_BYTES or any(d > MAX_DECLARED_BYTES for d in shape):
            raise WireError(f"declared {name!r}: dims {shape} at offset {at + 1}: the message "
                            f"would declare more than 2**62 bytes")
        declared[name] = DeclaredTensor(shape, _CODE_DTYPES[code])

    left = len(data) - r.pos
    if left < nbuf:  # pragma: no cover - each leaf is already checked against what is left
        raise WireError(f"truncated message: header at offsets 0..{r.pos} promises {nbuf} buffer "
                        f"bytes, only {left} left")
    if left > nbuf:
        raise WireError(f"{left - nbuf} bytes of trailing garbage at offset {r.pos + nbuf}")
    return _Header(kind, spec, codec, meta, entries, declared, raw_elements, nbuf, r.pos)


def _plan(data: memoryview, h: _Header, budget: DecodeBudget) -> None:
    """Check every coded tensor's leaves and original shape (and the element budget)
    from the header and the small ``_shape`` parts, before anything is built."""
    elements = h.raw_elements
    for e in h.entries:
        if e.form != _FORM_CODED:
            continue
        by_part = {lf.part: lf for lf in e.leaves}

        def read(part: str, _by: dict[str, _Leaf] = by_part) -> list[int]:
            lf = _by[part]  # check_leaves asks only for a 1-d int64 '_shape' it has checked
            if _CODE_DTYPES[lf.code] != torch.int64 or len(lf.shape) != 1 \
                    or lf.shape[0] > MAX_NDIM:  # pragma: no cover - defensive
                raise ValueError(f"part {part!r} is not a small int64 vector")
            return np.frombuffer(data, dtype="<i8", count=lf.shape[0],
                                 offset=h.end + lf.offset).tolist()

        specs = {lf.part: (lf.shape, _CODE_DTYPES[lf.code]) for lf in e.leaves}
        left = budget.max_elements - elements
        try:
            shape = check_leaves_of(h.codec, specs, read, left)
        except ShapeLimitError as x:
            raise WireError(f"tensor {e.name!r} at offset {e.at}: codec {h.spec} would decode "
                            f"{x.numel} elements (shape {x.shape}), over the {x.limit} left in "
                            f"the receiver's budget (DecodeBudget.max_elements="
                            f"{budget.max_elements})") from None
        except (ValueError, KeyError) as x:
            raise WireError(f"tensor {e.name!r} at offset {e.at}: leaves do not match codec "
                            f"{h.spec}: {_line(x)}") from None
        elements += math.prod(shape)


def _as_bytes(data: object) -> memoryview:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        try:
            mv = mv.cast("B")
        except TypeError:
            raise WireError("expected a contiguous bytes-like object") from None
    return mv


def _budget(budget: Optional[DecodeBudget]) -> DecodeBudget:
    if budget is None:
        return DEFAULT_BUDGET
    if not isinstance(budget, DecodeBudget):
        raise TypeError(f"budget must be a DecodeBudget or None, got {type(budget).__name__}")
    return budget


def decode_with_codec(data: bytes, budget: Optional[DecodeBudget] = None) -> tuple[Message, Codec]:
    """Decode ``data`` within ``budget`` (:data:`DEFAULT_BUDGET` if None); also return the
    codec named in its header. Raises :class:`WireError` (one line: what, where) for
    anything malformed or over budget, before allocating anything for it."""
    budget = _budget(budget)
    mv = _as_bytes(data)
    if len(mv) > budget.max_bytes:
        raise WireError(f"message of {len(mv)} bytes exceeds the receiver's budget of "
                        f"{budget.max_bytes} bytes (DecodeBudget.max_bytes)")
    h = _read_header(mv, budget)
    _plan(mv, h, budget)

    tensors: dict[str, torch.Tensor] = {}
    for e in h.entries:
        parts: dict[str, torch.Tensor] = {}
        for lf in e.leaves:
            dt = _CODE_DTYPES[lf.code]
            if lf.nbytes == 0:  # numpy gives empty arrays stride 0, which torch cannot view
                parts[lf.part] = torch.empty(lf.shape, dtype=dt)
                continue
            u8 = np.frombuffer(mv, dtype=np.uint8, count=lf.nbytes, offset=h.end + lf.offset).copy()
            if dt == torch.bool and u8.max() > 1:
                raise WireError(f"tensor {e.name!r} at offset {e.at}: bool buffer holds a byte "
                                f"other than 0 or 1")
            parts[lf.part] = torch.from_numpy(u8).view(dt).reshape(lf.shape)
        if e.form == _FORM_RAW:
            tensors[e.name] = parts[""]
            continue
        try:
            tensors[e.name] = h.codec.decode(parts)
        except (ValueError, TypeError, RuntimeError, KeyError, IndexError) as x:
            raise WireError(f"tensor {e.name!r} at offset {e.at}: codec {h.spec} cannot decode "
                            f"its parts: {_line(x)}") from None
    return Message(kind=h.kind, tensors=tensors, meta=h.meta, declared=h.declared), h.codec


def decode_message(data: bytes, budget: Optional[DecodeBudget] = None) -> Message:
    """The :class:`Message` a receiver gets from ``data`` within ``budget`` (raises
    :class:`WireError`; :data:`DEFAULT_BUDGET` if None)."""
    return decode_with_codec(data, budget)[0]


def header_size(data: bytes) -> int:
    """Bytes of ``data`` that are header (everything but the leaf buffers)."""
    mv = _as_bytes(data)
    return len(mv) - _read_header(mv, _HEADER_ONLY).nbuf
