"""The Ray executor: the same algorithm files, with the nodes sharded over long-lived workers.

``executor = "ray"`` (extra ``lowband[ray]``; how-to in docs/scale.md). Design:

- **Shards, not tasks.** ``ray_workers`` actors are each the home of a contiguous block
  of nodes (node ``i`` lives on shard ``i * W // N``; the server on shard 0): their data
  (shipped once, at start), their states and one module per architecture. A round whose
  actors are unevenly spread over the homes lets some visit another shard for the round
  (balanced placement, :mod:`lowband.engine.placement`): state, codec states and data
  travel there through the object store and come back at the end of the round. Each shard is a
  :class:`~lowband.engine.rounds.Place` and the round is the one round loop of
  :mod:`lowband.engine.rounds` (the serial run's and the worker pool's): every node
  computes bit for bit what it computes in the serial executor (given the same torch
  thread count: workers use the driver's, or ``threads`` from the config). This module
  is only the transport: Ray actors, the object store.
- **Messages are encoded where they are sent.** A shard encodes its nodes' outboxes with
  the run's codecs and the addressed codec generators of :class:`~lowband.comm.network.Network`
  (``torch_gen(seed, "codec", round, src, dst or "bcast", kind)``), so the bytes are the
  serial executor's bytes. Only the ledger record (a few integers per message) goes to
  the driver, which appends them to the run's ledger in the serial order (sender, then
  outbox order). Messages between nodes of one shard stay in the worker; a message for
  another shard travels as its wire bytes, worker to worker through the object store
  (the driver only passes references); a broadcast to several shards (the server's model
  to the sampled clients) is put in the object store once.
- **A step is submitted at once.** Each shard's step call takes the bundles the other
  shards produced in the previous step as object references; the driver waits for the
  step's ledger records (needed in order, and by the ``[links]`` deadline) only.
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

**A lost machine** (a node's raylet gone, an actor killed, an object whose owner died) is
:class:`LostWorkerError`: one line saying which shard (nodes, host) was lost and that
``--resume`` continues the run exactly from its last checkpoint. With ``engine.retries``
> 0 the run does that itself (:func:`lowband.engine.retry.run_retrying`): a new executor places its shards on the
capacity the cluster still has (Ray schedules them on the surviving nodes) and the run
continues from the checkpoint, to the metrics an uninterrupted run writes
(tests/test_ray_lost_node.py).
"""

from __future__ import annotations

import os
import socket
import time
from collections import OrderedDict
from typing import Any, Optional

import ray
import torch

from lowband.algorithms.base import Step
from lowband.comm.network import Ack, CodecConfig
from lowband.comm.validate import ValidationPolicy
from lowband.engine.executor import NodeEnv, SerialExecutor
from lowband.engine.retry import LostWorkerError, run_retrying
from lowband.engine.rounds import Late, Place, PutCache, ShardedExecutor, Summary
from lowband.engine.rounds import place_of as shard_of
from lowband.faults import RoundFaults
from lowband.topology import RoundPlan

__all__ = ["LostWorkerError", "RayExecutor", "run_retrying", "shard_of"]

#: what Ray raises when a machine, an actor or an object's owner is gone
_LOST = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError,
         ray.exceptions.WorkerCrashedError)


def _lost(exc: BaseException) -> bool:
    if isinstance(exc, _LOST):
        return True
    cause = getattr(exc, "cause", None)  # a task that failed because what it read was lost
    return isinstance(exc, ray.exceptions.RayTaskError) and cause is not None and isinstance(cause, _LOST)


