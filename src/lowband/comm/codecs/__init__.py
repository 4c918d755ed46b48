"""Composable codecs: encode/decode pairs that turn one float tensor into named leaves.

The package: :mod:`~lowband.comm.codecs.core` (the protocol, the stateless codecs, chains),
:mod:`~lowband.comm.codecs.quantizers` (QSGD, scaled sign), :mod:`~lowband.comm.codecs.memory`
(codecs with state: error feedback, EF21, PowerSGD), and here the registry: the spec
names, :func:`register_codec` for plugins and :func:`parse_codec`. The registry imports
the codec modules; they import only ``core``.

In the spirit of optax's gradient transformations (design rule 3), each codec is a
small object with

- ``spec``: its canonical spec string (``"topk(0.01)+fp16"``), written into every
  message so that a receiver decodes without configuration;
- ``encode(x, gen) -> {part: tensor}``: the leaves that travel on the wire. A part
  whose name starts with ``"_"`` is *aux* (a scale, a seed, a shape): later codecs in a
  chain leave it alone. The part ``""`` means "the tensor itself" and must be floating;
- ``decode(parts) -> Tensor``: a float32 tensor of the original shape, computed from the
  parts alone (exactly reproducible from the bytes);
- ``leaves(shape)``: the ``{part: (shape, dtype)}`` that ``encode`` produces for a
  float tensor of ``shape``; ``size_of(shape)`` sums their bytes (exact for all codecs
  here, whose sizes depend on the shape only). Declared tensors are counted with it.

``chain(a, b, c)`` applies ``a``, then ``chain(b, c)`` to each non-aux floating leaf of
``a`` (recursively); a leaf ``p`` that ``b`` splits into parts ``q`` is named ``p/q``.
So ``chain(topk(0.01), int8())`` yields ``idx``, ``val/q``, ``val/_scale``, ``_shape``.

Codecs accept tensors of fewer than 2**31 elements (indices are int32).

**Codecs with state** (``ef(c)``, ``powersgd(r)``; :mod:`lowband.comm.codecs.memory`) have
``stateful = True`` and ``encode_stateful(x, gen, state)``: ``state`` is a flat
``{name: Tensor}`` dict private to the *sender* (one per sender, link and tensor; see
:class:`~lowband.comm.network.Network`), which the codec reads and replaces entries of
(never mutating a tensor in place). Their ``decode`` is stateless (the receiver needs only
the bytes), and their plain ``encode`` is the stateless first step (zero residual, fresh
warm start). A chain is stateful when one of its codecs is (:func:`is_stateful`).
``ef21(c)`` also keeps a mirror at the receiver, which the network moves on accepted
delivery (:class:`~lowband.comm.codecs.memory.EF21`); it is never part of a chain.

Decoding hostile bytes (design rule 8): ``check_leaves(specs, read, limit)`` recovers the
original shape from the leaves' header entries (and the small ``_shape`` aux part), checks
it against the receiver's element ``limit`` *before* anything is built, and then checks
that the leaves are exactly ``leaves(shape)`` (names, dtypes, shapes). The wire decoder
calls it for every coded tensor, so ``decode`` only ever sees leaves of the right
structure; ``decode`` itself still checks the contents (index ranges and order, seeds,
scales). Codec parameters are bounded (``MAX_SKETCH_ROWS``, ``MAX_SKETCH_COLS``,
``MAX_CHAIN``, ``MAX_SPEC_CHARS``) so that a spec string read off the wire is cheap.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from .core import (  # noqa: F401 (re-exported)
    AuxReader,
    bf16,
    Chain,
    chain,
    check_leaves_of,
    Codec,
    encode_with_state,
    fp16,
    fp32,
    HeaderSpecs,
    Int8,
    int8,
    is_stateful,
    LeafSpec,
    MAX_CHAIN,
    MAX_NDIM,
    MAX_NUMEL,
    MAX_SKETCH_COLS,
    MAX_SKETCH_ROWS,
    MAX_SPEC_CHARS,
    RandMask,
    randmask,
    ShapeLimitError,
    Sketch,
    sketch,
    TopK,
    topk,
)
from .memory import (  # noqa: F401 (re-exported)
    ef,
    EF21,
    ef21,
    ErrorFeedback,
    has_receiver_state,
    MAX_POWERSGD_RANK,
    PowerSGD,
    powersgd,
)
from .quantizers import (  # noqa: F401 (re-exported)
    MAX_QSGD_LEVELS,
    pack_codes,
    QSGD,
    qsgd,
    Sign,
    sign,
    unpack_codes,
)

# --------------------------------------------------------------------------- registry, parsing

CODECS: dict[str, str] = {
    "fp32": "float32 values, no loss (identity)",
    "fp16": "IEEE half precision, round to nearest: 2 bytes/value",
    "bf16": "bfloat16, round to nearest: 2 bytes/value, float32 range",
    "int8": "per-tensor symmetric int8, stochastic rounding (unbiased): 1 byte/value + scale",
    "topk(k)": "largest-|x| entries; k an int count or a fraction in (0,1]: int32 index + value",
    "randmask(frac[,scale=true])": "seeded random coordinates, values only; scale=true rescales "
                                   "by numel/k (unbiased)",
    "sharedmask(frac)": "random-k from the round's shared seed: every sender of a kind keeps the same "
                        "coordinates in a round, so sparse updates stay summable (secure aggregation)",
    "sketch(rows,cols)": "count sketch (rows x cols float32 table); decode = median estimate",
    "qsgd(s[,bucket=0])": "QSGD: s levels, stochastic rounding (unbiased); ceil(log2(2s+1)) bits/value + "
                          "a float32 norm per bucket (0: whole tensor)",
    "sign": "scaled sign: 1 bit/value + float32 mean |x| (biased: use ef(sign))",
    "ef(codec)": "error feedback around a lossy codec: sends codec(x + e), keeps e <- x + e - sent",
    "ef21(codec)": "EF21: sends codec(x - g); sender and receiver both keep g <- g + decoded, moved together "
                   "on accepted delivery only (a broadcast: one estimate per receiver)",
    "powersgd(r)": "PowerSGD: rank-r factors P, Q (float32), warm-started Q, error feedback; "
                   "tensors under 2-D (or too small) sent as they are",
    "a+b": "chain: apply b to the non-aux float parts that a produces (e.g. topk(0.01)+fp16)",
}

def _sharedmask(frac: float) -> Codec:
    """``sharedmask(frac)``: the summable sparsifier (:mod:`.shared`; why: lowband.privacy.sparsify)."""
    from .shared import sharedmask

    return sharedmask(frac)


#: name -> codec maker (``maker(*args, **kwargs) -> Codec``); plugins add theirs with
#: :func:`register_codec`
MAKERS: dict[str, Callable[..., Codec]] = {"fp32": fp32, "fp16": fp16, "bf16": bf16, "int8": int8, "topk": topk,
                                           "randmask": randmask, "sketch": sketch, "qsgd": qsgd, "sign": sign,
                                           "ef": ef, "ef21": ef21, "powersgd": powersgd,
                                           "sharedmask": _sharedmask}


#: codec name -> the state it keeps at the sender (codecs not listed keep none)
CODEC_STATE: dict[str, str] = {
    "ef": "residual e per sender, link and tensor",
    "ef21": "estimate g per link and tensor at the sender, and its mirror at the receiver",
    "powersgd": "residual e and warm-start Q per sender, link and tensor",
    "a+b": "that of its codecs",
}


def register_codec(name: str, maker: Callable[..., Codec], description: str = "") -> None:
    """Make ``name`` (and ``name(args)``) a codec spec: ``maker(*args, **kwargs)`` must return
    an object with the :class:`Codec` methods whose ``spec`` parses back to an equal codec.
    Used by plugins (:mod:`lowband.plugins`)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name or ""):
        raise ValueError(f"codec name {name!r}: use lowercase letters, digits and '_' (starting with a letter)")
    if name in MAKERS:
        raise ValueError(f"codec {name!r} registered twice")
    MAKERS[name] = maker
    CODECS[name] = description or f"plugin codec ({getattr(maker, '__module__', '?')})"


