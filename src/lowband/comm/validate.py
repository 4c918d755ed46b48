"""Every receiver distrusts its inbox (design rule 8): one validation mechanism for all algorithms.

A decoded message is checked where it is delivered (:meth:`lowband.comm.network.Network.receive`,
used by the serial round and by the Ray shards alike), never inside an algorithm:

- ``nonfinite``: a floating tensor (or a float metadata value) holds NaN or +-Inf.
  Always checked.
- ``shape`` / ``dtype``: a tensor whose name is a parameter (or buffer) of the receiver's
  own model must have that entry's shape and dtype (the codecs restore the sender's
  dtype, so a float16 tensor where the model holds float32 did not come from a codec).
  Names the receiver's model does not have (logits, masks, indices, ...) are not
  constrained. Kinds an algorithm declares in ``Algorithm.partial_kinds`` (sub-models,
  e.g. FedSPU's selected rows) need only the entry's rank and no larger dimension. The receiver's model is the one :class:`ExpectedShapes` builds for its
  architecture, so a mixed federation checks each node against its own architecture.
- ``malformed``: the bytes do not decode (a :class:`~lowband.comm.wire.WireError`).
- ``norm`` (``norm_factor``; the config's default is 100, 0 turns it off): within one receiver's inbox of one step,
  among the messages of the same kind (at least :data:`NORM_MIN_GROUP` of them), a
  message whose L2 norm (over all its floating tensors) exceeds
  ``norm_factor`` times the median norm of the group is an outlier. The median includes
  the outlier itself, so with at least three messages one outlier cannot move it far; a
  group whose median is 0 is not screened. For weight-like messages the norm is the
  model's norm, which catches explosions (``lr=1e6``) rather than subtle poisoning.

- ``stale`` (``freshness``, off by default: it adds the stamp's bytes to every message):
  the sender's network stamps each message with the (round, step) it was sent in
  (metadata ``fresh = "round:step"``, encoded and counted with the message); a receiver
  refuses a message without the stamp, from another round, or (where it knows its own
  step) not from the step just before its own: a message replayed from an earlier round or
  step, or delivered out of order, is refused with a counted reason. The stamp is removed
  before the algorithm sees the message.

A rejected message is not delivered: the receiver's inbox lacks it, while the ledger has
already counted its bytes (they crossed the link). Each rejection is a :class:`Rejection`
the round collects and the run log counts per round as ``rejected/<reason>``. With
``on_invalid = "abort"`` the first rejection raises :class:`InvalidMessageError` instead,
naming round, sender, receiver, kind and reason.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Literal, Mapping, Optional, Sequence

import torch

from .message import Message

REASONS: tuple[str, ...] = ("nonfinite", "shape", "dtype", "malformed", "norm", "stale")
"""Why a message can be rejected (the ``rejected/<reason>`` metric keys)."""

NORM_MIN_GROUP = 3
"""Fewest same-kind messages in one inbox for the norm screen to apply (a median of two
is the mean of a clean and a poisoned value)."""

Expectation = Mapping[str, tuple[tuple[int, ...], torch.dtype]]
"""name -> (shape, dtype) of the entries of a receiver's model."""


class InvalidMessageError(RuntimeError):
    """A message failed validation under ``on_invalid = "abort"`` (not a config error)."""

    def __init__(self, rejection: "Rejection"):
        self.rejection = rejection
        super().__init__(f"aborted ([comm] on_invalid = \"abort\"): {rejection.describe()}")


@dataclass(frozen=True)
class Rejection:
    """One message refused by one receiver."""

    round: int
    src: int
    dst: int
    kind: str
    reason: str
    detail: str = ""

    def describe(self) -> str:
        what = f"{self.kind!r} message" if self.kind else "message"
        return (f"round {self.round}: rejected a {what} from node {self.src} to node {self.dst}: "
                f"{self.reason}" + (f" ({self.detail})" if self.detail else ""))


