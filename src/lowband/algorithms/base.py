"""The shape of an algorithm: node-local step functions and the messages between them.

A round of any algorithm is a short list of :class:`Step` s. In each step, every *actor*
(the server ``SERVER = -1``, sampled clients, or all peers) runs the step's function
**on its own state, its own data and its own inbox** and returns its new state and an
:class:`Outbox`. The engine then encodes every outgoing message with the link's codec,
counts the bytes in the ledger and delivers the decoded messages into the receivers'
inboxes for the next step (design rules 1 and 2). Nothing in a step function can reach
another node's state, which is what makes byte counts true and lets the Ray executor run
the same file unchanged.

States are plain nested dicts of tensors and Python scalars so that checkpoints load
with ``torch.load(weights_only=True)``. Updates are synchronous: all actors of a step
see the inboxes produced by the previous step, never a half-updated round.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from lowband.comm.message import SERVER, Message
from lowband.seeding import torch_gen
from lowband.topology import RoundPlan, Topology

State = dict[str, Any]
Params = dict[str, torch.Tensor]


class Hyperparams(BaseModel):
    """Base for algorithm hyperparameters: strict (unknown keys are errors), documented.

    :attr:`PERFORMANCE_ONLY` names the keys that change how fast or in how much memory a run
    computes and never a number it writes (each backed by a test that runs both ways): a run
    resumed, or reused by ``lowband reproduce``, with other values of them is the same run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    PERFORMANCE_ONLY: ClassVar[frozenset[str]] = frozenset()


@dataclass
class Envelope:
    """A delivered message: who sent it and what survived the codec.

    ``shared``: ``msg`` is the one decoded copy of a broadcast, held by all its receivers'
    inboxes (memory); the executor hands the receiver a private clone when it runs."""

    src: int
    msg: Message
    shared: bool = False


@dataclass
class Outbox:
    """Messages a node sends in one step. One entry may address several receivers
    (a broadcast: encoded once, counted once per receiver)."""

    items: list[tuple[tuple[int, ...], Message]] = field(default_factory=list)

    def send(self, dst: int, msg: Message) -> "Outbox":
        self.items.append(((int(dst),), msg))
        return self

    def broadcast(self, dsts: Sequence[int], msg: Message) -> "Outbox":
        if len(dsts):
            self.items.append((tuple(int(d) for d in dsts), msg))
        return self


@dataclass
class NodeContext:
    """Everything a step function may use on node ``node`` in round ``round``."""

    node: int
    round: int
    plan: RoundPlan
    data: Any  # lowband.data.federation.NodeData for clients; ServerData for the server
    model: nn.Module  # a worker-owned module of this node's architecture: load params into it
    hp: Any
    seed: int
    num_nodes: int
    num_classes: int
    init_params: Callable[[], Params]  # the shared initialisation (same seed -> same w0 everywhere)
    public_x: Optional[torch.Tensor] = None  # public reference inputs (no labels) where a method has one
    #: the run's aggregation rule (``[aggregation]``, lowband.aggregation); None: the algorithm's own average
    aggregation: Optional[Any] = None

    @property
    def neighbors(self) -> tuple[int, ...]:
        return tuple(self.plan.neighbors.get(self.node, ()))

    @property
    def participants(self) -> tuple[int, ...]:
        return tuple(self.plan.participants)

    def rng(self, *purpose: Any) -> torch.Generator:
        """A generator addressed by (seed, round, node, purpose): order-independent."""
        return torch_gen(self.seed, "alg", self.round, self.node, *purpose)

    # -- the aggregation hook (lowband.aggregation; docs/aggregation.md) -------------------
    def aggregate(self, models: list[Params], weights: Sequence[float], reference: Params, *,
                  senders: Optional[Sequence[int]] = None, plain: Optional[Callable[[], Params]] = None) -> Params:
        """Combine received ``models`` (with the algorithm's ``weights``) around ``reference``.

        No rule configured: ``plain()`` (default ``weighted_average(models, weights)``), i.e.
        exactly the algorithm's own average. With a rule: ``reference + rule(models -
        reference)``, its randomness addressed by (seed, round, node, "aggregate").
        ``senders``: the node id of each model (peer rules find the node's own model by its
        id); unset: ``0..n-1``."""
        from lowband.aggregation.base import aggregate_models
        from lowband.train import weighted_average

        senders = range(len(models)) if senders is None else senders
        return aggregate_models(self.aggregation, models, weights, reference, senders=senders, node=self.node,
                                round=self.round, rng=lambda: self.rng("aggregate"),
                                plain=plain or (lambda: weighted_average(models, list(weights))))

    def aggregate_updates(self, updates: list[Params], weights: Sequence[float], reference: Params, *,
                          senders: Optional[Sequence[int]] = None,
                          plain: Optional[Callable[[], Params]] = None) -> Params:
        """Combine received ``updates`` (deltas relative to ``reference``, the aggregator's
        model): ``plain()`` (default ``weighted_average(updates, weights)``) with no rule,
        else the rule's aggregated update."""
        from lowband.aggregation.base import aggregate_updates
        from lowband.train import weighted_average

        senders = range(len(updates)) if senders is None else senders
        return aggregate_updates(self.aggregation, updates, weights, reference, senders=senders, node=self.node,
                                 round=self.round, rng=lambda: self.rng("aggregate"),
                                 plain=plain or (lambda: weighted_average(updates, list(weights))),
                                 reference=reference)


