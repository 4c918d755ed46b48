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
            ndim   u8
            dims   u32 x ndim
    n_declared u32
      per declared tensor (counted, never built; no buffer):
        name str, dtype u8, ndim u8, dims u64 x ndim
    buffers    every leaf's elements, C order, little-endian, in header order, unpadded;
               the message ends exactly at the last buffer byte.

Float tensors arrive as float32 of their original shape (whatever survived the codec);
integer and bool tensors arrive bit-identical. Malformed input of any kind raises
:class:`WireError` with one line saying what was wrong and at which byte offset.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from functools import lru_cache

import numpy as np
import torch

from .codecs import Codec, parse_codec
from .message import DeclaredTensor, Message

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
_U16, _U32 = struct.Struct("<H"), struct.Struct("<I")
_MAX_DIM = 2**32 - 1

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
    if t.dim() > 255 or any(d > _MAX_DIM for d in t.shape):
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


def encode_message(msg: Message, codec: Codec, gen: torch.Generator) -> bytes:
    """``msg`` as bytes; float tensors go through ``codec`` (see the module docstring).

    One seed is drawn from ``gen`` and each tensor's codec randomness is derived from it
    and the tensor's name, so it does not depend on the order of ``msg.tensors``.
    """
    head = [MAGIC, bytes([VERSION]), _str(msg.kind, "kind"), _str(codec.spec, "codec spec")]
    meta = _meta_json(msg.meta)
    head += [_U32.pack(len(meta)), meta, _U32.pack(len(msg.tensors))]
    bufs: list[memoryview] = []
    base = int(torch.randint(0, 2**62, (1,), generator=gen))
    for name, t in msg.tensors.items():
        if not isinstance(t, torch.Tensor):
            raise WireError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        what = f"tensor {name!r}"
        if t.is_floating_point():
            try:
                parts = codec.encode(t, _tensor_gen(base, name))
            except (ValueError, TypeError, RuntimeError) as e:
                raise WireError(f"{what}: codec {codec.spec} failed: {_line(e)}") from e
            form = _FORM_CODED
        else:
            parts, form = {"": t}, _FORM_RAW
        head += [_str(name, "tensor name"), struct.pack("<BH", form, len(parts))]
        for part, leaf in parts.items():
            head.append(_leaf_header(part, leaf, what))
            bufs.append(_buffer(leaf))
    head.append(_U32.pack(len(msg.declared)))
    for name, d in msg.declared.items():
        if len(d.shape) > 255:
            raise WireError(f"declared {name!r}: too many dimensions")
        head += [_str(name, "declared name"),
                 struct.pack(f"<BB{len(d.shape)}Q", _dtype_code(d.dtype, f"declared {name!r}"),
                             len(d.shape), *d.shape)]
    return b"".join(head + bufs)  # type: ignore[arg-type]


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


# --------------------------------------------------------------------------- decode


def _line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


