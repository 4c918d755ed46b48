"""The Network: encode each message with its link's codec, count the bytes, deliver.

``send`` is the whole of design rule 2 in one call: the sender's message becomes
``bytes`` (:func:`~lowband.comm.wire.encode_message`), the ledger records
``len(bytes)`` (plus declared bytes, apart), and the receiver gets
:func:`~lowband.comm.wire.decode_message` of those bytes: what survived the codec, never
the sender's objects. ``encode`` / ``deliver`` are the two halves, for a distributed
backend where the bytes really travel between processes.

A message may carry ``stand_in`` tensors (the equivalent inputs of a declared payload,
see :mod:`lowband.comm.message`): they are not encoded, not counted, and reach the
receiver as clones; a stand-in without a declared entry is refused with a ValueError.

The codec's randomness is addressed (rule 4): the generator of a transfer is
``torch_gen(seed, "codec", round, src, dst_or_"bcast", kind)``, so results do not depend
on the order in which messages are sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..seeding import torch_gen
from .codecs import Codec
from .ledger import Ledger
from .message import DIRECTIONS, SERVER, Message
from .wire import codec_from_spec, declared_bytes, decode_with_codec, encode_message


@dataclass
class CodecConfig:
    """Which codec each link uses: ``by_kind`` > ``by_direction`` > ``default``."""

    default: str = "fp32"
    by_kind: dict[str, str] = field(default_factory=dict)
    by_direction: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [d for d in self.by_direction if d not in DIRECTIONS]
        if bad:
            raise ValueError(f"codecs.by_direction: unknown direction(s) {bad}; "
                             f"allowed: {list(DIRECTIONS)}")
        for where, spec in [("default", self.default),
                            *((f"by_kind[{k!r}]", s) for k, s in self.by_kind.items()),
                            *((f"by_direction[{k!r}]", s) for k, s in self.by_direction.items())]:
            try:
                codec_from_spec(spec)
            except ValueError as e:
                raise ValueError(f"codecs.{where}: {e}") from None

    def spec_for(self, kind: str, direction: str) -> str:
        """The codec spec string for a message of ``kind`` on a ``direction`` link."""
        if kind in self.by_kind:
            return self.by_kind[kind]
        return self.by_direction.get(direction, self.default)


def infer_direction(src: int, dst: int) -> str:
    """``"up"`` into the server, ``"down"`` out of it, ``"peer"`` between nodes."""
    if dst == SERVER:
        return "up"
    if src == SERVER:
        return "down"
    return "peer"


class Network:
    """Encodes, counts and delivers messages (see the module docstring)."""

    def __init__(self, codecs: CodecConfig, ledger: Ledger, seed: int) -> None:
        self.codecs = codecs
        self.ledger = ledger
        self.seed = int(seed)

    def codec_for(self, kind: str, direction: str) -> Codec:
        """The parsed codec for ``kind`` on a ``direction`` link."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
        return codec_from_spec(self.codecs.spec_for(kind, direction))

    def _gen(self, round: int, src: int, dst: int | str, kind: str) -> torch.Generator:
        return torch_gen(self.seed, "codec", int(round), int(src),
                         dst if isinstance(dst, str) else int(dst), kind)

    @staticmethod
    def _check_stand_in(msg: Message) -> None:
        if msg.stand_in and not msg.declared:
            raise ValueError(f"message {msg.kind!r} carries stand_in {sorted(msg.stand_in)} but no declared "
                             f"tensor: a stand-in may travel uncounted only in place of a counted declared payload")

    @staticmethod
    def _attach(got: Message, stand_in: dict[str, torch.Tensor] | None) -> Message:
        if stand_in:
            got.stand_in = {k: v.detach().clone() for k, v in stand_in.items()}
        return got

    def encode(self, msg: Message, src: int, dst: int, *, round: int,
               direction: str | None = None) -> bytes:
        """The bytes ``src`` puts on the link to ``dst`` (direction inferred when omitted).

        ``msg.stand_in`` is not part of the bytes (pass it to :meth:`deliver`)."""
        self._check_stand_in(msg)
        direction = direction or infer_direction(src, dst)
        codec = self.codec_for(msg.kind, direction)
        return encode_message(msg, codec, self._gen(round, src, dst, msg.kind))

    def deliver(self, data: bytes, src: int, dst: int, *, round: int,
                direction: str | None = None, declared: int | None = None,
                stand_in: dict[str, torch.Tensor] | None = None) -> Message:
        """Count ``data`` in the ledger and decode it for ``dst``.

        ``declared`` defaults to the declared bytes computed from the header (declared
        shapes under the codec the header names). ``stand_in`` (uncounted) is attached
        to the decoded message as clones; it needs a declared entry in ``data``.
        """
        direction = direction or infer_direction(src, dst)
        msg, codec = decode_with_codec(data)
        if stand_in and not msg.declared:
            raise ValueError(f"message {msg.kind!r}: stand_in given but the message declares no tensor")
        if declared is None:
            declared = declared_bytes(msg, codec)
        self.ledger.record(round, src, dst, direction, msg.kind, len(data), declared)
        return self._attach(msg, stand_in)

    def send(self, msg: Message, src: int, dst: int, *, round: int,
             direction: str) -> Message:
        """Encode, count ``len(bytes)`` (+ declared), decode: what ``dst`` receives."""
        data = self.encode(msg, src, dst, round=round, direction=direction)
        return self.deliver(data, src, dst, round=round, direction=direction, stand_in=msg.stand_in)

    def broadcast(self, msg: Message, src: int, dsts: list[int], *, round: int,
                  direction: str) -> dict[int, Message]:
        """Encode once, count ``len(bytes)`` once per receiver, give each its own copy."""
        dsts = list(dsts)
        if not dsts:
            return {}
        if len(set(dsts)) != len(dsts):
            raise ValueError(f"broadcast: duplicate receivers in {dsts}")
        self._check_stand_in(msg)
        codec = self.codec_for(msg.kind, direction)
        data = encode_message(msg, codec, self._gen(round, src, "bcast", msg.kind))
        got, codec = decode_with_codec(data)
        self.ledger.record_many(round, src, dsts, direction, got.kind, len(data),
                                declared_bytes(got, codec))
        out = {dsts[0]: got}
        for d in dsts[1:]:
            out[d] = got.clone()
        for m in out.values():
            self._attach(m, msg.stand_in)
        return out
