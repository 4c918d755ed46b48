"""The event clock of a run (:class:`~lowband.asynchronous.clock.EventClock`), built from its
simulation, and the one-line refusals of what an asynchronous run cannot serve.

Refused before anything is written (``ConfigError``, exit 2): ``[topology]`` keys (the
clock, not a sampler, starts clients: ``algorithm.concurrency``), ``[faults]`` (devices
come and go through availability instead), ``links.deadline_s`` (no round waits, so no
round has a deadline), ``[dp]`` and ``[secagg]`` (their accounting and masks are per synchronous cohort) and the
freshness stamp (its round number changes a message's size after the clock timed it).
"""

from __future__ import annotations

from typing import Any, Optional

from lowband.asynchronous.clock import EventClock
from lowband.comm.ledger import Ledger
from lowband.comm.message import SERVER
from lowband.comm.network import Network
from lowband.config.schema import ConfigError
from lowband.engine.errors import config_errors

__all__ = ["MessageSizes", "check", "clock_for"]


class MessageSizes:
    """``sizes(node) -> (download bytes, upload bytes)``: the algorithm's probe messages
    (:meth:`~lowband.algorithms.server.fedasync.AsyncServer.probe_messages`) encoded with the
    run's codecs on a scratch network (its own ledger and codec states: the run's are not
    touched), once per (architecture, training-set size)."""

    def __init__(self, sim: Any, builder: Any):
        self.alg, self.builder = sim.alg, builder
        self.n_train = [int(nd.n_train) for nd in sim.fed.nodes]
        self.net = Network(sim.network.codecs, Ledger(), sim.exp.seed)
        self.cache: dict[tuple[str, int], tuple[int, int]] = {}

    def __call__(self, node: int) -> tuple[int, int]:
        key = (self.builder.key(node), self.n_train[node])
        if key not in self.cache:
            down, up = self.alg.probe_messages(self.builder.init_params(node), self.n_train[node])
            d = self.net.encode_outbox(0, SERVER, [((node,), down)])[0]
            u = self.net.encode_outbox(0, node, [((SERVER,), up)])[0]
            self.cache[key] = (len(d.data or b"") + int(d.declared), len(u.data or b"") + int(u.declared))
        return self.cache[key]


def check(sim: Any) -> None:
    """Refuse, with one line, what the event clock cannot time (module docstring)."""
    exp, name = sim.exp, sim.alg.name
    t = exp.topology
    set_keys = [k for k in ("kind", "sampling", "fraction", "count", "schedule") if k in t.model_fields_set]
    if set_keys:
        raise ConfigError(f"topology.{set_keys[0]}: {name} starts its clients on the event clock (algorithm."
                          f"concurrency of them train at once); leave [topology] out")
    f = exp.faults
    if f.dropout or f.dropout_schedule or f.straggler or f.byzantine is not None:
        raise ConfigError(f"faults: {name} runs on the event clock, where devices come and go by their "
                          f"availability; leave [faults] out")
    if exp.dp is not None or exp.secagg is not None:
        key = "dp" if exp.dp is not None else "secagg"
        raise ConfigError(f"{key}: {name} is not served by [{key}] (its accounting and masks are per synchronous "
                          f"cohort); leave [{key}] out")
    if exp.links is not None and exp.links.deadline_s is not None:
        raise ConfigError(f"links.deadline_s: {name} never waits for a round, so no round has a deadline; drop it")
    v = sim.network.validator
    if v is not None and v.policy.freshness:
        raise ConfigError(f"comm: {name} cannot carry the freshness stamp (its round number changes a message's "
                          f"size after the event clock timed it)")


def clock_for(sim: Any, builder: Any) -> EventClock:
    """The event clock of ``sim`` (checked by :func:`check`): its link model (the ``[links]``
    one, with each node's compute seconds: ``[devices]`` rates where given), its availability
    (``[devices.availability]``), each device's compute energy per job, the algorithm's
    concurrency and buffer size."""
    from lowband.comm.links import node_train_flops
    from lowband.devices.build import availability_model, device_set

    check(sim)
    exp, n = sim.exp, sim.num_nodes
    with config_errors("devices"):
        devices = device_set(exp, n)
        availability = availability_model(exp, n)
    links: Optional[Any] = None
    sizes = None
    compute_j: Optional[list[float]] = None
    if exp.links is not None:
        from lowband.engine.observers.linkclock import LinkClock

        links = LinkClock.from_config(sim, builder).timer.model
        sizes = MessageSizes(sim, builder)
        if devices is not None and devices.has_energy:
            flops = node_train_flops(hp=sim.alg.hp, n_train=[nd.n_train for nd in sim.fed.nodes], model_key=builder.key,
                                     build=builder, input_shape=tuple(sim.fed.input_shape))
            compute_j = [devices.compute_joules(i, flops[i]) for i in range(n)]
    return EventClock(n, int(sim.alg.hp.concurrency), buffer_size=sim.alg.buffer_size, seed=exp.seed, links=links,
                      availability=availability, sizes=sizes, compute_j=compute_j, devices=devices)