@dataclass(frozen=True)
class ValidationPolicy:
    """What the receivers check and what a failed check does (``[comm]`` of the config)."""

    on_invalid: Literal["reject", "abort"] = "reject"
    norm_factor: Optional[float] = None
    check_shapes: bool = True
    #: message kinds whose tensors may be slices of the model's entries (same rank, no
    #: dimension larger): the algorithm's ``partial_kinds``
    partial_kinds: frozenset[str] = frozenset()
    #: bind every message to the (round, step) it was sent in and refuse replays (``stale``)
    freshness: bool = False

    def __post_init__(self) -> None:
        if self.on_invalid not in ("reject", "abort"):
            raise ValueError(f"on_invalid must be 'reject' or 'abort', got {self.on_invalid!r}")
        if self.norm_factor is not None and not (math.isfinite(self.norm_factor) and self.norm_factor > 1):
            raise ValueError(f"norm_factor must be a finite number > 1 (or unset), got {self.norm_factor!r}")


class ExpectedShapes:
    """node -> the :data:`Expectation` of its model, built once per architecture.

    ``init_params(node)`` gives the node's initial parameters (the run's
    :class:`~lowband.engine.simulator.ModelBuilder.init_params`), ``model_key(node)`` its
    architecture. Picklable when both callables are (Ray ships it with the shard)."""

    def __init__(self, init_params: Callable[[int], Mapping[str, torch.Tensor]],
                 model_key: Callable[[int], str]):
        self.init_params, self.model_key = init_params, model_key
        self._cache: dict[str, Expectation] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": {}}

    def __call__(self, node: int) -> Expectation:
        key = self.model_key(node)
        if key not in self._cache:
            self._cache[key] = {k: (tuple(v.shape), v.dtype)
                                for k, v in self.init_params(node).items()}
        return self._cache[key]


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite. For a real floating tensor: ``aminmax``, one
    pass and no ``n``-sized temporary (NaN propagates to both extremes, +-Inf is one of
    them), several times faster than ``isfinite(t).all()``; complex tensors use ``isfinite``."""
    if t.numel() == 0:
        return True
    if t.is_complex():
        return bool(torch.isfinite(t).all())
    lo, hi = torch.aminmax(t.detach())
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def content_problem(msg: Message) -> Optional[tuple[str, str]]:
    """``(reason, detail)`` when a floating tensor or float metadata value is non-finite."""
    for name, t in msg.tensors.items():
        if (t.is_floating_point() or t.is_complex()) and not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            return "nonfinite", f"{bad} non-finite value(s) in {name!r}"
    for key, v in msg.meta.items():
        if isinstance(v, float) and not math.isfinite(v):
            return "nonfinite", f"metadata {key!r} = {v}"
    return None


def shape_problem(msg: Message, expected: Expectation, partial: bool = False) -> Optional[tuple[str, str]]:
    """``(reason, detail)`` when a tensor named like an entry of the receiver's model does
    not have that entry's shape (``partial``: its rank, with no dimension larger) or dtype."""
    for name, t in msg.tensors.items():
        exp = expected.get(name)
        if exp is None:
            continue
        shape, dtype = exp
        got = tuple(t.shape)
        if got != shape and not (partial and len(got) == len(shape) and all(a <= b for a, b in zip(got, shape))):
            return "shape", (f"{name!r} has shape {list(got)}, the receiver's model has "
                             f"{list(shape)}{' (or a slice of it)' if partial else ''}")
        if t.dtype != dtype:
            return "dtype", f"{name!r} is {t.dtype}, the receiver's model has {dtype}"
    return None


def _sum_of_squares(t: torch.Tensor) -> float:
    """``sum(t ** 2)``: a float32 dot product (one pass, no temporary) for a float32 tensor,
    redone in float64 when it overflows float32 (or is not finite); float64 otherwise."""
    t = t.detach()
    if t.dtype == torch.float32 and t.numel() > 0:
        v = t.reshape(-1)
        s = float(torch.dot(v, v))
        if math.isfinite(s):
            return s
    return float(t.to(torch.float64).pow(2).sum())


def message_norm(msg: Message) -> float:
    """L2 norm over all floating tensors of ``msg`` (each tensor's sum of squares accumulated
    in float32, or float64 where float32 would overflow: the screen compares norms with a
    factor of the median, far above the rounding)."""
    total = 0.0
    for t in msg.tensors.values():
        if t.is_floating_point():
            total += _sum_of_squares(t)
    return math.sqrt(total)