StepFn = Callable[[NodeContext, State, list[Envelope]], tuple[State, Outbox]]


@dataclass
class Step:
    """One exchange phase: ``fn`` runs on each actor; its outboxes are delivered before
    the next step."""

    name: str
    actors: Sequence[int]
    fn: StepFn


class Algorithm(ABC):
    """Base class of every algorithm.

    Subclasses set ``name``, ``family`` ("server", "peer", "oneshot" or "local"), a
    ``Hyperparams`` model whose defaults are the paper's, and implement :meth:`init_node`,
    :meth:`steps` and the evaluation hooks. See docs/adding-an-algorithm.md.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    Hyperparams: ClassVar[type[Hyperparams]]
    paper: ClassVar[str] = ""
    #: protocols evaluated when the config does not say
    default_protocols: ClassVar[tuple[str, ...]] = ("global", "personal")
    #: main metric for rounds/bytes-to-target
    default_main: ClassVar[str] = "personal/acc_weighted"
    #: True when each client keeps its own model (personalised FL, peers); False when
    #: clients are stateless and the "personal" protocol evaluates the global model on
    #: each client's local test split (PFLlib's convention for FedAvg-like methods).
    personalized: ClassVar[bool] = True
    #: True where a client keeps nothing between rounds (FedAvg: the server's model comes with
    #: each round), so a run holds models for a round's participants only; config.bounds'
    #: memory estimate reads it from each class's own body (not inherited: a subclass that
    #: keeps a state, MOON's previous model, must not pass for stateless)
    stateless_clients: ClassVar[bool] = False
    #: True when clients may have different architectures (``[model] mix``): only
    #: predictions cross the network (KTA v2, FedMD). Weight-exchanging methods keep False.
    supports_mixed_models: ClassVar[bool] = False
    #: message kinds whose tensors may be slices of the receiver's model entries (a
    #: sub-model, FedSPU): the receivers' shape check (lowband.comm.validate) then asks for
    #: the entry's rank and no larger dimension instead of its exact shape
    partial_kinds: ClassVar[frozenset[str]] = frozenset()
    #: message kinds (-> the directions they travel) whose float tensors do not keep their
    #: shape or the meaning of their coordinates from one message to the next on a link (a
    #: different subset each round: FedCSPACK's packs, DisPFL's masked values): sender codec
    #: state (an ``ef`` residual, a PowerSGD warm start) would be added to the wrong
    #: coordinates, so a stateful codec on them is refused before the run (engine.checks)
    unaligned_kinds: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: False for a server method whose server holds no model (KTA, FedMD exchange
    #: predictions only): the ``global`` protocol is refused (lowband.engine.checks).
    server_model: ClassVar[bool] = True
    #: True for a method that needs the public reference set (``data.public_size > 0``);
    #: a config without one is refused before the run.
    needs_public: ClassVar[bool] = False
    #: topology settings (``[topology]`` keys) used where the config leaves them unset;
    #: None: the family's default kind with the config's defaults
    default_topology: ClassVar[Optional[Mapping[str, Any]]] = None
    #: False where ``[engine] workers = "auto"`` must stay serial because worker processes
    #: were measured slower than one process (SPARK: its projected Jacobians, ~1.2 GB per
    #: 30-node round, cross the workers' pipes; benchmarks/README.md). An explicit
    #: ``workers = N`` still starts the pool.
    auto_workers: ClassVar[bool] = True
    #: False where a node's step keeps per-node work in its place between rounds (NTK-DFL
    #: and SPARK cache each node's X P products on the worker): the balanced placement of
    #: sharded backends (lowband.engine.placement) then keeps every node at home, where
    #: visits would recompute (and cache twice) what the home place holds
    visiting: ClassVar[bool] = True
    #: True where every aggregation of received models goes through ``ctx.aggregate`` /
    #: ``ctx.aggregate_updates`` (lowband.aggregation): an ``[aggregation]`` rule is refused
    #: before the run for an algorithm that keeps False (its server needs individual
    #: updates: FedCSPACK's packs, KTA's logits, FOL's ensembles)
    aggregation_hook: ClassVar[bool] = False
    #: the run's aggregation rule, set by the driver from ``[aggregation]`` (None: none);
    #: reaches every node's context (lowband.engine.executor)
    aggregation: Optional[Any] = None

    def __init__(self, hp: Hyperparams):
        self.hp = hp
        #: Number of nodes of the federation, set by the simulation that drives this object
        #: (the driver's copy under Ray too), for ``steps()`` that must address every node.
        self.num_nodes: Optional[int] = None

    # -- state -----------------------------------------------------------------------
    @abstractmethod
    def init_node(self, ctx: NodeContext) -> State:
        """Initial state of client/peer ``ctx.node``."""

    def init_server(self, ctx: NodeContext) -> State:
        """Initial server state (server-family algorithms)."""
        return {}

    @property
    def has_server(self) -> bool:
        return self.family == "server"

    def check_topology(self, topology: Topology, num_nodes: int) -> None:
        """Raise ``ValueError`` (reported as a one-line config error before anything is
        written) when this algorithm cannot work on ``topology``. Default: accept."""

    # -- rounds ----------------------------------------------------------------------
    @abstractmethod
    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        """The exchange phases of round ``round`` (1-based; round 0 is the initial evaluation) under ``plan``."""

    # -- evaluation hooks (measurement only: never fed back, never counted) ----------
    def node_params(self, state: State) -> Optional[Params]:
        """The model node ``state`` would use for prediction (personal / node_global /
        consensus protocols). None when the node holds no model of its own."""
        return state.get("params")

    def server_params(self, state: State) -> Optional[Params]:
        """The server's global model (``global`` protocol)."""
        return state.get("params")

    def round_metrics(self, server_state: State) -> dict[str, float]:
        """Per-round diagnostics of a server-family algorithm, read from the server's state
        after each evaluated round and written to metrics.jsonl as ``alg/<key>``
        (measurement only: never fed back, never counted). Default: none."""
        return {}

    def node_metrics(self, ctx: NodeContext, state: State) -> dict[str, float]:
        """Per-node measurements after each evaluated round, run on every node (and the
        server, where there is one) with that node's own context, state and data; each
        key is written to metrics.jsonl as ``alg/<key>``, so node-specific keys must name
        the node (e.g. ``fol/c9/ensemble_acc``). Measurement only: never fed back, never
        counted. Default: none (and the engine does not call it)."""
        return {}