_TERM = re.compile(r"^([a-z][a-z0-9_]*)(?:\((.*)\))?$")

#: makers whose one argument is itself a codec spec (``ef(topk(0.01)+fp16)``): they get
#: the parsed codec
SPEC_MAKERS: set[str] = {"ef", "ef21"}


def split_top(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside parentheses (``"ef(a+b)+c"`` -> ``["ef(a+b)", "c"]``);
    raises ValueError on unbalanced parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ')' in codec spec {text!r}")
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '(' in codec spec {text!r}")
    out.append(text[start:])
    return out


def _known() -> str:
    return ", ".join(CODECS)


def _parse_arg(text: str, spec: str) -> int | float | bool:
    t = text.strip().lower()
    if t in ("true", "false"):
        return t == "true"
    try:
        return int(t) if re.fullmatch(r"[+-]?\d+", t) else float(t)
    except ValueError:
        raise ValueError(f"bad codec argument {text!r} in {spec!r}; known codecs: {_known()}") \
            from None


def _parse_term(term: str, spec: str) -> Codec:
    m = _TERM.match(term.strip().replace(" ", ""))
    if not m:
        raise ValueError(f"bad codec {term!r} in {spec!r}; known codecs: {_known()}")
    name, argtext = m.group(1), m.group(2)
    args: list[Any] = []
    kwargs: dict[str, int | float | bool] = {}
    if name in SPEC_MAKERS:
        if not argtext:
            raise ValueError(f"codec {name!r} in {spec!r} wraps a codec: write {name}(<codec spec>), "
                             f"e.g. {name}(topk(0.01)); known codecs: {_known()}")
        args.append(parse_codec(argtext))
    elif argtext:
        for a in split_top(argtext, ","):
            if "=" in a:
                k, v = a.split("=", 1)
                kwargs[k.strip()] = _parse_arg(v, spec)
            else:
                args.append(_parse_arg(a, spec))
    makers = MAKERS
    if name not in makers:
        raise ValueError(f"unknown codec {name!r} in {spec!r}; known codecs: {_known()}")
    try:
        return makers[name](*args, **kwargs)  # type: ignore[operator]
    except TypeError:
        raise ValueError(f"bad arguments for codec {name!r} in {spec!r}; known codecs: "
                         f"{_known()}") from None
    except ValueError as e:
        raise ValueError(f"{e} (in {spec!r}); known codecs: {_known()}") from None


def parse_codec(spec: str) -> Codec:
    """The codec for a spec string such as ``"fp16"``, ``"topk(0.01)+int8"``, ``"sketch(5,2000)"``.

    ``parse_codec(c.spec).spec == c.spec`` for every codec. Raises a one-line
    ``ValueError`` naming the known codecs on bad input.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty codec spec {spec!r}; known codecs: {_known()}")
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(f"codec spec of {len(spec)} characters; the limit is {MAX_SPEC_CHARS}")
    try:
        terms = split_top(spec, "+")
    except ValueError as e:
        raise ValueError(f"{e}; known codecs: {_known()}") from None
    if len(terms) > MAX_CHAIN:
        raise ValueError(f"codec spec chains {len(terms)} codecs; the limit is {MAX_CHAIN}")
    return chain(*[_parse_term(t, spec) for t in terms])