def _alive_cpus() -> float:
    """The CPUs of the cluster's live nodes (a node just lost may still count in
    ``ray.cluster_resources()`` for a while: shards sized on it would wait forever)."""
    try:
        cpus = sum(float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive"))
    except Exception:  # noqa: BLE001 - an older Ray: its own total
        cpus = 0.0
    return cpus or float(ray.cluster_resources().get("CPU", 1.0))


# --------------------------------------------------------------------------- worker


class _Shard(Place):
    """One worker: a place (lowband.engine.rounds) whose shared arguments and broadcast
    bytes live in Ray's object store."""

    def __init__(self, index: int, num_shards: int, env: NodeEnv, threads: int):
        torch.set_num_threads(int(threads))
        super().__init__(SerialExecutor(env), index, num_shards)
        self._cache: OrderedDict[Any, Any] = OrderedDict()  # ObjectRef -> value (shared arguments)

    def info(self) -> dict[str, Any]:
        return {"shard": self.index, "pid": os.getpid(), "host": socket.gethostname(),
                "ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "nodes": len(self.nodes), "server": self.has_server, "threads": torch.get_num_threads(),
                "cpu_s": time.process_time()}

    def get(self, ref: Any) -> Any:
        if ref in self._cache:
            self._cache.move_to_end(ref)
            return self._cache[ref]
        value = ray.get(ref)
        self._cache[ref] = value
        while len(self._cache) > 16:
            self._cache.popitem(last=False)
        return value

    def share(self, data: bytes, n: int) -> Any:
        return ray.put(data)  # a broadcast to several shards: put once

    def fetch(self, payload: Any) -> Optional[bytes]:
        return self.get(payload)


# --------------------------------------------------------------------------- driver


class RayExecutor(ShardedExecutor):
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
        super().__init__()
        self.env = env
        self.owns_ray = False
        if not ray.is_initialized():
            if address not in (None, "local"):
                ray.init(address=address, log_to_driver=True)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
            self.owns_ray = True
        cpus = _alive_cpus()
        n = env.num_nodes
        self.num_workers = max(1, min(int(num_workers or max(1, int(cpus))), max(n, 1)))
        self.threads = int(threads or torch.get_num_threads())
        # a worker asks for one CPU, or a share when there are more workers than CPUs
        # (more workers than CPUs are allowed; they then time-share the cores)
        per = min(1.0, cpus / self.num_workers)
        actor = ray.remote(_Shard).options(num_cpus=per, scheduling_strategy="SPREAD", max_concurrency=1)
        self.workers = [actor.remote(j, self.num_workers, self.shard_env(j), self.threads)
                        for j in range(self.num_workers)]
        # balanced placement: a round's actors may visit another shard, their data with them
        self.balance = True
        self.worker_info = ray.get([w.info.remote() for w in self.workers])
        self._plan_ref: Optional[tuple[RoundPlan, Any]] = None
        self._puts = PutCache(16)

    def worker_pids(self) -> None:
        """None: the actors' CPU time is not readable here (they may run on other machines), so a
        Ray run's rounds count wall-clock x threads x workers (:mod:`lowband.engine.cputime`)."""
        return None

    # -- transport -----------------------------------------------------------------------------
    def _submit(self, j: int, method: str, *args: Any) -> Any:
        return getattr(self.workers[j], method).remote(*args)

    def _wait(self, handles: list[Any]) -> list[Any]:
        return self._get(handles)

    def _get(self, handles: list[Any]) -> list[Any]:
        """``ray.get``, a lost worker said in one line (:class:`LostWorkerError`)."""
        try:
            return ray.get(handles)
        except Exception as exc:  # noqa: BLE001 - only Ray's "lost" errors are turned into the one line
            if not _lost(exc):
                raise
            raise LostWorkerError(self._what_was_lost(exc)) from None

    def _what_was_lost(self, exc: BaseException) -> str:
        alive = {}
        try:
            alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        except Exception:  # noqa: BLE001 - the description is best effort
            pass
        info = list(getattr(self, "worker_info", []))
        dead = [i for i in info if alive.get(i.get("node_id")) is False]
        actor = getattr(getattr(exc, "cause", None) or exc, "actor_id", None)
        if not dead and actor is not None:  # the actor's error comes before the node is marked dead
            ids = [getattr(getattr(w, "_actor_id", None), "hex", lambda: None)() for w in self.workers]
            dead = [i for i, a in zip(info, ids) if a is not None and a == actor]
        shards = dead
        where = "; ".join(f"shard {i['shard']} ({i['nodes']} nodes) on {i['host']} ({i.get('ip', '?')}, node "
                          f"{str(i.get('node_id', '?'))[:8]})" for i in shards) if shards else "a shard's worker"
        kind = type(getattr(exc, "cause", None) or exc).__name__
        return (f"Ray lost {where} ({kind}: a machine or its worker process is gone); the run's last "
                f"checkpoint is kept: `lowband run CONFIG --resume` continues it exactly (or set "
                f"engine.retries to continue on the remaining machines by itself)")

    def _plan(self, plan: RoundPlan) -> Any:
        if self._plan_ref is None or self._plan_ref[0] is not plan:
            self._plan_ref = (plan, ray.put(plan))
        return self._plan_ref[1]

    def _put(self, obj: Any) -> tuple[str, Any]:
        """An argument for the workers: small values inline, others put in the object
        store once per object (see :class:`~lowband.engine.rounds.PutCache`)."""
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return ("val", obj)
        ref = self._puts.get(obj)
        if ref is None:
            ref = ray.put(obj)
            self._puts.add(obj, ref)
        return ("ref", ref)

    def step_places(self, step: Step, round: int, plan: RoundPlan, codecs: CodecConfig, seed: int,
                    policy: Optional[ValidationPolicy], faults: RoundFaults, late: Late,
                    first: bool, last: bool, acks: list[Ack]) -> list[Summary]:
        """One step on every shard; the bundles for the other shards stay in the object
        store (the driver passes references) until the next step."""
        w = self.num_workers
        spec, plan_ref = self._spec(step.fn), self._plan(plan)
        actors = self._split(step.actors)
        prev = self._bundles if not first and self._bundles is not None else [[None] * w for _ in range(w)]
        per = self._acks_per_place(acks)
        outs = []
        for j, worker in enumerate(self.workers):
            incoming = [prev[i][j] for i in range(w) if i != j]
            outs.append(worker.step.options(num_returns=w + 1).remote(
                spec, round, plan_ref, step.name, actors[j], codecs, seed, policy, faults, late, first, last,
                per[j], *incoming))
        self._bundles = None if last else [list(o[1:]) for o in outs]
        return self._get([o[0] for o in outs])

    def close(self) -> None:
        """Stop the workers (and the local Ray runtime this executor started)."""
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # noqa: BLE001 - an actor already lost with its machine
                pass
        self.workers = []
        if self.owns_ray:
            ray.shutdown()