def norm_outliers(msgs: Sequence[Message], factor: float) -> dict[int, str]:
    """Positions in ``msgs`` (one receiver's inbox of one step) rejected by the norm screen,
    with a detail line; see the module docstring for the rule."""
    groups: dict[str, list[int]] = {}
    for i, m in enumerate(msgs):
        groups.setdefault(m.kind, []).append(i)
    out: dict[int, str] = {}
    for idx in groups.values():
        if len(idx) < NORM_MIN_GROUP:
            continue
        norms = [message_norm(msgs[i]) for i in idx]
        med = statistics.median(norms)
        if not (med > 0 and math.isfinite(med)):
            continue
        for i, n in zip(idx, norms):
            if n > factor * med:
                out[i] = f"norm {n:.4g} > {factor:g} x median {med:.4g} of {len(idx)} {msgs[i].kind!r} messages"
    return out


class Validator:
    """Applies a :class:`ValidationPolicy` at a receiver; see the module docstring.

    ``expected`` (node -> :data:`Expectation`) enables the shape/dtype check; without it
    only content (and, if configured, norms) is checked."""

    def __init__(self, policy: ValidationPolicy = ValidationPolicy(),
                 expected: Optional[Callable[[int], Expectation]] = None):
        self.policy = policy
        self.expected = expected if policy.check_shapes else None

    def reject(self, rejection: Rejection, sink: list[Rejection]) -> None:
        """Record ``rejection`` in ``sink``; raise it instead under the abort policy."""
        if self.policy.on_invalid == "abort":
            raise InvalidMessageError(rejection)
        sink.append(rejection)

    def check(self, msg: Message, dst: int) -> Optional[tuple[str, str]]:
        """``(reason, detail)`` of the first problem of ``msg`` at receiver ``dst``, or None."""
        return content_problem(msg) or self.check_shape(msg, dst)

    def check_shape(self, msg: Message, dst: int) -> Optional[tuple[str, str]]:
        """The receiver-specific part of :meth:`check` (names/shapes/dtypes of ``dst``'s model)."""
        if self.expected is None:
            return None
        return shape_problem(msg, self.expected(dst), msg.kind in self.policy.partial_kinds)

    def screen(self, round: int, dst: int, inbox: list, sink: list[Rejection]) -> list:
        """Drop norm outliers from ``inbox`` (a list of envelopes with ``.src`` and
        ``.msg``) of receiver ``dst``; returns the kept envelopes in order."""
        if self.policy.norm_factor is None or len(inbox) < NORM_MIN_GROUP:
            return inbox
        bad = norm_outliers([e.msg for e in inbox], self.policy.norm_factor)
        if not bad:
            return inbox
        kept = []
        for i, e in enumerate(inbox):
            if i in bad:
                self.reject(Rejection(round, e.src, dst, e.msg.kind, "norm", bad[i]), sink)
            else:
                kept.append(e)
        return kept


FRESH_KEY = "fresh"
"""The metadata key of the freshness stamp ``"round:step"``."""


def stamp(msg: Message, round: int, step: int) -> Message:
    """``msg`` with the freshness stamp (a shallow copy: tensors shared, metadata new)."""
    return Message(msg.kind, msg.tensors, {**msg.meta, FRESH_KEY: f"{int(round)}:{int(step)}"}, msg.declared,
                   msg.stand_in)


def freshness_problem(msg: Message, round: int, step: Optional[int] = None) -> Optional[tuple[str, str]]:
    """``("stale", detail)`` unless ``msg`` carries the stamp of round ``round`` (and, when
    ``step`` is given, of that step)."""
    raw = msg.meta.get(FRESH_KEY)
    parts = raw.split(":") if isinstance(raw, str) else []
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 12 for p in parts):
        return "stale", "no 'round:step' freshness stamp"
    got = [int(p) for p in parts]
    if got[0] != int(round) or (step is not None and got[1] != int(step)):
        want = f"round {round}" + (f", step {step}" if step is not None else "")
        return "stale", f"stamped round {got[0]}, step {got[1]}; expected {want} (a replayed or re-ordered message)"
    return None


def count_reasons(rejections: Iterable[Rejection]) -> dict[str, int]:
    """reason -> number of rejections."""
    out: dict[str, int] = {}
    for r in rejections:
        out[r.reason] = out.get(r.reason, 0) + 1
    return out


__all__ = ["FRESH_KEY", "freshness_problem", "stamp", "REASONS", "NORM_MIN_GROUP", "Expectation", "ExpectedShapes", "InvalidMessageError", "Rejection",
           "ValidationPolicy", "Validator", "all_finite", "content_problem", "count_reasons", "message_norm", "norm_outliers",
           "shape_problem"]