REGISTRY: dict[str, type[Algorithm]] = {}


def default_by(data: Any, field: str, by: str, by_default: str, table: Mapping[str, Any]) -> Any:
    """Raw hyperparameters ``data`` with an unset ``field`` filled from ``table`` keyed by the
    value of ``by`` (``by_default`` when that is unset too): a default that depends on another
    choice (FedAvg's server lr on its optimiser, FedAsync's ``a`` on its staleness function).
    For a pydantic ``model_validator(mode="before")``; anything not a dict passes through."""
    if isinstance(data, dict) and data.get(field) is None:
        key = data.get(by, by_default)
        if key in table:
            data = {**data, field: table[key]}
    return data


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator adding an algorithm to the registry under ``cls.name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"algorithm {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def describe_hyperparams(cls: type[Algorithm]) -> Mapping[str, tuple[Any, str]]:
    """name -> (default, description) for `lowband list`."""
    out: dict[str, tuple[Any, str]] = {}
    for name, f in cls.Hyperparams.model_fields.items():
        out[name] = (f.get_default(call_default_factory=True), f.description or "")
    return out


__all__ = [
    "SERVER",
    "Algorithm",
    "Envelope",
    "Hyperparams",
    "NodeContext",
    "Outbox",
    "Params",
    "REGISTRY",
    "State",
    "Step",
    "describe_hyperparams",
    "register",
]
