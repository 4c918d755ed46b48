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

Every receiver distrusts its inbox (design rule 8): with a
:class:`~lowband.comm.validate.Validator` attached, :meth:`Network.receive` (the one
delivery path of the serial round, the Ray shards and :meth:`deliver`) refuses a message
that does not decode, holds non-finite values or does not fit the receiver's model, and
:meth:`Network.screen` drops norm outliers from a receiver's inbox. A refused message is
not delivered but its bytes stay counted; the refusals collect in
:attr:`Network.rejections` (the run drains them each round). A message whose codec cannot
encode it because of non-finite values (``int8``) is refused at the sender: nothing
crosses the link and nothing is counted. Without a validator (the default) every
message is delivered as before.

Codecs with state (``ef(...)``, ``powersgd(r)``) keep it in :attr:`Network.codec_states`,
per sender, link (the receiver, or ``bcast`` for a message encoded once for several
receivers, and the message kind) and tensor name: the sender's private state, never
sent. A backend that encodes where the senders live (a Ray shard) keeps its senders'
states in its own network; the run checkpoints them (:meth:`codec_state_dict`).

EF21 (``ef21(...)``, :class:`~lowband.comm.codecs.memory.EF21`) keeps an estimate at both ends
of a link: the sender's under the link ``"<receiver>:<kind>"``, the receiver's mirror in
the receiver's own entry under ``"from:<sender>:<kind>"`` (checkpointed with it, never
sent); a broadcast is encoded once per receiver, against each link's estimate. Encoding
reads the sender's estimate only; when a receiver *accepts* the message (:meth:`receive`,
after the validator's checks) both copies move by the decoded correction, and the
receiver gets its new estimate. A message that is not delivered
(dropout, a deadline, a step nobody reads) or is refused moves neither, so the copies stay
equal; delivering the acknowledgement back to the sender is not counted (a real link
would need one, e.g. a transport-level ack).

Where the two ends live in different places (worker processes, Ray shards: :attr:`remote`
says which senders live elsewhere), the commit is split by an acknowledgement: the
receiver's network moves the mirror on acceptance and appends an :data:`Ack` (link and a
digest of each new estimate) to :attr:`acks`; the sender's network keeps the bytes of each
message to a remote receiver in :attr:`in_flight` and, given the ack
(:meth:`apply_acks`, before its next step), moves its estimate by the same decoded
correction and checks the digests, so the copies stay bit-equal. The round loop
(:mod:`lowband.engine.rounds`) carries the acks to the senders' places with the next
step, and at the end of the round, before a checkpoint. A message's ack reaches its
sender one step after the serial loop would have moved the estimate, so a sender that
uses a link again in the step right after (its previous message still unacknowledged)
is refused with a RuntimeError rather than encoding against a stale estimate.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..seeding import torch_gen
from .codecs import Codec, is_stateful
from .ledger import Ledger
from .codecs.memory import has_receiver_state
from .message import DIRECTIONS, SERVER, Message
from .validate import FRESH_KEY, Rejection, Validator, content_problem, freshness_problem, stamp
from .wire import WireError, codec_from_spec, declared_bytes, decode_with_codec, encode_message


@dataclass
class CodecConfig:
    """Which codec each link uses: ``by_kind`` > ``by_direction`` > ``default``."""

    default: str = "fp32"
    by_kind: dict[str, str] = field(default_factory=dict)
    by_direction: dict[str, str] = field(default_factory=dict)
    #: sender-side transform before the codec (local DP, lowband.privacy.transforms), e.g.
    #: "clip(1.0)+gauss(0.5)"; "" for none
    transform: str = ""

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
        if self.transform:
            from ..privacy.transforms import parse_transform

            parse_transform(self.transform)  # one-line ValueError naming what is wrong

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


def link_direction(src: int, dsts: tuple[int, ...]) -> str:
    """The ledger direction of a message from ``src`` to ``dsts`` ("down", "up", "peer")."""
    if src == SERVER:
        return "down"
    if len(dsts) == 1 and dsts[0] == SERVER:
        return "up"
    if SERVER in dsts:
        raise ValueError("a broadcast may not mix the server and peers")
    return "peer"


