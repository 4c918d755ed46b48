"""Distrust at the Flower boundary (issue 14 part 4, design rule 8).

What the ServerApp accepts from a ClientApp, and what a ClientApp agrees to run for a
ServerApp. Every check here raises :class:`Rejected` with a *reason* (the suffix of
the ``rejected/<reason>`` counter the ServerApp writes to metrics.jsonl) and one line
saying what was wrong; the ServerApp drops the offending reply, counts it, logs the
first one of each reason, and the round goes on with the remaining replies.

Reasons (the simulator's names where it has them):

- ``wire``: bytes the server will not decode: over the reply budget, not wire format,
  a codec other than the run's for that kind, declared tensors, a malformed record;
- ``kind``: a Flower reply of another message type than the request, or a lowband
  message kind no server-family client sends (:data:`UPLOAD_KINDS`);
- ``sender``: a reply from a node that was not asked;
- ``duplicate``: a second reply of a client in one step, or a second message of one
  kind in a client's reply (exactly one counts: the first);
- ``nonfinite``: NaN or infinite values in a float tensor;
- ``shape`` / ``dtype``: a tensor named like a model parameter with another shape or
  dtype (:func:`lowband.comm.validate.shape_problem`, the simulator's rule), a float tensor
  that is not float32 (what every built-in client sends), a complex tensor;
- ``num_examples``: not a positive integer, or more than the client's training split
  (the server builds the same partition, so it knows every client's size);
- ``meta``: a non-finite float in the metadata, or a key the server's step needs and
  the reply lacks (found when the step reads it: see :class:`StrictMeta`);
- ``metrics``: evaluation numbers out of range (accuracy outside [0, 1], a negative or
  non-finite loss, a test count above the client's test split, a missing key);
- ``error``: the client reported an error; ``missing``: no reply before the timeout.
- ``stale`` (``comm.freshness``): a message not stamped with the round and step the
  server asked for (:func:`lowband.comm.validate.freshness_problem`): a reply replayed
  from an earlier round or step.

The shared mechanisms are used, not repeated: :func:`decode_reply` decodes with the wire
decoder's :class:`~lowband.comm.wire.DecodeBudget` (sizes checked against the bytes present
and the budget before anything is allocated; metadata schema), and :func:`check_tensors`
applies the simulator's receiver-side rules (:mod:`lowband.comm.validate`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from lowband.comm.message import Message
from lowband.comm.validate import content_problem, shape_problem
from lowband.comm.wire import DecodeBudget, WireError, decode_with_codec

__all__ = [
    "REASONS", "UPLOAD_KINDS", "Rejected", "ReplyBudget", "budget_for", "decode_reply", "check_tensors",
    "check_upload", "check_meta", "check_eval", "StrictMeta", "MissingMeta", "checked_round", "MAX_MESSAGES",
]

REASONS: tuple[str, ...] = ("wire", "kind", "sender", "duplicate", "nonfinite", "shape", "dtype", "num_examples",
                            "meta", "metrics", "error", "missing", "stale", "dead")

UPLOAD_KINDS: frozenset[str] = frozenset({"weights", "delta", "control_delta", "packs", "dbe_mean", "logits"})
"""Lowband message kinds a server-family client sends up (every built-in algorithm's;
``tests/test_flower_hostile.py`` runs each server-family algorithm through the adapter
and fails when one sends a kind missing here). An algorithm may widen it with a class
attribute ``upload_kinds``."""

MAX_MESSAGES = 16
"""Most messages one reply (or one server instruction) may carry; more is malformed."""

_KIND_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}\Z")


class Rejected(Exception):
    """A reply (or instruction) the receiver drops: ``reason`` names the counter."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:  # pragma: no cover - a programming error
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class ReplyBudget:
    """What one decoded message may cost the receiver: its length in bytes and the
    number of elements its tensors decode into (codecs such as top-k carry the
    original shape, so a tiny message could otherwise claim a huge tensor)."""

    max_bytes: int
    max_elements: int

    def decode_budget(self) -> DecodeBudget:
        """The wire decoder's budget with these two limits (the others at their defaults:
        metadata length and depth, number of tensors)."""
        return DecodeBudget(max_elements=self.max_elements, max_bytes=self.max_bytes)


