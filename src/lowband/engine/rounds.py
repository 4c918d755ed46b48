"""The one round loop: steps -> actors -> outboxes -> encode/count -> deliver, for every backend.

A round is a short list of :class:`~lowband.algorithms.base.Step` s. This module holds the
only code that plays them; backends decide *where* the step calls run and nothing else.

**Places.** Nodes live in *places*: a place (:class:`Place`) holds a block of nodes (their
data, their states, one module per architecture, see
:class:`~lowband.engine.executor.SerialExecutor`), the codec states of those nodes as
senders (error-feedback residuals, warm starts: :attr:`Network.codec_states`), and the
messages waiting for them. Node ``i``'s home is place :func:`place_of` (contiguous blocks,
the server in place 0). A serial run has one place, in this process; the worker-process
pool (:mod:`lowband.engine.pool`) and Ray (:mod:`lowband.engine.ray_executor`) have one
place per worker.

**Balanced placement.** A round's actors may be unevenly spread over the homes (FedAvg's
sampled clients), and a step waits for its busiest place. A sharded backend therefore
places each round (:meth:`ShardedExecutor.begin_round`, the choice in
:mod:`lowband.engine.placement`): some actors *visit* another place for the round, with
everything a place keeps per node (:meth:`Place.relocate`: the state, the codec states
as sender and as EF21 receiver, unacknowledged EF21 messages, and the data where that
place lacks it), and go home when the round ends (:meth:`ShardedExecutor.end_round`), so
between rounds (evaluation, checkpoints) every node is at home. Within the round every
place routes messages by the round's placement (:meth:`Place.where`). Where a node runs
never changes what it computes.

**One step, on one place** (:meth:`Place.step`, the same code in every backend):

1. *deliver* the messages sent to this place's nodes in the previous step
   (:func:`deliver`: faults and deadline filter, decode once per transfer, each receiver's
   own validated copy, norm screening: design rule 8), in the serial inbox order (by
   sender, then outbox order);
2. *run the batch of step calls*: ``executor.run_step(step, round, plan, inboxes)`` runs
   the step function on every actor of the place, each with its own context and state
   (seeded by ``(seed, "torch", round, node, step)``), stores the new states and returns
   the outboxes. This is the seam for other ways of running a batch: a vectorised cohort
   runner (one ``torch.func`` call training every actor of the batch) replaces the
   per-actor loop inside ``run_step``, receiving the same arguments and returning the same
   ``{actor: Outbox}`` with the same new states;
3. *encode* every outbox with the run's codecs and the addressed codec generators
   (:func:`send`), keep the messages for this place's own nodes, bundle the wire bytes for
   the other places, and return the ledger records (a few integers per message).

**One round, on the driver** (:class:`RoundLoop`): for each step, the backend runs
:meth:`Place.step` on every place (``backend.step_places``) and carries each place's
bundles to their places for the next step; the loop appends the ledger records in the
serial order (sender, then outbox order), raises the first refusal under
``on_invalid = "abort"``, collects refusals and divergences, and feeds the ``[links]``
deadline clock, whose late (message, receiver) pairs the next step does not deliver.
Metrics, ledger, states and codec states are therefore byte-identical across backends
(given the same torch thread count per step call).

**EF21 acknowledgements.** ``ef21(...)`` moves the sender's estimate and the receiver's
mirror together when the receiver accepts a message. When both live in one place the
place's network does it at once; otherwise the receiver's place moves the mirror and
reports an ack (:data:`~lowband.comm.network.Ack`) in its step summary, the loop passes
each ack to its sender's place with the next step (applied before that step encodes
anything) and, for the round's last deliveries, in :meth:`Backend.apply_acks` before the
round ends (so a checkpoint holds equal copies). The serial loop moves the sender's
estimate on delivery, the ack one step later: still before the sender's next message on
that link, unless it sends on the link in two consecutive steps, which the network
refuses (a RuntimeError naming the link) rather than encode against a stale estimate.

A backend implements ``step_places(step, round, plan, codecs, seed, policy, faults,
late, first, last, acks) -> [(records, refusals, divergences, acks) per place]`` and
``apply_acks(codecs, seed, policy, acks)`` plus the executor protocol (``init_states``,
``run_step``, ``map_nodes``, ``state_dict`` ...).
:class:`ShardedExecutor` implements all of it over ``W`` places given two transport
methods (``_submit`` a call to a place, ``_wait`` for results) and ``_put`` (ship a
read-only argument once).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import OrderedDict
from typing import Any, Callable, Iterable, NamedTuple, Optional, Protocol, Sequence

import torch

from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, State, Step
from lowband.comm.ledger import Ledger
from lowband.comm.network import Ack, CodecConfig, Network
from lowband.comm.validate import ExpectedShapes, InvalidMessageError, Rejection, ValidationPolicy, Validator
from lowband.engine.executor import LazyStates, NodeEnv, SerialExecutor, ServerData
from lowband.engine.placement import balanced_placement, node_work
from lowband.faults import NO_FAULTS, RoundFaults
from lowband.seeding import derive_seed, seed_torch
from lowband.topology import RoundPlan

__all__ = ["Place", "RoundLoop", "ExecutorBackend", "ShardedExecutor", "place_of", "send", "deliver", "late_links"]

class Item(NamedTuple):
    """A message in flight to one place."""

    #: (sender, index of the entry in the sender's outbox): the serial delivery order
    key: tuple[int, int]
    #: its receivers on the destination place
    dsts: tuple[int, ...]
    #: the wire bytes, or a backend's handle of them (Ray's object store); None: refused at the sender
    data: Any
    #: stand-in tensors (declared, not encoded: design rule 2), or None
    stand_in: Optional[dict[str, torch.Tensor]]
    kind: str


class Record(NamedTuple):
    """One ledger record of a step (a broadcast: one record for all its receivers)."""

    src: int
    index: int
    dsts: tuple[int, ...]
    direction: str
    kind: str
    nbytes: int  # encoded bytes
    declared: int  # declared bytes (stand-ins)


class Summary(NamedTuple):
    """What one place reports of one step."""

    records: list[Record]
    refusals: list[Rejection]
    diverged: list[tuple[int, int]]  # (round, node) of the trainings that diverged
    acks: list[Ack]  # EF21 acknowledgements for the senders' places


# (src, item index, receiver) pairs the [links] deadline keeps from being delivered
Late = frozenset[tuple[int, int, int]]


def place_of(node: int, num_nodes: int, num_places: int) -> int:
    """The place that owns ``node``: contiguous blocks; the server lives in place 0."""
    if node == SERVER or num_places <= 1:
        return 0
    return node * num_places // max(num_nodes, 1)


# --------------------------------------------------------------------------- messages


def send(net: Network, round: int, outboxes: dict[int, Outbox], *, here: int = 0,
         where: Callable[[int], int] = lambda node: 0, num_places: int = 1, last: bool = False,
         share: Callable[[bytes, int], Any] = lambda data, n: data,
         consume: bool = False) -> tuple[list[Record], list[Item], list[list[Item]]]:
    """Encode every outbox (senders in id order, entries in outbox order) with ``net``'s
    codecs: a broadcast is encoded once for all its receivers. Returns the ledger records,
    the messages for place ``here`` and, per place, those for the other places (``last``:
    the round's last step, whose messages nobody reads: records only). ``share(data, n)``
    turns bytes going to ``n > 1`` other places into one shared handle (Ray's object store).
    ``consume``: each sender's outbox is taken out of ``outboxes`` as it is encoded, so its
    tensors are freed while the others are encoded (a step's messages are then held about
    once, not as tensors and bytes together)."""
    records: list[Record] = []
    local: list[Item] = []
    bundles: list[list[Item]] = [[] for _ in range(num_places)]
    for src in sorted(outboxes):
        items = outboxes.pop(src).items if consume else outboxes[src].items
        for t in net.encode_outbox(round, src, items):
            if t.data is not None:
                records.append(Record(t.src, t.index, t.dsts, t.direction, t.kind, len(t.data), t.declared))
            if last:
                continue
            per_place: dict[int, list[int]] = {}
            for d in t.dsts:
                per_place.setdefault(where(d), []).append(d)
            remote = [j for j in per_place if j != here]
            payload: Any = share(t.data, len(remote)) if len(remote) > 1 and t.data is not None else t.data
            stand_in = t.stand_in or None
            for j, ds in per_place.items():
                item = Item((t.src, t.index), tuple(ds), t.data if j == here else payload, stand_in, t.kind)
                (local if j == here else bundles[j]).append(item)
    return records, local, bundles


def deliver(net: Network, round: int, items: Iterable[Item], faults: RoundFaults = NO_FAULTS,
            late: Late = frozenset(), fetch: Callable[[Any], Optional[bytes]] = lambda p: p) -> dict[int, list[Envelope]]:
    """Decode each message once and hand it to every receiver that validates it (one shared
    object for a broadcast; :func:`lowband.engine.inbox.own_inbox` copies it for each
    receiver's step), in the
    serial inbox order (by sender, then outbox order); messages of late or dropped nodes
    (``faults``) and (message, receiver) pairs past the deadline (``late``) are left out;
    then the receivers' norm screening. Refusals go to ``net.rejections``."""
    inboxes: dict[int, list[Envelope]] = {}
    order = sorted(items, key=lambda it: it.key)
    order.reverse()  # popped from the end: the serial order
    if isinstance(items, list):  # the caller's list gives up its bytes: each is freed once decoded
        items.clear()
    while order:
        (src, index), dsts, payload, stand_in, kind = order.pop()
        if late:
            dsts = tuple(d for d in dsts if (src, index, d) not in late)
        dsts = faults.deliverable(src, dsts) if faults.any else dsts
        if not dsts:
            continue
        data = payload if payload is None or isinstance(payload, bytes) else fetch(payload)
        shared = len(dsts) > 1  # decoded once and held once; each receiver's step gets its own copy
        for dst, m in net.receive(data, src, dsts, round=round, kind=kind, stand_in=stand_in, share=shared).items():
            inboxes.setdefault(dst, []).append(Envelope(src, m, shared))
    return net.screen(round, inboxes)


def late_links(clock: Any, records: Sequence[Record]) -> Late:
    """Feed the ``[links]`` deadline clock the step's transfers in the serial order; the
    (message, receiver) pairs that arrive past the deadline (downlinks are never late)."""
    late: set[tuple[int, int, int]] = set()
    for src, index, dsts, direction, _, nbytes, declared in records:
        n = nbytes + int(declared)
        for d in dsts:
            if not (clock.on_time(clock.transfer(src, d, direction, n)) or direction == "down"):
                late.add((src, index, d))
    return frozenset(late)


def append_records(ledger: Ledger, round: int, records: Iterable[Record]) -> None:
    for src, _, dsts, direction, kind, nbytes, declared in records:
        if len(dsts) == 1:
            ledger.record(round, src, dsts[0], direction, kind, nbytes, declared)
        else:
            ledger.record_many(round, src, dsts, direction, kind, nbytes, declared)


# --------------------------------------------------------------------------- step functions


def fn_spec(fn: Callable, alg: Any, put: Callable[[Any], tuple]) -> tuple:
    """How another process finds ``fn``: a method of its own copy of the algorithm by name,
    a partial with its arguments shipped once (``put``), or the callable itself."""
    if inspect.ismethod(fn) and fn.__self__ is alg:
        name = fn.__func__.__name__
        if getattr(getattr(alg, name, None), "__func__", None) is fn.__func__:
            return ("method", name)
    if isinstance(fn, functools.partial):
        return ("partial", fn_spec(fn.func, alg, put), [put(a) for a in fn.args],
                {k: put(v) for k, v in fn.keywords.items()})
    return ("callable", fn)


# --------------------------------------------------------------------------- a place


class Place:
    """Where a block of nodes lives (see the module docstring): a serial executor over
    its nodes, its senders' codec states and the messages waiting for its nodes.

    ``codec_home``: a network whose :attr:`~Network.codec_states` this place uses (the
    driver's, for the one place of a serial run), else the place keeps its own."""

    def __init__(self, ex: SerialExecutor, index: int = 0, num_places: int = 1,
                 codec_home: Optional[Network] = None):
        self.ex = ex
        self.index, self.num_places = index, num_places
        env = ex.env
        self.num_nodes = env.num_nodes
        #: the nodes whose home this place is (a place may hold other nodes' data too)
        self.nodes = [i for i, d in enumerate(env.node_data)
                      if d is not None and place_of(i, self.num_nodes, num_places) == index]
        self.has_server = index == 0 and env.algorithm.has_server
        #: this round's nodes away from their home place: node -> the place running it
        self.away: dict[int, int] = {}
        self._borrowed: set[int] = set()  # visitors whose data came with them
        self._local: list[Item] = []
        self._network: Optional[tuple[CodecConfig, int, Optional[ValidationPolicy], Network]] = None
        self._codec_home = codec_home
        self._codec_states: dict[int, dict[str, Any]] = {}
        self._in_flight: dict = {}  # EF21 messages to other places awaiting their ack (Network.in_flight)
        self._k = 0  # index of the current step in its round

    # -- hooks of a transport (identity in-process) ------------------------------------------
    def get(self, ref: Any) -> Any:
        """The value of an argument shipped by reference (see :func:`fn_spec`)."""
        return ref

    def share(self, data: bytes, n: int) -> Any:
        return data

    def fetch(self, payload: Any) -> Optional[bytes]:
        return payload

    # -- codec states ------------------------------------------------------------------------
    @property
    def codec_states(self) -> dict[int, dict[str, Any]]:
        return self._codec_home.codec_states if self._codec_home is not None else self._codec_states

    @codec_states.setter
    def codec_states(self, value: dict[int, dict[str, Any]]) -> None:
        if self._codec_home is not None:
            self._codec_home.codec_states = value
        else:
            self._codec_states = value

    def get_codec_states(self) -> dict[str, Any]:
        net = Network(CodecConfig(), Ledger(), 0)
        net.codec_states = self.codec_states
        return net.codec_state_dict()

    def set_codec_states(self, sd: dict[str, Any]) -> None:
        net = Network(CodecConfig(), Ledger(), 0)
        net.load_codec_state_dict(sd)
        self.codec_states = net.codec_states

    def _net(self, codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy]) -> Network:
        if self._network is None or self._network[:3] != (codecs, seed, policy):
            env = self.ex.env
            # the place collects refusals; the driver applies the abort policy to them
            validator = None if policy is None else Validator(dataclasses.replace(policy, on_invalid="reject"),
                                                              ExpectedShapes(env.init_params, env.model_key))
            # decoded messages go to the run's device (the serial place's network knows it)
            device = self._codec_home.device if self._codec_home is not None else None
            self._network = (codecs, seed, policy, Network(codecs, Ledger(), seed, validator=validator, device=device))
        net = self._network[3]
        net.codec_states = self.codec_states
        net.in_flight = self._in_flight
        if self.num_places > 1:
            here, where = self.index, self.where
            net.remote = lambda node: where(node) != here
        return net

    def where(self, node: int) -> int:
        """The place running ``node`` this round (its home unless it visits another)."""
        j = self.away.get(node)
        return place_of(node, self.num_nodes, self.num_places) if j is None else j

    def apply_acks(self, codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy],
                   acks: list[Ack]) -> None:
        """Move this place's senders' EF21 estimates by the acks of their receivers
        (:meth:`Network.apply_acks`)."""
        if acks:
            self._net(codecs, seed, policy).apply_acks(acks)

    def fn(self, spec: Any) -> Callable:
        """A step function from its :func:`fn_spec` (a callable is used as it is)."""
        if not isinstance(spec, tuple):
            return spec
        kind = spec[0]
        if kind == "method":
            return getattr(self.ex.env.algorithm, spec[1])
        if kind == "partial":
            _, inner, args, kwargs = spec
            return functools.partial(self.fn(inner), *[self._arg(a) for a in args],
                                     **{k: self._arg(v) for k, v in kwargs.items()})
        return spec[1]

    def _arg(self, a: tuple) -> Any:
        return self.get(a[1]) if a[0] == "ref" else a[1]

    # -- states ------------------------------------------------------------------------------
    def init_states(self, plan: RoundPlan) -> None:
        ex, alg, seed = self.ex, self.ex.env.algorithm, self.ex.env.seed
        ex.init_plan = plan
        ex.states = LazyStates(ex, self.nodes)  # made on first read (SerialExecutor.init_states)
        if self.has_server:
            seed_torch(derive_seed(seed, "torch", "init", SERVER))
            ex.states[SERVER] = alg.init_server(ex.context(SERVER, 0, plan))

    def get_states(self) -> dict[int, State]:
        return dict(self.ex.states)

    def set_states(self, states: dict[int, State]) -> None:
        lazy = LazyStates(self.ex, self.nodes)  # a home node not among them: made on first read
        lazy.update(states)
        self.ex.states = lazy

    # -- visits (balanced placement: lowband.engine.placement) ---------------------------------
    def relocate(self, away: dict[int, int], leaving: list[int], ship_data: bool) -> dict[int, tuple]:
        """Take ``away`` as the round's placement and hand over the ``leaving`` nodes held
        here: for each, ``(state, codec states, EF21 messages in flight, data)`` (its data
        only with ``ship_data`` and when it goes to a place that is not its home, where the
        data lives), for :meth:`arrive` at its new place. Everything a place keeps per node
        travels: the node's state, its codec states (as a sender, and its mirrors as an
        EF21 receiver) and its unacknowledged EF21 messages."""
        self.away = dict(away)
        out: dict[int, tuple] = {}
        for n in leaving:
            dest = self.where(n)
            home = place_of(n, self.num_nodes, self.num_places)
            flying = {k: v for k, v in self._in_flight.items() if k[0] == n}
            for k in flying:
                del self._in_flight[k]
            data = self.ex.env.node_data[n] if ship_data and dest != home else None
            if n in self._borrowed:
                self._borrowed.discard(n)
                self.ex.env.node_data[n] = None
            out[n] = (self.ex.states.pop(n), self.codec_states.pop(n, None), flying, data)
        return out

    def arrive(self, visitors: dict[int, tuple]) -> None:
        """Install the nodes handed over by another place's :meth:`relocate`."""
        for n, (state, codec, flying, data) in visitors.items():
            self.ex.states[n] = state
            if codec is not None:
                self.codec_states[n] = codec
            self._in_flight.update(flying)
            if data is not None:
                self.ex.env.node_data[n] = data
                self._borrowed.add(n)

    # -- work --------------------------------------------------------------------------------
    def step(self, spec: Any, round: int, plan: RoundPlan, name: str, actors: list[int],
             codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy], faults: RoundFaults,
             late: Late, first: bool, last: bool, acks: Optional[list[Ack]] = None,
             *incoming: Optional[list[Item]]) -> tuple:
        """Apply the EF21 acks for this place's senders, deliver the previous step's
        messages, run ``actors``' step, encode their outboxes. Returns
        ``((records, refusals, divergences, acks), bundle for place 0, ..., for place W-1)``."""
        if first:
            self._local = []
        self._k = 0 if first else self._k + 1
        net = self._net(codecs, seed, policy)
        net.rejections = []
        net.acks = []
        if acks:
            net.apply_acks(acks)
        net.step_tag = (int(round), self._k)
        items = [*self._local, *(it for b in incoming if b for it in b)]
        self._local = []
        for b in incoming:  # the delivery owns the bytes and frees each once decoded (memory)
            if b:
                b.clear()
        inboxes = deliver(net, round, items, faults, late, self.fetch)
        before = len(self.ex.diverged)
        outboxes = self.ex.run_step(Step(name, actors, self.fn(spec)), round, plan, inboxes)
        del inboxes  # the decoded messages are not held while the outboxes are encoded (memory)
        diverged = self.ex.diverged[before:]
        del self.ex.diverged[before:]
        records, self._local, bundles = send(
            net, round, outboxes, here=self.index, num_places=self.num_places, last=last, share=self.share,
            where=self.where, consume=True)
        return (Summary(records, net.rejections, diverged, net.acks), *[b or None for b in bundles])

    def run_step(self, spec: Any, round: int, plan: RoundPlan, name: str, actors: list[int],
                 inboxes: dict[int, list[Envelope]]) -> dict[int, Outbox]:
        """The plain executor protocol (messages routed by the caller)."""
        return self.ex.run_step(Step(name, actors, self.fn(spec)), round, plan, inboxes)

    def map_nodes(self, spec: Any, nodes: list[int], round: int, plan: RoundPlan) -> dict[int, Any]:
        return self.ex.map_nodes(self.fn(spec), nodes, round, plan)

    def map_place(self, spec: Any, nodes: list[int]) -> Any:
        """``fn(executor, nodes)`` once for this place's ``nodes`` (work batched over
        several nodes, e.g. pooled evaluation: see :meth:`ShardedExecutor.map_places`)."""
        return self.fn(spec)(self.ex, nodes)


