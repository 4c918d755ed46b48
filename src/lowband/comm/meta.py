"""A message's metadata as the receiver reads it: bounded JSON and a schema for known keys.

The wire format carries a message's ``meta`` as a compact JSON object. The receiver parses
it under limits it sets (:class:`~lowband.comm.wire.DecodeBudget`: length, nesting depth),
so no input can raise anything but a one-line error: nesting is measured before the JSON
parser recurses (no ``RecursionError``), integers are refused above 20 digits before
Python converts them (no 4,300-digit ``ValueError``, no quadratic conversion) and must
fit in int64, ``NaN`` / ``Infinity`` and floats that overflow are refused, duplicate keys
are refused (no "last one wins" ambiguity).

Keys that lowband's algorithms send have a schema (:data:`META_SCHEMA`), e.g.
``num_examples`` must be an int in ``1..2**40`` (a sample count weights an average: a
float, NaN, negative or absurd count is hostile). Other keys may hold a scalar (None,
bool, int64, finite float, a string of at most :data:`MAX_META_STR` characters) or a
list of at most :data:`MAX_META_LIST` such values (nested up to the depth limit).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import numpy as np

MAX_META_KEYS = 256
"""Most keys in a message's metadata."""
MAX_META_KEY = 256
"""Longest metadata key (characters)."""
MAX_META_STR = 4096
"""Longest string value of an unknown metadata key (characters)."""
MAX_META_LIST = 256
"""Longest list value of an unknown metadata key."""
MAX_NUM_EXAMPLES = 2**40
"""Largest ``num_examples`` a sender may claim (about 1.1e12 samples)."""

_MAX_INT_DIGITS = 20  # int64 has at most 19 digits (plus a sign)
_MAX_FLOAT_CHARS = 64  # repr(float) is at most 24 characters
_INT64 = (-(2**63), 2**63 - 1)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class MetaError(ValueError):
    """Metadata that a receiver refuses (one line, naming the key)."""


# ----------------------------------------------------------------------------- schema