def budget_for(sim: Any) -> ReplyBudget:
    """The per-message budget of a run, derived from what the receiver expects: the
    largest model of the federation, or the logits of the public set, with 4x slack
    (masks, indices, a head beside a body) and a fixed allowance for the header."""
    sizes = [int(sim.model_size), *(int(v) for v in getattr(sim, "model_sizes", {}).values())]
    public = getattr(sim.fed, "public_x", None)
    if public is not None and public.numel():
        sizes.append(int(public.shape[0]) * int(sim.fed.num_classes))
    elements = 4 * max(sizes) + 4096
    return ReplyBudget(max_bytes=16 * elements + (1 << 20), max_elements=elements)


def decode_reply(data: Any, budget: ReplyBudget, codec_for: Callable[[str], str]) -> Message:
    """Decode one message a peer sent, within ``budget``; ``codec_for(kind)`` is the codec
    spec the run configured for that kind on this link: any other codec is refused, so
    the receiver only ever runs decoders it chose. Raises :class:`Rejected` (``wire`` or
    ``kind``), never anything else, whatever the bytes."""
    if not isinstance(data, (bytes, bytearray)):
        raise Rejected("wire", f"a message is a {type(data).__name__}, not bytes")
    if len(data) > budget.max_bytes:
        raise Rejected("wire", f"a message of {len(data)} bytes exceeds the budget of {budget.max_bytes}")
    try:
        msg, codec = decode_with_codec(bytes(data), budget.decode_budget())
    except WireError as e:
        raise Rejected("wire", str(e).splitlines()[0] if str(e) else "malformed message") from None
    except Exception as e:  # noqa: BLE001 - hostile bytes must not end the receiver (RecursionError, ...)
        raise Rejected("wire", f"undecodable message ({type(e).__name__})") from None
    if not isinstance(msg.kind, str) or not _KIND_RE.match(msg.kind):
        raise Rejected("kind", f"message kind {str(msg.kind)[:40]!r} is not a short identifier")
    if msg.declared:
        raise Rejected("wire", f"message {msg.kind!r} declares tensors {sorted(msg.declared)[:3]}; Flower carries "
                               f"only encoded bytes")
    expected = codec_for(msg.kind)
    if codec.spec != expected:
        raise Rejected("wire", f"message {msg.kind!r} uses codec {codec.spec[:40]!r}; this run uses {expected!r}")
    return msg


# --------------------------------------------------------------------------- contents

Expected = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


def check_tensors(msg: Message, expected: Optional[Expected] = None, partial: bool = False) -> None:
    """Non-finite values and wrong shapes/dtypes (reasons ``nonfinite``, ``shape``, ``dtype``).

    ``expected``: name -> (shape, dtype) of the tensors the receiver knows (the server's
    model; ``partial``: a declared sub-model, see ``Algorithm.partial_kinds``); the rules
    are the simulator's (:func:`lowband.comm.validate.shape_problem` and
    :func:`~lowband.comm.validate.content_problem`). On top, since no built-in client
    sends anything else: a floating tensor must be float32, and none may be complex."""
    for name, t in msg.tensors.items():
        if t.is_complex() or (t.is_floating_point() and t.dtype != torch.float32):
            raise Rejected("dtype", f"tensor {name!r} arrived as {t.dtype}; clients send float32")
    problem = shape_problem(msg, expected, partial) if expected is not None else None
    problem = problem or content_problem(msg)
    if problem is not None:
        raise Rejected(*problem)


def check_meta(meta: Mapping[str, Any], max_examples: int) -> None:
    """``num_examples`` a positive int no larger than ``max_examples`` (the client's
    training split); every value a scalar, every float finite."""
    if "num_examples" in meta:
        n = meta["num_examples"]
        if type(n) is not int:
            raise Rejected("num_examples", f"num_examples = {str(n)[:40]} is a {type(n).__name__}, not an integer")
        if not 1 <= n <= max_examples:
            raise Rejected("num_examples", f"num_examples = {str(n)[:40]} is outside 1..{max_examples} "
                                           f"(the client's training split)")
    for k, v in meta.items():
        if not (v is None or type(v) in (bool, int, float, str)):
            raise Rejected("meta", f"meta[{str(k)[:40]!r}] is a {type(v).__name__}, not a scalar")
        if isinstance(v, float) and not math.isfinite(v):
            raise Rejected("meta", f"meta[{str(k)[:40]!r}] = {v}")