@dataclass
class Transfer:
    """One outbox entry as it leaves its sender: the wire bytes and the ledger facts.

    ``data`` is None when the codec could not encode the message because of non-finite
    values (refused at the sender, see :meth:`Network.encode_outbox`): nothing was sent."""

    src: int
    index: int  # position in the sender's outbox (the serial delivery order is (src, index))
    dsts: tuple[int, ...]
    direction: str
    kind: str
    data: Optional[bytes]
    declared: int
    stand_in: dict[str, torch.Tensor]


#: an EF21 acknowledgement: (sender, receiver, kind, {tensor: digest of the receiver's new estimate})
Ack = tuple[int, int, str, dict[str, bytes]]


def estimate_digest(g: torch.Tensor) -> bytes:
    """A digest of an EF21 estimate's bytes (what an ack carries instead of the tensor)."""
    return hashlib.blake2b(g.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).digest()


class Network:
    """Encodes, counts and delivers messages (see the module docstring)."""

    def __init__(self, codecs: CodecConfig, ledger: Ledger, seed: int,
                 validator: Optional[Validator] = None, device: Optional[torch.device] = None) -> None:
        self.codecs = codecs
        #: where the receivers compute (the run's ``device``): decoded tensors are moved
        #: there on receipt; None: they stay on the CPU, where the wire decodes them
        self.device = device
        self.ledger = ledger
        self.seed = int(seed)
        self.validator = validator
        #: messages refused since the caller last emptied the list (reject policy)
        self.rejections: list[Rejection] = []
        #: sender -> link ("<receiver>:<kind>" or "bcast:<kind>") -> tensor name -> codec
        #: state: what stateful codecs keep at each sender (see the module docstring)
        self.codec_states: dict[int, dict[str, dict[str, dict[str, torch.Tensor]]]] = {}
        #: one place of several (worker processes, Ray shards): whether a node's codec
        #: states live in another place; None: every sender and receiver is here
        self.remote: Optional[Callable[[int], bool]] = None
        #: EF21 acks of accepted messages from remote senders, until the caller empties it
        self.acks: list[Ack] = []
        #: EF21 messages to remote receivers awaiting their ack:
        #: (sender, receiver, kind) -> ((round, step), wire bytes)
        self.in_flight: dict[tuple[int, int, str], tuple[tuple[int, int], bytes]] = {}
        #: (round, step index in the round) of the step being encoded (set by the place)
        self.step_tag: tuple[int, int] = (0, 0)
        #: privacy hook: the sender-side transform applied before the codec (codecs.transform)
        self.sender_transform = None
        if codecs.transform:
            from ..privacy.transforms import parse_transform

            self.sender_transform = parse_transform(codecs.transform)

    def _transformed(self, msg: Message, round: int, src: int, link: "int | str") -> Message:
        """privacy hook: ``msg`` through the sender-side transform (local DP), if any."""
        if self.sender_transform is None:
            return msg
        return self.sender_transform(msg, seed=self.seed, round=round, step=self.step_tag[1], src=src, link=link)

    # -- codec state (the senders' own, never sent) -----------------------------------------
    def codec_state(self, src: int, link: str) -> dict[str, dict[str, torch.Tensor]]:
        """The mutable codec state ``src`` keeps for ``link`` (created empty)."""
        return self.codec_states.setdefault(int(src), {}).setdefault(link, {})

    def codec_state_dict(self, nodes: Optional[set[int]] = None) -> dict[str, dict]:
        """The codec states of every sender (of ``nodes`` when given), for a checkpoint:
        ``{str(sender): {link: {tensor: {key: Tensor}}}}``."""
        return {str(src): {link: {t: dict(st) for t, st in per.items()} for link, per in links.items()}
                for src, links in sorted(self.codec_states.items()) if nodes is None or src in nodes}

    def load_codec_state_dict(self, sd: dict[str, dict]) -> None:
        """Replace the codec states by those of a checkpoint (:meth:`codec_state_dict`)."""
        self.codec_states = {int(src): {str(link): {str(t): dict(st) for t, st in per.items()}
                                        for link, per in links.items()} for src, links in sd.items()}

    def codec_for(self, kind: str, direction: str) -> Codec:
        """The parsed codec for ``kind`` on a ``direction`` link."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {list(DIRECTIONS)}, got {direction!r}")
        return codec_from_spec(self.codecs.spec_for(kind, direction))

    def _gen(self, round: int, src: int, dst: int | str, kind: str, codec: Any = None) -> torch.Generator:
        if codec is not None and getattr(codec, "spec", "").find("sharedmask") >= 0:
            from .codecs.shared import round_shared, shared_gen

            if round_shared(codec):  # the same coordinates for every sender of the round (summable)
                return shared_gen(self.seed, round, kind)
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
        state = self.codec_state(src, f"{int(dst)}:{msg.kind}") if is_stateful(codec) else None
        msg = self._transformed(msg, round, src, int(dst))
        return encode_message(msg, codec, self._gen(round, src, dst, msg.kind, codec), state)

    def decode(self, data: bytes) -> tuple[Message, Codec]:
        """Decode ``data`` (one place for the receiver's decode budget)."""
        return decode_with_codec(data)

    def _refuse(self, round: int, src: int, dsts: "tuple[int, ...] | list[int]", kind: str,
                problem: tuple[str, str]) -> None:
        assert self.validator is not None
        for d in dsts:
            self.validator.reject(Rejection(int(round), int(src), int(d), kind, *problem), self.rejections)

    def receive(self, data: Optional[bytes], src: int, dsts: "tuple[int, ...] | list[int]", *, round: int,
                kind: str = "", stand_in: Optional[dict[str, torch.Tensor]] = None,
                share: bool = False) -> dict[int, Message]:
        """Decode ``data`` once and give each of ``dsts`` its own copy, validated for it.

        ``share=True`` gives every accepted receiver the same decoded object instead of
        a clone each (memory: a broadcast to k receivers held once, not k times); the
        caller must then hand each receiver a private copy before it runs (the serial
        executor clones an ``Envelope(shared=True)`` just before the receiver's step).

        Counts nothing (see :meth:`record`). With a validator, a refused copy is left out of
        the result and recorded in :attr:`rejections` (or raised under the abort policy);
        ``data`` None (refused at the sender) is a ``nonfinite`` refusal for every receiver.
        ``kind`` names the message in a refusal of bytes that do not decode."""
        dsts = [int(d) for d in dsts]
        if not dsts:
            return {}
        if data is None:
            if self.validator is None:
                raise ValueError("receive: no bytes (the message was refused at the sender)")
            self._refuse(round, src, dsts, kind, ("nonfinite", "the codec cannot encode non-finite values; "
                                                               "nothing was sent"))
            return {}
        try:
            got, codec = self.decode(data)
        except WireError as exc:
            if self.validator is None:
                raise
            self._refuse(round, src, dsts, kind, ("malformed", str(exc).splitlines()[0] if str(exc) else "WireError"))
            return {}
        return self._hand_out(got, src, dsts, round, stand_in, share, codec)

    def _hand_out(self, got: Message, src: int, dsts: list[int], round: int,
                  stand_in: Optional[dict[str, torch.Tensor]], share: bool = False,
                  codec: Optional[Codec] = None) -> dict[int, Message]:
        """Validate a decoded message for each receiver; the first accepted receiver gets
        ``got`` itself, the others clones (or ``got`` too with ``share``). Under ``ef21``
        the accepted receiver gets its estimate, and both copies move (:meth:`_ef21_commit`)."""
        if stand_in and not got.declared:
            raise ValueError(f"message {got.kind!r}: stand_in given but the message declares no tensor")
        v = self.validator
        ef21 = codec is not None and has_receiver_state(codec)
        if ef21 and not self._ef21_made_by(codec, src, dsts, got.kind):  # type: ignore[arg-type]
            # our senders encode EF21 per link: these bytes were not made by one of them
            why = (f"codec {codec.spec}: no estimate of node {src} for link {dsts[0] if len(dsts) == 1 else dsts}:"
                   f"{got.kind} (EF21 encodes one message per receiver, against the link's estimate)")
            if v is None:
                raise ValueError(why)
            self._refuse(round, src, dsts, got.kind, ("malformed", why))
            return {}
        content = content_problem(got) if v is not None else None
        if v is not None and v.policy.freshness and content is None:
            # sent in the step before the receiver's (the round loop's step_tag), else in this round
            r, k = self.step_tag
            content = freshness_problem(got, round, k - 1 if r == int(round) and k > 0 else None)
            got.meta.pop(FRESH_KEY, None)
        out: dict[int, Message] = {}
        for d in dsts:
            problem = content or (v.check_shape(got, d) if v is not None else None)
            if problem is not None:
                self._refuse(round, src, [d], got.kind, problem)
                continue
            if share and out:
                out[d] = next(iter(out.values()))
            else:
                out[d] = self._attach(got if not out else got.clone(), stand_in)
        if ef21:
            for d, m in out.items():
                self._ef21_commit(codec, src, d, m)  # type: ignore[arg-type]
        if self.device is not None:  # decoded on the CPU; the receivers compute on the run's device
            from ..device import to_device

            moved: dict[int, Message] = {}  # by id: a shared message is moved once and stays shared
            for d, m in out.items():
                if id(m) not in moved:
                    moved[id(m)] = to_device(m, self.device)
                out[d] = moved[id(m)]
        return out

    def _ef21_made_by(self, codec: Codec, src: int, dsts: list[int], kind: str) -> bool:
        """Whether EF21 bytes from ``src`` to ``dsts`` can be one of our senders' messages:
        one receiver, and the sender's estimate here or (a remote sender) the run's codec
        for the link is this one."""
        if len(dsts) != 1:
            return False
        if self.remote is not None and self.remote(int(src)):
            return self.codec_for(kind, link_direction(int(src), (int(dsts[0]),))).spec == codec.spec
        return f"{int(dsts[0])}:{kind}" in self.codec_states.get(int(src), {})

    def _ef21_commit(self, codec: Codec, src: int, dst: int, msg: Message) -> None:
        """``dst`` accepted ``msg`` (EF21 corrections): move the sender's estimate and the
        receiver's mirror by each correction, check they are still equal, and give ``msg``
        the receiver's new estimate in place of the correction. A remote sender's estimate
        moves later, by the ack appended to :attr:`acks` (:meth:`apply_acks`)."""
        remote = self.remote is not None and self.remote(int(src))
        sent = None if remote else self.codec_states[int(src)][f"{int(dst)}:{msg.kind}"]  # checked by _hand_out
        mirror = self.codec_state(int(dst), f"from:{int(src)}:{msg.kind}")
        digests: dict[str, bytes] = {}
        for name, c in msg.tensors.items():
            if not c.is_floating_point():
                continue  # raw (non-float) tensors do not go through the codec
            g_recv = codec.step(mirror.get(name, {}), c)  # type: ignore[attr-defined]
            if sent is None:
                digests[name] = estimate_digest(g_recv)
            else:
                g_send = codec.step(sent.get(name, {}), c)  # type: ignore[attr-defined]
                if not torch.equal(g_recv, g_send):
                    raise RuntimeError(self._differ(codec, src, dst, msg.kind, name))
                sent[name] = {**sent.get(name, {}), "g": g_send}
            mirror[name] = {"g": g_recv}
            msg.tensors[name] = g_recv.clone()  # the receiver's step may change its inbox in place
        if sent is None:
            self.acks.append((int(src), int(dst), msg.kind, digests))

    @staticmethod
    def _differ(codec: Codec, src: int, dst: int, kind: str, name: str) -> str:
        return (f"codec {codec.spec}: the estimates of link {src}->{dst} ({kind!r}, tensor {name!r}) differ at "
                f"the sender and the receiver")

    def apply_acks(self, acks: list[Ack]) -> None:
        """Move our senders' EF21 estimates by the messages their remote receivers accepted
        (the receivers' :attr:`acks`): the same decoded correction of the bytes kept in
        :attr:`in_flight`, checked against the receiver's digest of its new estimate."""
        for src, dst, kind, digests in acks:
            entry = self.in_flight.pop((int(src), int(dst), kind), None)
            if entry is None:
                raise RuntimeError(f"EF21: node {dst} acknowledged a {kind!r} message from node {src} that is not "
                                   f"in flight")
            got, codec = self.decode(entry[1])
            sent = self.codec_states[int(src)][f"{int(dst)}:{kind}"]
            names = [n for n, c in got.tensors.items() if c.is_floating_point()]
            if sorted(names) != sorted(digests):
                raise RuntimeError(f"codec {codec.spec}: node {dst}'s ack of link {src}->{dst} ({kind!r}) names "
                                   f"tensors {sorted(digests)}, the message {sorted(names)}")
            for name in names:
                g_send = codec.step(sent.get(name, {}), got.tensors[name])  # type: ignore[attr-defined]
                if estimate_digest(g_send) != digests[name]:
                    raise RuntimeError(self._differ(codec, src, dst, kind, name))
                sent[name] = {**sent.get(name, {}), "g": g_send}

    def screen(self, round: int, inboxes: dict[int, list]) -> dict[int, list]:
        """Drop norm outliers from every receiver's inbox of one step (envelopes with
        ``.src`` and ``.msg``), in place and returned; a no-op without a norm factor."""
        v = self.validator
        if v is None or v.policy.norm_factor is None:
            return inboxes
        for dst in sorted(inboxes):
            inboxes[dst] = v.screen(round, dst, inboxes[dst], self.rejections)
        return inboxes

    # -- transfers (encode on the sending side, count, receive on the receiving side) ------
    def encode_outbox(self, round: int, src: int, items: list) -> list[Transfer]:
        """Encode ``src``'s outbox entries ``(dsts, msg)``: one transfer each, a broadcast
        (several receivers) encoded once for all of them with the ``"bcast"`` generator,
        exactly as :meth:`send` and :meth:`broadcast` do, without counting or decoding: the
        backends where the bytes really travel (Ray) call this on the sender's side.

        Under ``ef21`` a broadcast becomes one transfer per receiver (same ``index``), each
        encoded against that link's estimate: its receivers' copies differ (sampling,
        dropout), and the ledger counts a broadcast once per receiver anyway."""
        out: list[Transfer] = []
        links: set[tuple[int, str]] = set()  # EF21 links used in this outbox
        for index, (dsts, msg) in enumerate(items):
            dsts = tuple(int(d) for d in dsts)
            direction = link_direction(src, dsts)
            if not has_receiver_state(self.codec_for(msg.kind, direction)):
                out.append(self._encode(round, src, index, dsts, msg, direction, len(dsts) > 1))
                continue
            if len(set(dsts)) != len(dsts):
                raise ValueError(f"broadcast: duplicate receivers in {list(dsts)}")
            for d in dsts:
                if (d, msg.kind) in links:
                    raise WireError(f"codec {self.codecs.spec_for(msg.kind, direction)}: node {src} sends two "
                                    f"{msg.kind!r} messages to {d} in one step; EF21 encodes each against the "
                                    f"estimate of the last delivered one: send one per step")
                links.add((d, msg.kind))
                remote = self.remote is not None and self.remote(d)
                if remote:
                    self._check_acked(src, d, msg.kind, direction)
                t = self._encode(round, src, index, (d,), msg, direction, False)
                if remote and t.data is not None:
                    self.in_flight[(int(src), d, msg.kind)] = (self.step_tag, t.data)
                out.append(t)
        return out

    def _check_acked(self, src: int, dst: int, kind: str, direction: str) -> None:
        """Refuse to encode on an EF21 link to a remote receiver whose previous message was
        sent in the step just before: its ack arrives after this step's encoding, so the
        sender's estimate would be stale (the serial loop moves it on delivery)."""
        entry = self.in_flight.get((int(src), int(dst), kind))
        r, k = self.step_tag
        if entry is not None and entry[0] == (r, k - 1):
            raise RuntimeError(f"codec {self.codecs.spec_for(kind, direction)}: node {src} sends {kind!r} to node "
                               f"{dst} in two consecutive steps, and node {dst} lives in another worker, whose "
                               f"acknowledgement of the first arrives after the second is encoded; run this "
                               f"algorithm with engine.workers = 1 and executor = \"serial\", or use ef(...)")

    def _encode(self, round: int, src: int, index: int, dsts: tuple[int, ...], msg: Message,
                direction: str, bcast: bool) -> Transfer:
        if len(set(dsts)) != len(dsts):
            raise ValueError(f"broadcast: duplicate receivers in {list(dsts)}")
        self._check_stand_in(msg)
        codec = self.codec_for(msg.kind, direction)
        if bcast and has_receiver_state(codec):
            raise ValueError(f"codec {codec.spec}: a broadcast is encoded once per receiver under EF21 "
                             f"(Network.encode_outbox, Network.broadcast)")
        link = "bcast" if bcast else dsts[0]
        msg = self._transformed(msg, round, src, link)
        if self.validator is not None and self.validator.policy.freshness:  # bound to (round, step): counted
            msg = stamp(msg, round, self.step_tag[1] if self.step_tag[0] == int(round) else 0)
        gen = self._gen(round, src, link, msg.kind, codec)
        state = self.codec_state(src, f"{link}:{msg.kind}") if is_stateful(codec) else None
        try:
            data: Optional[bytes] = encode_message(msg, codec, gen, state)
        except WireError:
            # a codec that cannot carry NaN/Inf (int8): with a validator, a diverged
            # sender's message is refused at its own link, never a crash of the round
            if self.validator is None or content_problem(msg) is None:
                raise
            data = None
        return Transfer(int(src), index, dsts, direction, msg.kind, data, declared_bytes(msg, codec),
                        dict(msg.stand_in))

    def record(self, round: int, t: Transfer) -> None:
        """Count transfer ``t`` in the ledger, once per receiver (nothing if it was not sent)."""
        if t.data is None:
            return
        if len(t.dsts) == 1:
            self.ledger.record(round, t.src, t.dsts[0], t.direction, t.kind, len(t.data), t.declared)
        else:
            self.ledger.record_many(round, t.src, t.dsts, t.direction, t.kind, len(t.data), t.declared)

    # -- one message at a time ------------------------------------------------------------
    def deliver(self, data: bytes, src: int, dst: int, *, round: int,
                direction: str | None = None, declared: int | None = None,
                stand_in: dict[str, torch.Tensor] | None = None) -> Optional[Message]:
        """Count ``data`` in the ledger and decode it for ``dst``.

        ``declared`` defaults to the declared bytes computed from the header (declared
        shapes under the codec the header names). ``stand_in`` (uncounted) is attached
        to the decoded message as clones; it needs a declared entry in ``data``. With a
        validator, a refused message is counted (as kind ``"malformed"`` when it does not
        decode) and None is returned.
        """
        direction = direction or infer_direction(src, dst)
        try:
            msg, codec = self.decode(data)
        except WireError as exc:
            if self.validator is None:
                raise
            self.ledger.record(round, src, dst, direction, "malformed", len(data), declared or 0)
            self._refuse(round, src, [dst], "", ("malformed", str(exc).splitlines()[0] if str(exc) else "WireError"))
            return None
        if stand_in and not msg.declared:
            raise ValueError(f"message {msg.kind!r}: stand_in given but the message declares no tensor")
        if declared is None:
            declared = declared_bytes(msg, codec)
        self.ledger.record(round, src, dst, direction, msg.kind, len(data), declared)
        return self._hand_out(msg, src, [int(dst)], round, stand_in, codec=codec).get(int(dst))

    def send(self, msg: Message, src: int, dst: int, *, round: int,
             direction: str) -> Optional[Message]:
        """Encode, count ``len(bytes)`` (+ declared), decode: what ``dst`` receives (None
        when a validator refuses it)."""
        t = self._encode(round, src, 0, (int(dst),), msg, direction, bcast=False)
        self.record(round, t)
        return self.receive(t.data, src, t.dsts, round=round, kind=t.kind, stand_in=msg.stand_in).get(int(dst))

    def broadcast(self, msg: Message, src: int, dsts: list[int], *, round: int,
                  direction: str) -> dict[int, Message]:
        """Encode once, count ``len(bytes)`` once per receiver, give each its own copy
        (receivers whose copy a validator refuses are left out)."""
        dsts = list(dsts)
        if not dsts:
            return {}
        if has_receiver_state(self.codec_for(msg.kind, direction)):  # one estimate per link (encode_outbox)
            got = {int(d): self.send(msg, src, int(d), round=round, direction=direction) for d in dsts}
            return {d: m for d, m in got.items() if m is not None}
        t = self._encode(round, src, 0, tuple(int(d) for d in dsts), msg, direction, bcast=True)
        self.record(round, t)
        return self.receive(t.data, src, t.dsts, round=round, kind=t.kind, stand_in=msg.stand_in)
