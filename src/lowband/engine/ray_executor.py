"""The Ray executor: the same algorithm files, with the nodes sharded over long-lived workers.

``executor = "ray"`` (extra ``lowband[ray]``; how-to in docs/scale.md). Design:

- **Shards, not tasks.** ``ray_workers`` actors each own a contiguous block of nodes
  (node ``i`` lives on shard ``i * W // N``; the server on shard 0): their data (shipped
  once, at start), their states and one module per architecture. A shard runs its nodes'
  steps exactly as :class:`~lowband.engine.executor.SerialExecutor` does, with the same
  per-node seeding ``derive_seed(seed, "torch", round, node, step)``, so every node
  computes bit for bit what it computes in the serial executor (given the same torch
  thread count: workers use the driver's, or ``threads`` from the config).
- **Messages are encoded where they are sent.** A shard encodes its nodes' outboxes with
  the run's codecs and the addressed codec generators of :class:`~lowband.comm.network.Network`
  (``torch_gen(seed, "codec", round, src, dst or "bcast", kind)``), so the bytes are the
  serial executor's bytes. Only the ledger record (a few integers per message) goes to
  the driver, which appends them to the run's ledger in the serial order (sender, then
  outbox order). Messages between nodes of one shard stay in the worker; a message for
  another shard travels as its wire bytes, worker to worker through the object store
  (the driver only passes references); a broadcast to several shards (the server's model
  to the sampled clients) is put in the object store once.
- **A round is submitted at once.** ``run_round`` chains the round's steps: each shard's
  step call takes the bundles the other shards produced in the previous step, so the
  driver waits once per round, not once per step.
- **Receivers validate** what they get through the same
  :meth:`~lowband.comm.network.Network.receive` / :meth:`~lowband.comm.network.Network.screen`
  as the serial round (design rule 8), and ``[faults]`` filters delivery the same way;
  each step call returns its refusals and divergences with its ledger records, and the
  driver counts them (and raises the first under ``on_invalid = "abort"``).
- **Evaluation** runs through :meth:`map_nodes`; arguments of ``functools.partial`` step
  functions (the evaluator's) are put in the object store once and cached on the
  workers, so the global test set crosses once per run.

The ledger, ``metrics.jsonl`` and the states are identical to the serial executor's for
the same config and seed (tests/test_ray.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import socket
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable, Optional, Sequence

import ray
import torch

from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, State, Step
from lowband.comm.ledger import Ledger
from lowband.comm.network import CodecConfig, Network
from lowband.comm.validate import ExpectedShapes, InvalidMessageError, Rejection, ValidationPolicy, Validator
from lowband.engine.executor import NodeEnv, SerialExecutor, ServerData
from lowband.faults import NO_FAULTS, RoundFaults
from lowband.seeding import derive_seed
from lowband.topology import RoundPlan

__all__ = ["RayExecutor", "shard_of"]

# a message in flight: ((src, item index), receivers on the destination shard, wire bytes
# or an ObjectRef of them (None: refused at the sender), stand-in tensors or None, kind)
_Item = tuple[tuple[int, int], tuple[int, ...], Any, Optional[dict[str, torch.Tensor]], str]
# a ledger record: (src, item index, receivers, direction, kind, encoded bytes, declared bytes)
_Record = tuple[int, int, tuple[int, ...], str, str, int, int]


def shard_of(node: int, num_nodes: int, num_shards: int) -> int:
    """The shard that owns ``node``: contiguous blocks; the server lives on shard 0."""
    if node == SERVER:
        return 0
    return node * num_shards // max(num_nodes, 1)


# --------------------------------------------------------------------------- worker


class _Shard:
    """One worker: a serial executor over its own nodes, plus message routing."""

    def __init__(self, index: int, num_shards: int, env: NodeEnv, threads: int):
        torch.set_num_threads(int(threads))
        self.index, self.num_shards = index, num_shards
        self.ex = SerialExecutor(env)
        self.num_nodes = env.num_nodes
        self.nodes = [i for i, d in enumerate(env.node_data) if d is not None]
        self.has_server = index == 0 and env.algorithm.has_server
        self._local: list[_Item] = []  # messages to this shard's nodes, for the next step
        self._cache: OrderedDict[Any, Any] = OrderedDict()  # ObjectRef -> value (shared arguments)
        self._network: Optional[tuple[CodecConfig, int, Optional[ValidationPolicy], Network]] = None
        #: codec states of this shard's senders (they encode here; see Network.codec_states)
        self.codec_states: dict[int, dict[str, Any]] = {}

    def info(self) -> dict[str, Any]:
        return {"shard": self.index, "pid": os.getpid(), "host": socket.gethostname(),
                "nodes": len(self.nodes), "server": self.has_server, "threads": torch.get_num_threads(),
                "cpu_s": time.process_time()}

    # -- helpers -------------------------------------------------------------------------
    def _get(self, ref: Any) -> Any:
        if ref in self._cache:
            self._cache.move_to_end(ref)
            return self._cache[ref]
        value = ray.get(ref)
        self._cache[ref] = value
        while len(self._cache) > 16:
            self._cache.popitem(last=False)
        return value

    def _fn(self, spec: tuple) -> Callable:
        kind = spec[0]
        if kind == "method":
            return getattr(self.ex.env.algorithm, spec[1])
        if kind == "partial":
            _, inner, args, kwargs = spec
            return functools.partial(self._fn(inner), *[self._arg(a) for a in args],
                                     **{k: self._arg(v) for k, v in kwargs.items()})
        return spec[1]

    def _arg(self, a: tuple) -> Any:
        return self._get(a[1]) if a[0] == "ref" else a[1]

    def _net(self, codecs: CodecConfig, seed: int, policy: Optional[ValidationPolicy]) -> Network:
        if self._network is None or self._network[:3] != (codecs, seed, policy):
            env = self.ex.env
            # the shard collects refusals; the driver applies the abort policy to them
            validator = None if policy is None else Validator(dataclasses.replace(policy, on_invalid="reject"),
                                                              ExpectedShapes(env.init_params, env.model_key))
            self._network = (codecs, seed, policy, Network(codecs, Ledger(), seed, validator=validator))
        net = self._network[3]
        net.codec_states = self.codec_states
        return net

    # -- states --------------------------------------------------------------------------
    def init_states(self, plan: RoundPlan) -> None:
        ex, alg, seed = self.ex, self.ex.env.algorithm, self.ex.env.seed
        for node in self.nodes:
            torch.manual_seed(derive_seed(seed, "torch", "init", node))
            ex.states[node] = alg.init_node(ex.context(node, 0, plan))
        if self.has_server:
            torch.manual_seed(derive_seed(seed, "torch", "init", SERVER))
            ex.states[SERVER] = alg.init_server(ex.context(SERVER, 0, plan))

    def get_states(self) -> dict[int, State]:
        return dict(self.ex.states)

    def set_states(self, states: dict[int, State]) -> None:
        self.ex.states = dict(states)

    def get_codec_states(self) -> dict[str, Any]:
        net = Network(CodecConfig(), Ledger(), 0)
        net.codec_states = self.codec_states
        return net.codec_state_dict()

    def set_codec_states(self, sd: dict[str, Any]) -> None:
        net = Network(CodecConfig(), Ledger(), 0)
        net.load_codec_state_dict(sd)
        self.codec_states = net.codec_states
        if self._network is not None:
            self._network[3].codec_states = self.codec_states

    # -- work ----------------------------------------------------------------------------
    def step(self, spec: tuple, round: int, plan: RoundPlan, name: str, actors: list[int],
             codecs: CodecConfig, seed: int, fresh: bool, policy: Optional[ValidationPolicy],
             faults: RoundFaults, last: bool, *incoming: Optional[list[_Item]]) -> tuple:
        """Deliver the previous step's messages, run ``actors``' step, encode their outboxes
        (``last``: the round's last step, whose messages nobody reads: only counted).

        Returns ``((records, refusals, divergences), bundle for shard 0, ..., bundle for
        shard W-1)``."""
        if fresh:
            self._local = []
        net = self._net(codecs, seed, policy)
        net.rejections = []
        inboxes = self._deliver([*self._local, *(it for b in incoming if b for it in b)], round, net, faults)
        self._local = []
        self.ex.diverged = []
        outboxes = self.ex.run_step(Step(name, actors, self._fn(spec)), round, plan, inboxes)
        records, *bundles = self._send(outboxes, round, net, last)
        return ((records, net.rejections, self.ex.diverged), *bundles)

    def _deliver(self, items: list[_Item], round: int, net: Network, faults: RoundFaults) -> dict[int, list[Envelope]]:
        """Decode each message once and give every receiver its own validated copy, in the
        serial executor's inbox order (by sender, then outbox order); as Simulation.route."""
        inboxes: dict[int, list[Envelope]] = {}
        for (src, _), dsts, payload, stand_in, kind in sorted(items, key=lambda it: it[0]):
            dsts = faults.deliverable(src, dsts) if faults.any else dsts
            if not dsts:
                continue
            data = payload if payload is None or isinstance(payload, bytes) else self._get(payload)
            for dst, m in net.receive(data, src, dsts, round=round, kind=kind, stand_in=stand_in).items():
                inboxes.setdefault(dst, []).append(Envelope(src, m))
        return net.screen(round, inboxes)

    def _send(self, outboxes: dict[int, Outbox], round: int, net: Network, last: bool) -> tuple:
        records: list[_Record] = []
        bundles: list[list[_Item]] = [[] for _ in range(self.num_shards)]
        for src in sorted(outboxes):
            for t in net.encode_outbox(round, src, outboxes[src].items):
                if t.data is not None:
                    records.append((t.src, t.index, t.dsts, t.direction, t.kind, len(t.data), t.declared))
                if last:
                    continue
                per_shard: dict[int, list[int]] = {}
                for d in t.dsts:
                    per_shard.setdefault(shard_of(d, self.num_nodes, self.num_shards), []).append(d)
                remote = [j for j in per_shard if j != self.index]
                payload: Any = ray.put(t.data) if len(remote) > 1 and t.data is not None else t.data
                stand_in = t.stand_in or None
                for j, ds in per_shard.items():
                    item = ((t.src, t.index), tuple(ds), t.data if j == self.index else payload, stand_in, t.kind)
                    (self._local if j == self.index else bundles[j]).append(item)
        return (records, *[b or None for b in bundles])

    def run_step(self, spec: tuple, round: int, plan: RoundPlan, name: str, actors: list[int],
                 inboxes: dict[int, list[Envelope]]) -> dict[int, Outbox]:
        """The plain executor protocol (messages routed by the caller)."""
        return self.ex.run_step(Step(name, actors, self._fn(spec)), round, plan, inboxes)

    def map_nodes(self, spec: tuple, nodes: list[int], round: int, plan: RoundPlan) -> dict[int, Any]:
        return self.ex.map_nodes(self._fn(spec), nodes, round, plan)


# --------------------------------------------------------------------------- driver


class RayExecutor:
    """Shards the nodes over ``num_workers`` Ray actors (see the module docstring).

    ``address``: an existing cluster ("auto", "host:6379", "ray://host:10001"); None
    starts a local runtime with ``num_cpus`` CPUs (all of the machine's when None). An
    already initialised Ray (``ray.init`` called by the caller) is used as it is.
    ``num_workers``: shard actors (None: one per CPU of the runtime, at most one per
    node). ``threads``: torch threads per worker (None: the driver's count, which keeps
    results identical to a serial run in this process).
    """

    def __init__(self, env: NodeEnv, *, address: Optional[str] = None, num_workers: Optional[int] = None,
                 num_cpus: Optional[int] = None, threads: Optional[int] = None):
        self.env = env
        self.owns_ray = False
        if not ray.is_initialized():
            if address not in (None, "local"):
                ray.init(address=address, log_to_driver=True)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
            self.owns_ray = True
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        n = env.num_nodes
        self.num_workers = max(1, min(int(num_workers or max(1, int(cpus))), max(n, 1)))
        self.threads = int(threads or torch.get_num_threads())
        # a worker asks for one CPU, or a share when there are more workers than CPUs
        # (more workers than CPUs are allowed; they then time-share the cores)
        per = min(1.0, cpus / self.num_workers)
        actor = ray.remote(_Shard).options(num_cpus=per, scheduling_strategy="SPREAD", max_concurrency=1)
        self.workers = [actor.remote(j, self.num_workers, self._shard_env(j), self.threads)
                        for j in range(self.num_workers)]
        self.worker_info = ray.get([w.info.remote() for w in self.workers])
        self._plan: Optional[tuple[RoundPlan, Any]] = None
        #: (round, node) of the steps whose local training diverged (see SerialExecutor)
        self.diverged: list[tuple[int, int]] = []
        self._puts: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # id(obj) -> (obj, ObjectRef)

    # -- setup -----------------------------------------------------------------------------
    def _shard_env(self, j: int) -> NodeEnv:
        n, w = self.env.num_nodes, self.num_workers
        data = [d if shard_of(i, n, w) == j else None for i, d in enumerate(self.env.node_data)]
        server = self.env.server_data if j == 0 else ServerData(torch.empty(0), torch.empty(0, dtype=torch.long))
        return dataclasses.replace(self.env, node_data=data, server_data=server)

    def shard(self, node: int) -> int:
        return shard_of(node, self.env.num_nodes, self.num_workers)

    def _split(self, nodes: Iterable[int]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.num_workers)]
        for node in nodes:
            out[self.shard(int(node))].append(int(node))
        return out

    def _plan_ref(self, plan: RoundPlan) -> Any:
        if self._plan is None or self._plan[0] is not plan:
            self._plan = (plan, ray.put(plan))
        return self._plan[1]

    def _put(self, obj: Any) -> tuple[str, Any]:
        """An argument for the workers: small values inline, others put in the object
        store once per object (an LRU keyed by identity that holds the object, so an id
        cannot be reused while cached). Arguments are read-only values: an object passed
        again is not shipped again, so pass a new object for a new value."""
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return ("val", obj)
        key = id(obj)
        hit = self._puts.get(key)
        if hit is not None and hit[0] is obj:
            self._puts.move_to_end(key)
            return ("ref", hit[1])
        ref = ray.put(obj)
        self._puts[key] = (obj, ref)
        while len(self._puts) > 16:
            self._puts.popitem(last=False)
        return ("ref", ref)

    def _spec(self, fn: Callable) -> tuple:
        """How a worker finds ``fn``: a method of its own copy of the algorithm by name, a
        partial with its arguments shipped once, or the callable itself (cloudpickled)."""
        alg = self.env.algorithm
        if inspect.ismethod(fn) and fn.__self__ is alg:
            name = fn.__func__.__name__
            if getattr(getattr(alg, name, None), "__func__", None) is fn.__func__:
                return ("method", name)
        if isinstance(fn, functools.partial):
            return ("partial", self._spec(fn.func), [self._put(a) for a in fn.args],
                    {k: self._put(v) for k, v in fn.keywords.items()})
        return ("callable", fn)

    # -- the executor protocol ---------------------------------------------------------------
    def init_states(self, plan: RoundPlan) -> None:
        ref = self._plan_ref(plan)
        ray.get([w.init_states.remote(ref) for w in self.workers])

    def run_round(self, steps: Sequence[Step], round: int, plan: RoundPlan, network: Network,
                  faults: RoundFaults = NO_FAULTS) -> None:
        """Run a round's steps with routing on the workers; append the ledger records, the
        receivers' refusals (``network.rejections``) and the divergences (:attr:`diverged`)."""
        w = self.num_workers
        plan_ref = self._plan_ref(plan)
        policy = network.validator.policy if network.validator is not None else None
        prev: Optional[list[list[Any]]] = None
        record_refs: list[list[Any]] = []
        for k, step in enumerate(steps):
            spec = self._spec(step.fn)
            actors = self._split(step.actors)
            outs = []
            for j, worker in enumerate(self.workers):
                incoming = [prev[i][j] for i in range(w) if i != j] if prev is not None else []
                outs.append(worker.step.options(num_returns=w + 1).remote(
                    spec, round, plan_ref, step.name, actors[j], network.codecs, network.seed, k == 0, policy,
                    faults, k == len(steps) - 1, *incoming))
            record_refs.append([o[0] for o in outs])
            prev = [list(o[1:]) for o in outs]
        flat = ray.get([r for rs in record_refs for r in rs])
        ledger = network.ledger
        for k in range(len(steps)):
            parts = flat[k * w:(k + 1) * w]
            # refusals of the messages delivered at the start of step k (sent in step k-1)
            refusals: list[Rejection] = sorted((x for part in parts for x in part[1]),
                                               key=lambda x: (x.src, x.dst, x.reason, x.kind))
            if refusals and policy is not None and policy.on_invalid == "abort":
                raise InvalidMessageError(refusals[0])
            network.rejections.extend(refusals)
            self.diverged.extend(sorted(d for part in parts for d in part[2]))
            records = sorted((r for part in parts for r in part[0]), key=lambda r: (r[0], r[1]))
            for src, _, dsts, direction, kind, nbytes, declared in records:
                if len(dsts) == 1:
                    ledger.record(round, src, dsts[0], direction, kind, nbytes, declared)
                else:
                    ledger.record_many(round, src, dsts, direction, kind, nbytes, declared)

    def run_step(self, step: Step, round: int, plan: RoundPlan,
                 inboxes: dict[int, list[Envelope]]) -> dict[int, Outbox]:
        """One step with the caller routing the messages (the plain protocol; the
        simulator uses :meth:`run_round`)."""
        spec, plan_ref = self._spec(step.fn), self._plan_ref(plan)
        refs = [worker.run_step.remote(spec, round, plan_ref, step.name, part,
                                       {n: inboxes[n] for n in part if n in inboxes})
                for worker, part in zip(self.workers, self._split(step.actors)) if part]
        out: dict[int, Outbox] = {}
        for part in ray.get(refs):
            out.update(part)
        return {int(n): out[int(n)] for n in step.actors}

    def map_nodes(self, fn: Callable[[NodeContext, State], Any], nodes: Iterable[int],
                  round: int, plan: RoundPlan) -> dict[int, Any]:
        nodes = [int(n) for n in nodes]
        spec, plan_ref = self._spec(fn), self._plan_ref(plan)
        refs = [worker.map_nodes.remote(spec, part, round, plan_ref)
                for worker, part in zip(self.workers, self._split(nodes)) if part]
        res: dict[int, Any] = {}
        for part in ray.get(refs):
            res.update(part)
        return {n: res[n] for n in nodes}

    # -- states and checkpoints ------------------------------------------------------------------
    @property
    def states(self) -> dict[int, State]:
        """A snapshot of every node's state, gathered from the workers (serial order:
        nodes 0..n-1, then the server)."""
        merged: dict[int, State] = {}
        for part in ray.get([worker.get_states.remote() for worker in self.workers]):
            merged.update(part)
        order = [n for n in range(self.env.num_nodes) if n in merged] + ([SERVER] if SERVER in merged else [])
        return {n: merged[n] for n in order}

    def state_dict(self) -> dict[str, Any]:
        return {str(k): v for k, v in self.states.items()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        parts: list[dict[int, State]] = [{} for _ in range(self.num_workers)]
        for k, v in sd.items():
            parts[self.shard(int(k))][int(k)] = v
        ray.get([worker.set_states.remote(p) for worker, p in zip(self.workers, parts)])

    def codec_state_dict(self) -> dict[str, Any]:
        """The senders' codec states (error-feedback residuals, warm starts), gathered
        from the shards where they encode (see :meth:`Network.codec_state_dict`)."""
        merged: dict[str, Any] = {}
        for part in ray.get([worker.get_codec_states.remote() for worker in self.workers]):
            merged.update(part)
        return {k: merged[k] for k in sorted(merged, key=int)}

    def load_codec_state_dict(self, sd: dict[str, Any]) -> None:
        """Scatter checkpointed codec states to the shards of their senders."""
        parts: list[dict[str, Any]] = [{} for _ in range(self.num_workers)]
        for k, v in sd.items():
            parts[self.shard(int(k))][k] = v
        ray.get([worker.set_codec_states.remote(p) for worker, p in zip(self.workers, parts)])

    def close(self) -> None:
        """Stop the workers (and the local Ray runtime this executor started)."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self.owns_ray:
            ray.shutdown()