def check_upload(msg: Message, *, kinds: frozenset[str], expected: Optional[Expected], max_examples: int) -> None:
    """Everything the server checks on one decoded client message."""
    if msg.kind not in kinds:
        raise Rejected("kind", f"message kind {msg.kind!r} is not one a client sends (known: {sorted(kinds)})")
    check_meta(msg.meta, max_examples)
    check_tensors(msg, expected)


class MissingMeta(KeyError):
    """A server step read a metadata key that client ``src``'s message does not carry."""

    def __init__(self, src: int, key: str) -> None:
        super().__init__(key)
        self.src = src
        self.key = key


class StrictMeta(dict):
    """A message's metadata as the server's step sees it: reading a missing key raises
    :class:`MissingMeta` naming the sender, so the ServerApp can drop that one reply
    (reason ``num_examples`` or ``meta``) and run the step again without it, instead of
    a bare KeyError ending the run. ``get`` and ``in`` behave as for a dict."""

    def __init__(self, src: int, meta: Mapping[str, Any]) -> None:
        super().__init__(meta)
        self.src = src

    def __missing__(self, key: str) -> Any:
        raise MissingMeta(self.src, key)


# --------------------------------------------------------------------------- evaluation

_EVAL_KEYS = {"personal": ("personal/acc", "personal/loss", "personal/n"),
              "node_global": ("node_global/acc", "node_global/loss")}


def _number(rec: Mapping[str, Any], key: str) -> float:
    if key not in rec:
        raise Rejected("metrics", f"{key} is missing")
    v = rec[key]
    if type(v) not in (int, float):
        raise Rejected("metrics", f"{key} is a {type(v).__name__}")
    return float(v)


def _acc_loss(rec: Mapping[str, Any], prefix: str) -> tuple[float, float]:
    acc, loss = _number(rec, f"{prefix}/acc"), _number(rec, f"{prefix}/loss")
    if not 0.0 <= acc <= 1.0:
        raise Rejected("metrics", f"{prefix}/acc = {acc} is outside [0, 1]")
    if not (math.isfinite(loss) and loss >= 0.0):
        raise Rejected("metrics", f"{prefix}/loss = {loss} is not a finite number >= 0")
    return acc, loss


def check_eval(rec: Mapping[str, Any], protocols: list[str], n_test: int) -> dict[str, float]:
    """A client's evaluation numbers, in range: ``protocols`` were asked for; ``n_test``
    is the client's test split. A client without a model (or, for ``personal``, without
    test data) reports NaN accuracy and loss, which stays allowed."""
    out: dict[str, float] = {}
    if "personal" in protocols:
        n = _number(rec, "personal/n")
        if n != int(n) or not 0 <= n <= n_test:
            raise Rejected("metrics", f"personal/n = {n} is not a count in 0..{n_test} (the client's test split)")
        if n == 0:
            out.update({"personal/acc": math.nan, "personal/loss": math.nan, "personal/n": 0})
        else:
            acc, loss = _acc_loss(rec, "personal")
            out.update({"personal/acc": acc, "personal/loss": loss, "personal/n": int(n)})
    if "node_global" in protocols:
        acc, loss = _number(rec, "node_global/acc"), _number(rec, "node_global/loss")
        if math.isnan(acc) and math.isnan(loss):  # the client holds no model of its own
            out.update({"node_global/acc": math.nan, "node_global/loss": math.nan})
        else:
            out.update(zip(("node_global/acc", "node_global/loss"), _acc_loss(rec, "node_global")))
    return out


# --------------------------------------------------------------------------- client side


def checked_round(value: Any, lo: int, hi: int, what: str = "round") -> int:
    """A round number sent by the server: an int in ``lo..hi``, else a ValueError."""
    if type(value) is not int:
        raise ValueError(f"{what} must be an integer, got {type(value).__name__} {str(value)[:40]}")
    if not lo <= value <= hi:
        raise ValueError(f"{what} = {value} is outside {lo}..{hi} (the experiment's rounds)")
    return value