def _count(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"must be an int, got {type(v).__name__}"
    if not 1 <= v <= MAX_NUM_EXAMPLES:
        return f"must be in 1..{MAX_NUM_EXAMPLES}, got {v}"
    return None


def _number(lo: float | None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number, got {type(v).__name__}"
        if lo is not None and v < lo:
            return f"must be >= {lo}, got {v}"
        return None  # non-finite floats never get this far (refused by the parser)
    return check


def _string(v: Any) -> str | None:
    return None if isinstance(v, str) else f"must be a string, got {type(v).__name__}"


def _stamp(v: Any) -> str | None:
    ok = isinstance(v, str) and re.fullmatch(r"\d{1,12}:\d{1,12}", v) is not None
    return None if ok else f"must be 'round:step' (two ints >= 0), got {str(v)[:40]!r}"


META_SCHEMA: dict[str, Callable[[Any], str | None]] = {
    "fresh": _stamp,            # freshness stamp "round:step" (lowband.comm.validate, freshness)
    "num_examples": _count,     # sample count weighting an average (FedAvg, FedNova, ...)
    "a": _number(0.0),          # FedNova's normaliser a_i (0 for a client that took no step)
    "V": _number(None),         # FedPAC's feature variance term
    "fim_trace": _number(0.0),  # FedAS's Fisher information trace
    "arch": _string,            # FOL / DENSE: the model descriptor (JSON text, bounded by length)
}
"""Checks of the metadata keys that lowband's algorithms send: each returns None when the
value is acceptable, else what is wrong. Non-finite numbers are refused for every key."""


def _plain(v: Any, depth: int, max_depth: int, where: str) -> None:
    """An unknown key's value: a bounded scalar or a short list of them."""
    if v is None or isinstance(v, (bool, int, float)):
        return
    if isinstance(v, str):
        if len(v) > MAX_META_STR:
            raise MetaError(f"{where} is a string of {len(v)} characters; the limit is "
                            f"{MAX_META_STR}")
        return
    if isinstance(v, list):
        if len(v) > MAX_META_LIST:
            raise MetaError(f"{where} is a list of {len(v)} items; the limit is {MAX_META_LIST}")
        if depth >= max_depth:
            raise MetaError(f"{where} nests deeper than {max_depth}")
        for i, item in enumerate(v):
            _plain(item, depth + 1, max_depth, f"{where}[{i}]")
        return
    raise MetaError(f"{where} is a {type(v).__name__}; only scalars and short lists are allowed")


def check_meta(meta: dict[str, Any], max_depth: int) -> None:
    """Raise :class:`MetaError` unless ``meta`` fits :data:`META_SCHEMA` and the bounds."""
    if len(meta) > MAX_META_KEYS:
        raise MetaError(f"{len(meta)} keys; the limit is {MAX_META_KEYS}")
    for k, v in meta.items():
        if len(k) > MAX_META_KEY:
            raise MetaError(f"a key of {len(k)} characters; the limit is {MAX_META_KEY}")
        check = META_SCHEMA.get(k)
        if check is not None:
            problem = check(v)
            if problem:
                raise MetaError(f"meta[{k!r}] {problem}")
        else:
            _plain(v, 1, max_depth, f"meta[{k!r}]")


# ----------------------------------------------------------------------------- parsing


def _depth(raw: bytes) -> int:
    """Deepest nesting of arrays/objects in JSON text ``raw`` (strings ignored), without
    recursion: vectorised over the bytes left once string literals are removed."""
    if raw.count(b"[") + raw.count(b"{") <= 1:
        return raw.count(b"[") + raw.count(b"{")
    a = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)
    step = ((a == 0x5B) | (a == 0x7B)).astype(np.int64) - ((a == 0x5D) | (a == 0x7D))
    return int(np.cumsum(step).max()) if step.size else 0


def _parse_int(s: str) -> int:
    if len(s) > _MAX_INT_DIGITS:
        raise MetaError(f"an integer of {len(s)} characters; the limit is int64")
    v = int(s)
    if not _INT64[0] <= v <= _INT64[1]:
        raise MetaError(f"integer {v} does not fit in int64")
    return v


def _parse_float(s: str) -> float:
    if len(s) > _MAX_FLOAT_CHARS:
        raise MetaError(f"a number of {len(s)} characters; the limit is {_MAX_FLOAT_CHARS}")
    v = float(s)
    if not math.isfinite(v):
        raise MetaError(f"number {s[:24]} overflows to {v}")
    return v


def _parse_constant(s: str) -> Any:
    raise MetaError(f"{s} is not allowed (numbers must be finite)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len(pairs) > MAX_META_KEYS:
        raise MetaError(f"an object of {len(pairs)} keys; the limit is {MAX_META_KEYS}")
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise MetaError(f"duplicate key {dup[:64]!r}")
    return out


def parse_meta(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The metadata dict in JSON bytes ``raw``, checked (raises :class:`MetaError`).

    ``max_depth`` counts the top-level object as 1; lowband's own messages have depth 1.
    Cost is linear in ``len(raw)``; the caller bounds that length.
    """
    depth = _depth(raw)
    if depth > max_depth:
        raise MetaError(f"nests {depth} deep; the limit is {max_depth}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetaError(f"not valid UTF-8 (byte {e.start} of the meta)") from None
    try:
        meta = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant, object_pairs_hook=_object)
    except MetaError:
        raise
    except RecursionError:  # pragma: no cover - the depth check above comes first
        raise MetaError(f"nests deeper than {max_depth}") from None
    except ValueError as e:  # json.JSONDecodeError
        raise MetaError(f"not valid JSON: {str(e).splitlines()[0] if str(e) else e!r}") from None
    if not isinstance(meta, dict):
        raise MetaError(f"is not a JSON object (got a {type(meta).__name__})")
    check_meta(meta, max_depth)
    return meta