# --------------------------------------------------------------------------- the driver


class Backend(Protocol):
    def step_places(self, step: Step, round: int, plan: RoundPlan, codecs: CodecConfig, seed: int,
                    policy: Optional[ValidationPolicy], faults: RoundFaults, late: Late,
                    first: bool, last: bool, acks: list[Ack]) -> list[Summary]: ...

    def apply_acks(self, codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy],
                   acks: list[Ack]) -> None: ...


class LocalPlace:
    """The backend of a serial run: one place, in this process, over ``executor``'s
    states (codec states in ``network``)."""

    def __init__(self, executor: SerialExecutor, network: Network):
        self.place = Place(executor, codec_home=network)

    def step_places(self, step: Step, round: int, plan: RoundPlan, codecs: CodecConfig, seed: int,
                    policy: Optional[ValidationPolicy], faults: RoundFaults, late: Late,
                    first: bool, last: bool, acks: list[Ack]) -> list[Summary]:
        return [self.place.step(step.fn, round, plan, step.name, list(step.actors), codecs, seed, policy,
                                faults, late, first, last, acks)[0]]

    def apply_acks(self, codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy],
                   acks: list[Ack]) -> None:
        self.place.apply_acks(codecs, seed, policy, acks)


class ExecutorBackend:
    """The driver's backend over an executor (serial, worker pool, Ray): the nodes' states
    live in ``executor``, each step runs on its places (:class:`LocalPlace` for a serial
    executor, the sharded executor itself otherwise), ``evaluator`` measures the protocols.

    What the driver asks of any backend (a Flower backend supplies the same:
    :mod:`lowband.flower.adapter`): ``places`` (what :class:`RoundLoop` plays a step on),
    ``init_states(plan)``, ``evaluate(round, plan)`` (the protocols' metrics),
    ``map_nodes(fn, nodes, round, plan)`` (``None`` for a node it does not hold) and
    ``close()`` at the end of a run."""

    def __init__(self, executor: Any, network: Network, evaluator: Any = None, close_at_end: bool = False):
        self.executor, self.evaluator = executor, evaluator
        self.places: Backend = LocalPlace(executor, network) if isinstance(executor, SerialExecutor) else executor
        self._close = close_at_end

    def init_states(self, plan: Optional[RoundPlan]) -> None:
        self.executor.init_states(plan)

    def evaluate(self, round: int, plan: RoundPlan) -> dict[str, Any]:
        return self.evaluator(round, plan)

    def map_nodes(self, fn: Callable, nodes: Iterable[int], round: int, plan: RoundPlan) -> dict[int, Any]:
        return self.executor.map_nodes(fn, nodes, round, plan)

    def close(self) -> None:
        if self._close:  # worker processes end with the run (their states stay readable)
            self.executor.close()


