"""Executors run per-node work; they own the node states (design rule 1).

The orchestrator hands an executor a :class:`~lowband.algorithms.base.Step` and the
inboxes; the executor runs the step's function on each actor with that actor's context
and state only, stores the new state and returns the outboxes. The round itself (routing,
encoding, counting) is :mod:`lowband.engine.rounds`, the same for every backend: the
serial executor is its one in-process place; the worker pool
(:class:`lowband.engine.pool.PoolExecutor`) and Ray
(:class:`lowband.engine.ray_executor.RayExecutor`) shard the node states over places in
other processes and implement the same methods; :mod:`lowband.engine.backends` chooses one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol

import torch
from torch import nn

from lowband.algorithms.base import SERVER, Algorithm, Envelope, NodeContext, Outbox, Params, State, Step
from lowband.engine import cohort
from lowband.engine.inbox import own_inbox
from lowband.seeding import derive_seed, seed_torch
from lowband.topology import RoundPlan
from lowband.train import diverged_count


def map_many(fn: Callable[..., Any]) -> Optional[Callable[..., Any]]:
    """The batched form of a per-node function ``partial(f, **kw)`` whose ``f`` carries one
    (``f.map_many(executor, nodes, round, plan, **kw) -> {node: result}``, the same results
    as ``f`` per node, e.g. lowband.engine.node_eval), else None."""
    if isinstance(fn, functools.partial) and not fn.args:
        many = getattr(fn.func, "map_many", None)
        if many is not None:
            return functools.partial(many, **fn.keywords)
    return None


@dataclass
class ServerData:
    """The server's own holdings: the public reference set (inputs and labels), if any,
    and the dataset's published per-channel input normalisation ``(mean, std)`` (what a
    data-free method needs to map generated ``[0, 1]`` images into the models' input
    space; the reference codes of DENSE and Co-Boosting hard-code it per dataset)."""

    public_x: torch.Tensor
    public_y: torch.Tensor
    input_stats: Optional[tuple[list[float], list[float]]] = None


@dataclass
class NodeEnv:
    """Static, read-only facts every worker needs to build contexts."""

    algorithm: Algorithm
    node_data: list[Any]
    server_data: ServerData
    seed: int
    num_classes: int
    model_factory: Callable[[int], nn.Module]  # node -> a fresh module of that node's architecture
    model_key: Callable[[int], str]  # node -> architecture key (modules are cached per key)
    init_params: Callable[[int], Params]  # node -> shared initial parameters of its architecture
    public_x: Optional[torch.Tensor] = None
    #: engine.vectorize: "auto", "on" or "off" (lowband.engine.cohort)
    vectorize: str = "off"

    @property
    def num_nodes(self) -> int:
        return len(self.node_data)


class Executor(Protocol):
    def init_states(self, plan: RoundPlan) -> None: ...
    def run_step(self, step: Step, round: int, plan: RoundPlan,
                 inboxes: dict[int, list[Envelope]]) -> dict[int, Outbox]: ...
    def map_nodes(self, fn: Callable[[NodeContext, State], Any], nodes: Iterable[int],
                  round: int, plan: RoundPlan) -> dict[int, Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, sd: dict[str, Any]) -> None: ...


class LazyStates(dict):
    """Node states made on first read (cost proportional to the participants, issue 43).

    A dict of the states made so far; reading a missing node of ``nodes`` builds its
    initial state with ``executor.init_state(node)`` (addressed seed, so the same state
    whenever and wherever it is first read, as the eager loop made it) and keeps it. A
    client that never takes part costs no tensor and no RNG call; a checkpoint holds only
    the states made so far (:meth:`SerialExecutor.state_dict`)."""

    def __init__(self, executor: "SerialExecutor", nodes: Iterable[int]):
        super().__init__()
        self._ex = executor
        self._nodes = nodes if isinstance(nodes, range) else frozenset(int(n) for n in nodes)

    def __missing__(self, node: int) -> State:
        if node not in self._nodes:
            raise KeyError(node)
        state = self[node] = self._ex.init_state(node)
        return state

    def pop(self, node: int, *default: Any) -> State:  # type: ignore[override]
        if node not in self and node in self._nodes:
            self[node]
        return super().pop(node, *default)

    def __reduce__(self) -> Any:  # a plain dict of the states made so far, when pickled
        return (dict, (self.ordered(),))

    def ordered(self) -> dict[int, State]:
        """The states made so far as a plain dict in the serial order (nodes by id, then
        the server), whatever order they were first read in."""
        return {k: dict.__getitem__(self, k) for k in sorted(dict.keys(self), key=lambda k: (k == SERVER, k))}


class SerialExecutor:
    """Runs every node's work in this process, one node after another.

    One module per architecture is shared by all nodes (loaded with each node's
    parameters in turn). Before each node's step the global torch RNG is seeded from
    (seed, round, node, step) so dropout and friends do not depend on processing order.
    """

    def __init__(self, env: NodeEnv):
        self.env = env
        self.states: dict[int, State] = {}
        #: the round-0 plan the nodes' initial states are made with (:meth:`init_state`)
        self.init_plan: Optional[RoundPlan] = None
        self._models: dict[str, nn.Module] = {}
        #: (round, node) of each step whose local training diverged (a non-finite loss, see
        #: lowband.train.note_divergence); the simulation empties it every round
        self.diverged: list[tuple[int, int]] = []

    # -- contexts ----------------------------------------------------------------------
    def model_for(self, node: int) -> nn.Module:
        key = self.env.model_key(node)
        if key not in self._models:
            # built without touching the global RNG (its init is overwritten anyway), so a
            # node's seeded step does not depend on whether this process built it first
            with torch.random.fork_rng(devices=[]):
                self._models[key] = self.env.model_factory(node)
        return self._models[key]

    def context(self, node: int, round: int, plan: RoundPlan) -> NodeContext:
        env = self.env
        data = env.server_data if node == SERVER else env.node_data[node]
        return NodeContext(
            node=node, round=round, plan=plan, data=data, model=self.model_for(node),
            hp=env.algorithm.hp, seed=env.seed, num_nodes=env.num_nodes, num_classes=env.num_classes,
            init_params=lambda n=node: env.init_params(n), public_x=env.public_x,
            aggregation=env.algorithm.aggregation,
        )

    # -- work ----------------------------------------------------------------------------
    def init_states(self, plan: RoundPlan, nodes: Optional[Iterable[int]] = None) -> None:
        """The nodes' initial states, made lazily (:class:`LazyStates`: a node's state is
        built, from its own seed, when something first reads it), and the server's now."""
        alg = self.env.algorithm
        self.init_plan = plan
        self.states = LazyStates(self, range(self.env.num_nodes) if nodes is None else nodes)
        if alg.has_server:
            seed_torch(derive_seed(self.env.seed, "torch", "init", SERVER))
            self.states[SERVER] = alg.init_server(self.context(SERVER, 0, plan))

    def init_state(self, node: int) -> State:
        """Node ``node``'s initial state, as :meth:`init_states` would have made it: seeded
        by ``(seed, "torch", "init", node)`` with the global generator's state kept around
        the call (a node first read inside another node's seeded step changes nothing)."""
        with torch.random.fork_rng(devices=[]):
            seed_torch(derive_seed(self.env.seed, "torch", "init", node))
            return self.env.algorithm.init_node(self.context(node, 0, self.init_plan))

    def run_step(self, step: Step, round: int, plan: RoundPlan,
                 inboxes: dict[int, list[Envelope]]) -> dict[int, Outbox]:
        if self.env.vectorize != "off" and cohort.vectorised(step.fn):  # local SGD in cohorts
            return cohort.run_step(self, step, round, plan, inboxes, self.env.vectorize)
        out: dict[int, Outbox] = {}
        for node in step.actors:
            seed_torch(derive_seed(self.env.seed, "torch", round, node, step.name))
            ctx = self.context(node, round, plan)
            before = diverged_count()
            inbox = own_inbox(inboxes, node)
            new_state, outbox = step.fn(ctx, self.states[node], inbox)
            if diverged_count() != before:
                self.diverged.append((round, node))
            self.states[node] = new_state
            out[node] = outbox
        return out

    def map_nodes(self, fn: Callable[[NodeContext, State], Any], nodes: Iterable[int],
                  round: int, plan: RoundPlan) -> dict[int, Any]:
        many = map_many(fn)
        if many is not None:  # a batched form over this executor's nodes (same results)
            return many(self, list(nodes), round, plan)
        return {n: fn(self.context(n, round, plan), self.states[n]) for n in nodes}

    def map_places(self, fn: Callable[[Any, list[int]], Any], nodes: Iterable[int]) -> list[Any]:
        """``[fn(self, nodes)]``: the one place of a serial run (see ShardedExecutor.map_places)."""
        nodes = [int(n) for n in nodes]
        return [fn(self, nodes)] if nodes else []

    def worker_pids(self) -> list[int]:
        """No worker processes: the run's CPU time is this process's (:mod:`lowband.engine.cputime`)."""
        return []

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The states made so far (a node never read has only its initial state, remade on
        load), nodes in id order, then the server."""
        return {str(k): self.states[k] for k in sorted(self.states, key=lambda k: (k == SERVER, k))}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """The saved states; a node not among them (never read before the save) gets its
        initial state when first read, as in the run that saved them."""
        states = LazyStates(self, range(self.env.num_nodes))
        states.update({int(k): v for k, v in sd.items()})
        self.states = states