class _Reader:
    """Bounds-checked cursor over the message bytes; every failure names the offset."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n > len(self.data) - self.pos:
            raise WireError(f"truncated message: {what} needs {n} bytes at offset {self.pos}, "
                            f"only {len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple:
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size, what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("H", f"{what} length")
        at = self.pos
        raw = self.take(n, what)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise WireError(f"{what} is not valid UTF-8 at offset {at}") from None

    def dtype(self, what: str) -> int:
        at = self.pos
        (code,) = self.unpack("B", f"{what} dtype")
        if code not in _CODE_DTYPES:
            raise WireError(f"unknown dtype code {code} for {what} at offset {at}")
        return code


def decode_with_codec(data: bytes) -> tuple[Message, Codec]:
    """Decode ``data``; also return the codec named in its header."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    r = _Reader(data)
    if bytes(r.take(4, "magic")) != MAGIC:
        raise WireError(f"bad magic at offset 0: expected {MAGIC!r}, got {bytes(data[:4])!r}")
    (version,) = r.unpack("B", "version")
    if version != VERSION:
        raise WireError(f"unsupported wire version {version} at offset 4 (this reader: {VERSION})")
    kind = r.string("kind")
    at = r.pos
    spec = r.string("codec spec")
    try:
        codec = codec_from_spec(spec)
    except ValueError as e:
        raise WireError(f"unknown codec at offset {at}: {_line(e)}") from None
    (mlen,) = r.unpack("I", "meta length")
    at = r.pos
    try:
        meta = json.loads(bytes(r.take(mlen, "meta")).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WireError(f"meta at offset {at} is not valid UTF-8 JSON") from None
    if not isinstance(meta, dict):
        raise WireError(f"meta at offset {at} is not a JSON object")

    # header of the tensors: (name, form, offset, [(part, code, shape)])
    (ntensors,) = r.unpack("I", "tensor count")
    entries = []
    nbuf = 0
    for _ in range(ntensors):
        t_at = r.pos
        name = r.string("tensor name")
        form, nleaves = r.unpack("BH", f"tensor {name!r} form")
        if form not in (_FORM_RAW, _FORM_CODED) or (form == _FORM_RAW and nleaves != 1):
            raise WireError(f"tensor {name!r} at offset {t_at}: bad form {form} with "
                            f"{nleaves} leaves")
        leaves = []
        for _ in range(nleaves):
            part = r.string(f"tensor {name!r} part name")
            leaf = f"leaf {name + '/' + part!r}"
            code = r.dtype(leaf)
            (ndim,) = r.unpack("B", f"{leaf} ndim")
            shape = r.unpack(f"{ndim}I", f"{leaf} dims")
            leaves.append((part, code, shape))
            nbuf += math.prod(shape) * _ITEMSIZE[code]
        entries.append((name, form, t_at, leaves))
    (ndecl,) = r.unpack("I", "declared count")
    declared: dict[str, DeclaredTensor] = {}
    for _ in range(ndecl):
        name = r.string("declared name")
        code = r.dtype(f"declared {name!r}")
        (ndim,) = r.unpack("B", f"declared {name!r} ndim")
        shape = r.unpack(f"{ndim}Q", f"declared {name!r} dims")
        declared[name] = DeclaredTensor(tuple(shape), _CODE_DTYPES[code])

    left = len(r.data) - r.pos
    if left < nbuf:
        raise WireError(f"truncated message: header at offsets 0..{r.pos} promises {nbuf} buffer "
                        f"bytes, only {left} left")
    if left > nbuf:
        raise WireError(f"{left - nbuf} bytes of trailing garbage at offset {r.pos + nbuf}")

    tensors: dict[str, torch.Tensor] = {}
    for name, form, t_at, leaves in entries:
        parts: dict[str, torch.Tensor] = {}
        for part, code, shape in leaves:
            n = math.prod(shape) * _ITEMSIZE[code]
            u8 = np.frombuffer(r.data, dtype=np.uint8, count=n, offset=r.pos).copy()
            r.pos += n
            if part in parts:
                raise WireError(f"tensor {name!r} at offset {t_at}: duplicate part {part!r}")
            if _CODE_DTYPES[code] == torch.bool and n and u8.max() > 1:
                raise WireError(f"tensor {name!r} at offset {t_at}: bool buffer holds a byte "
                                f"other than 0 or 1")
            if n == 0:  # numpy gives empty arrays stride 0, which torch cannot view
                parts[part] = torch.empty(shape, dtype=_CODE_DTYPES[code])
            else:
                parts[part] = torch.from_numpy(u8).view(_CODE_DTYPES[code]).reshape(shape)
        if name in tensors:
            raise WireError(f"duplicate tensor name {name!r} at offset {t_at}")
        if form == _FORM_RAW:
            if "" not in parts:
                raise WireError(f"raw tensor {name!r} at offset {t_at} must have part ''")
            tensors[name] = parts[""]
            continue
        try:
            tensors[name] = codec.decode(parts)
        except (ValueError, TypeError, RuntimeError, KeyError, IndexError) as e:
            raise WireError(f"tensor {name!r} at offset {t_at}: codec {spec} cannot decode its "
                            f"parts: {_line(e)}") from None
    return Message(kind=kind, tensors=tensors, meta=meta, declared=declared), codec


def decode_message(data: bytes) -> Message:
    """The :class:`Message` a receiver gets from ``data`` (raises :class:`WireError`)."""
    return decode_with_codec(data)[0]


def header_size(data: bytes) -> int:
    """Bytes of ``data`` that are header (everything but the leaf buffers)."""
    msg_bytes = len(data)
    r = _Reader(data)
    r.take(5, "magic and version")
    r.string("kind"), r.string("codec spec")
    (mlen,) = r.unpack("I", "meta length")
    r.take(mlen, "meta")
    nbuf = 0
    (ntensors,) = r.unpack("I", "tensor count")
    for _ in range(ntensors):
        r.string("tensor name")
        _, nleaves = r.unpack("BH", "form")
        for _ in range(nleaves):
            r.string("part")
            code = r.dtype("leaf")
            (ndim,) = r.unpack("B", "ndim")
            nbuf += math.prod(r.unpack(f"{ndim}I", "dims")) * _ITEMSIZE[code]
    return msg_bytes - nbuf