class RoundLoop:
    """Plays a round's steps on a backend's places; counts, collects, times (see the
    module docstring). ``network``: the run's codecs, seed, validation policy and ledger."""

    def __init__(self, network: Network, backend: Backend):
        self.network, self.backend = network, backend

    def play(self, steps: Sequence[Step], round: int, plan: RoundPlan, faults: RoundFaults = NO_FAULTS,
             clock: Any = None) -> list[tuple[int, int]]:
        """Run ``steps`` (without ``faults``' dropped nodes among their actors); append the
        ledger records, the receivers' refusals
        (``network.rejections``); return the divergences ``(round, node)``. A backend with
        ``begin_round(steps, round, plan)`` / ``end_round()`` (a sharded one) may place
        the round's actors for balance before the steps and bring them home after."""
        if faults.dropped:  # offline nodes neither compute nor send (lowband.faults)
            steps = [Step(s.name, faults.actors(s.actors), s.fn) for s in steps]
        begin, end = getattr(self.backend, "begin_round", None), getattr(self.backend, "end_round", None)
        if begin is not None:
            begin(steps, round, plan)
        try:
            diverged = self._play(steps, round, plan, faults, clock)
        except BaseException:
            if end is not None:
                try:
                    end()
                except Exception:  # never mask the error that stopped the round
                    pass
            raise
        if end is not None:
            end()
        return diverged

    def _play(self, steps: Sequence[Step], round: int, plan: RoundPlan, faults: RoundFaults,
              clock: Any) -> list[tuple[int, int]]:
        net = self.network
        policy = net.validator.policy if net.validator is not None else None
        late: Late = frozenset()
        diverged: list[tuple[int, int]] = []
        acks: list[Ack] = []  # EF21 acks of the deliveries of the previous step, for their senders
        for k, step in enumerate(steps):
            parts = self.backend.step_places(step, round, plan, net.codecs, net.seed, policy, faults, late,
                                             k == 0, k == len(steps) - 1, acks)
            acks = sorted((a for part in parts for a in part.acks), key=lambda a: (a[0], a[1], a[2]))
            # refusals of the messages delivered at the start of step k (sent in step k-1)
            refusals = sorted((x for part in parts for x in part.refusals), key=lambda x: (x.src, x.dst, x.reason, x.kind))
            if refusals and policy is not None and policy.on_invalid == "abort":
                raise InvalidMessageError(refusals[0])
            net.rejections.extend(refusals)
            diverged.extend(sorted(d for part in parts for d in part.diverged))
            records = sorted((r for part in parts for r in part.records), key=lambda r: (r.src, r.index))
            append_records(net.ledger, round, records)
            late = late_links(clock, records) if clock is not None else frozenset()
        if acks:  # the round's last deliveries: both copies equal before the round ends
            self.backend.apply_acks(net.codecs, net.seed, policy, acks)
        return diverged


# --------------------------------------------------------------------------- sharded backends


def _own(d: Any) -> Any:
    """A node's data as tensors of its own (a :class:`~lowband.data.federation.NodeView`
    materialised), for a place in another process that does not share this one's pages."""
    return d.materialize() if hasattr(d, "materialize") else d


class ShardedExecutor:
    """The executor protocol over ``num_workers`` places in other processes (the pool's
    workers, Ray's actors): node states stay where their nodes live. Subclasses give the
    transport: ``_submit(j, method, *args)`` a call to place ``j``'s :class:`Place`,
    ``_wait(handles)`` its results, ``_put(obj)`` a read-only argument shipped once."""

    env: NodeEnv
    num_workers: int
    #: balanced placement (:meth:`begin_round`): a round's actors may visit other places
    balance: bool = False
    #: every place holds every node's data (forked workers share the parent's pages), so a
    #: visiting node's data need not travel with it
    data_everywhere: bool = False

    def __init__(self) -> None:
        #: (round, node) of the steps whose local training diverged (see SerialExecutor)
        self.diverged: list[tuple[int, int]] = []
        self._bundles: Optional[list[list[Any]]] = None
        #: this round's visiting nodes: node -> the place running it (empty between rounds)
        self._away: dict[int, int] = {}
        #: nodes moved by balanced placement so far (each visit counts once)
        self.visits = 0

    # -- transport ---------------------------------------------------------------------------
    def _submit(self, j: int, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def _wait(self, handles: list[Any]) -> list[Any]:
        raise NotImplementedError

    def _put(self, obj: Any) -> tuple[str, Any]:
        raise NotImplementedError

    def _plan(self, plan: RoundPlan) -> Any:
        """``plan`` as a place-call argument (shipped once per plan)."""
        return plan

    # -- setup -------------------------------------------------------------------------------
    def shard_env(self, j: int, all_data: bool = False) -> NodeEnv:
        """Place ``j``'s view of the environment: its nodes' data only, or every node's
        with ``all_data`` (and the server's in place 0)."""
        n, w = self.env.num_nodes, self.num_workers
        data = [d if all_data else _own(d) if place_of(i, n, w) == j else None for i, d in enumerate(self.env.node_data)]
        server = self.env.server_data if j == 0 else ServerData(torch.empty(0), torch.empty(0, dtype=torch.long))
        return dataclasses.replace(self.env, node_data=data, server_data=server)

    def home(self, node: int) -> int:
        """The place where ``node`` lives between rounds."""
        return place_of(node, self.env.num_nodes, self.num_workers)

    def shard(self, node: int) -> int:
        """The place running ``node`` now (its home, unless it visits another this round)."""
        j = self._away.get(node)
        return self.home(node) if j is None else j

    def _split(self, nodes: Iterable[int]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.num_workers)]
        for node in nodes:
            out[self.shard(int(node))].append(int(node))
        return out

    def _spec(self, fn: Callable) -> tuple:
        return fn_spec(fn, self.env.algorithm, self._put)

    def _all(self, method: str, args: Sequence[Sequence[Any]]) -> list[Any]:
        return self._wait([self._submit(j, method, *a) for j, a in enumerate(args)])

    # -- balanced placement ---------------------------------------------------------------------
    def begin_round(self, steps: Sequence[Step], round: int, plan: RoundPlan) -> None:
        """With :attr:`balance`: let some of the round's actors visit other places so that
        the places get about equal work (:func:`lowband.engine.placement.balanced_placement`,
        work by training samples); their states travel there and back (:meth:`end_round`)."""
        if not self.balance or self.num_workers <= 1 or not getattr(self.env.algorithm, "visiting", True):
            return
        work: dict[int, float] = {}
        for step in steps:
            for a in step.actors:
                a = int(a)
                if a != SERVER:
                    work[a] = work.get(a, 0.0) + node_work(self.env.node_data[a].n_train)
        away = balanced_placement(work, self.home, self.num_workers)
        self.visits += len(away)
        self._relocate(away)

    def end_round(self) -> None:
        """Bring the visiting nodes home (between rounds every node is at home: evaluation,
        checkpoints and the plain executor protocol see the fixed placement)."""
        if self._away:
            self._relocate({})

    def _relocate(self, away: dict[int, int]) -> None:
        """Make ``away`` the placement: hand the nodes that change place over, and tell
        every place where each node runs (its messages are routed there)."""
        old, w = self._away, self.num_workers
        new_at = lambda n: away.get(n, self.home(n))  # noqa: E731
        moving = sorted(n for n in set(old) | set(away) if self.shard(n) != new_at(n))
        leaving: list[list[int]] = [[] for _ in range(w)]
        for n in moving:
            leaving[self.shard(n)].append(n)
        ship = not self.data_everywhere
        arrivals: list[dict[int, tuple]] = [{} for _ in range(w)]
        for part in self._all("relocate", [(dict(away), leaving[j], ship) for j in range(w)]):
            for n, pack in part.items():
                arrivals[new_at(n)][n] = pack
        self._away = dict(away)
        self._wait([self._submit(j, "arrive", arrivals[j]) for j in range(w) if arrivals[j]])

    # -- the round (see RoundLoop) ------------------------------------------------------------
    def step_places(self, step: Step, round: int, plan: RoundPlan, codecs: CodecConfig, seed: int,
                    policy: Optional[ValidationPolicy], faults: RoundFaults, late: Late,
                    first: bool, last: bool, acks: list[Ack]) -> list[Summary]:
        w = self.num_workers
        spec, plan_a = self._spec(step.fn), self._plan(plan)
        actors = self._split(step.actors)
        prev = self._bundles if not first and self._bundles is not None else [[None] * w for _ in range(w)]
        self._bundles = None
        per = self._acks_per_place(acks)
        handles = []
        for j in range(w):  # each place's incoming bytes, shipped then dropped here (memory)
            handles.append(self._submit(j, "step", spec, round, plan_a, step.name, actors[j], codecs, seed, policy,
                                        faults, late, first, last, per[j], *[prev[i][j] for i in range(w) if i != j]))
            for i in range(w):
                prev[i][j] = None
        del prev
        outs = self._wait(handles)
        self._bundles = None if last else [list(o[1:]) for o in outs]
        return [Summary(*o[0]) for o in outs]

    def _acks_per_place(self, acks: list[Ack]) -> list[Optional[list[Ack]]]:
        """Each EF21 ack goes to the place of its sender (None: no acks for that place)."""
        per: list[Optional[list[Ack]]] = [None] * self.num_workers
        for a in acks:
            j = self.shard(a[0])
            per[j] = (per[j] or []) + [a]
        return per

    def apply_acks(self, codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy],
                   acks: list[Ack]) -> None:
        """Deliver the round's last EF21 acks to their senders' places (before a checkpoint)."""
        per = self._acks_per_place(acks)
        self._wait([self._submit(j, "apply_acks", codecs, seed, policy, a) for j, a in enumerate(per) if a])

    # -- the executor protocol ------------------------------------------------------------------
    def init_states(self, plan: RoundPlan) -> None:
        self._all("init_states", [(self._plan(plan),)] * self.num_workers)

    def run_step(self, step: Step, round: int, plan: RoundPlan,
                 inboxes: dict[int, list[Envelope]]) -> dict[int, Outbox]:
        """One step with the caller routing the messages (the plain protocol)."""
        spec, plan_a = self._spec(step.fn), self._plan(plan)
        handles = [self._submit(j, "run_step", spec, round, plan_a, step.name, part,
                                {n: inboxes[n] for n in part if n in inboxes})
                   for j, part in enumerate(self._split(step.actors)) if part]
        out: dict[int, Outbox] = {}
        for part in self._wait(handles):
            out.update(part)
        return {int(n): out[int(n)] for n in step.actors}

    def map_nodes(self, fn: Callable[[NodeContext, State], Any], nodes: Iterable[int],
                  round: int, plan: RoundPlan) -> dict[int, Any]:
        nodes = [int(n) for n in nodes]
        spec, plan_a = self._spec(fn), self._plan(plan)
        handles = [self._submit(j, "map_nodes", spec, part, round, plan_a)
                   for j, part in enumerate(self._split(nodes)) if part]
        res: dict[int, Any] = {}
        for part in self._wait(handles):
            res.update(part)
        return {n: res[n] for n in nodes}

    def map_places(self, fn: Callable[[Any, list[int]], Any], nodes: Iterable[int]) -> list[Any]:
        """``fn(executor, its_nodes)`` once on each place holding some of ``nodes``, in
        parallel (``executor``: the place's :class:`SerialExecutor`, whose ``env`` has those
        nodes' data); the results in place order. A serial executor's is one call."""
        spec = self._spec(fn)
        return self._wait([self._submit(j, "map_place", spec, part)
                           for j, part in enumerate(self._split(int(n) for n in nodes)) if part])

    # -- states and checkpoints ----------------------------------------------------------------
    @property
    def states(self) -> dict[int, State]:
        """A snapshot of every node's state, gathered from the places (serial order:
        nodes 0..n-1, then the server)."""
        merged: dict[int, State] = {}
        for part in self._all("get_states", [()] * self.num_workers):
            merged.update(part)
        order = [n for n in range(self.env.num_nodes) if n in merged] + ([SERVER] if SERVER in merged else [])
        return {n: merged[n] for n in order}

    def state_dict(self) -> dict[str, Any]:
        return {str(k): v for k, v in self.states.items()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        parts: list[dict[int, State]] = [{} for _ in range(self.num_workers)]
        for k, v in sd.items():
            parts[self.home(int(k))][int(k)] = v
        self._all("set_states", [(p,) for p in parts])

    def codec_state_dict(self) -> dict[str, Any]:
        """The senders' codec states, gathered from the places where they encode."""
        merged: dict[str, Any] = {}
        for part in self._all("get_codec_states", [()] * self.num_workers):
            merged.update(part)
        return {k: merged[k] for k in sorted(merged, key=int)}

    def load_codec_state_dict(self, sd: dict[str, Any]) -> None:
        """Scatter checkpointed codec states to the places of their senders."""
        parts: list[dict[str, Any]] = [{} for _ in range(self.num_workers)]
        for k, v in sd.items():
            parts[self.home(int(k))][k] = v
        self._all("set_codec_states", [(p,) for p in parts])


class PutCache:
    """An LRU of arguments keyed by identity that holds the objects (so an id cannot be
    reused while cached): an object passed again is not shipped again, so pass a new
    object for a new value."""

    def __init__(self, size: int = 16):
        self.size = size
        self._items: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def get(self, obj: Any) -> Any:
        hit = self._items.get(id(obj))
        if hit is not None and hit[0] is obj:
            self._items.move_to_end(id(obj))
            return hit[1]
        return None

    def add(self, obj: Any, handle: Any) -> list[Any]:
        """Remember ``handle`` for ``obj``; returns the handles evicted."""
        self._items[id(obj)] = (obj, handle)
        gone = []
        while len(self._items) > self.size:
            gone.append(self._items.popitem(last=False)[1][1])
        return gone
