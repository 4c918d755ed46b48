"""HierFAVG (Liu, Zhang, Song and Letaief, Client-Edge-Cloud Hierarchical Federated Learning,
ICC 2020): devices -> edge aggregators (gateways) -> cloud.

One lowband round is one cloud aggregation:

1. the cloud (the server) sends the global model to every gateway (``down``, kind ``global``);
2. ``kappa2`` times: each gateway sends its edge model (the cloud's, the first time; else
   the sample-weighted average of its devices' last models) to its devices of the round
   (``peer``, kind ``edge``); each device runs ``kappa1`` local SGD iterations (minibatches
   of ``batch_size``) from it and sends its model and its number of training examples
   back (``peer``, kind ``weights``);
3. each gateway averages its devices' models and sends the result with its devices'
   example count to the cloud (``up``, kind ``edge_weights``); the cloud replaces the
   global model by the example-weighted average of the edge models.

**Gateways are nodes.** The last ``edges`` nodes of the federation are the gateways
(their own state: the edge model; their data is not trained on); the other nodes are the
devices, in contiguous blocks, block ``e`` under gateway ``e``. A gateway is an actor of
its steps like any node; the driver knows nothing of tiers. The round's devices are the
plan's participants that are not gateways (a star's sample; the paper uses all clients),
gateways always take part (:attr:`infrastructure`: availability never switches them
off). The ledger tells the tiers apart by direction (``peer``: device tier; ``up`` /
``down``: the gateway-cloud tier) and by kind; ``[links] nodes`` gives the gateways their
own preset (e.g. ``lte``) while device-gateway messages travel on the devices' links
(:class:`lowband.comm.links.LinkModel` ``relays``).

Defaults are the paper's MNIST setting (its reference code's example command): learning
rate 0.01 decayed by 0.995 per cloud round, batch size 20, no momentum, 5 edge servers,
``kappa1 x kappa2 = 60`` local iterations per cloud round; of the splits the paper
compares for that product we default to ``kappa1 = 15``, ``kappa2 = 4`` (the reference
command's ``60 x 1`` makes the gateways mere relays: FedAvg with one more hop).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from pydantic import Field

from lowband.algorithms.base import SERVER, Algorithm, Envelope, Hyperparams, NodeContext, Outbox, State, Step, register
from lowband.comm.message import Message
from lowband.topology import RoundPlan, Topology
from lowband.train import TrainStats, decayed_lr, weighted_average
from lowband.train.cohort import LocalSGDStep, SGDJob


class HierFAVGHP(Hyperparams):
    lr: float = Field(0.01, gt=0, description="device learning rate (paper's MNIST runs)")
    lr_decay: float = Field(0.995, gt=0, le=1, description="lr x lr_decay**(round-1), per cloud round")
    batch_size: int = Field(20, ge=1, description="device minibatch size")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (reset at every edge round)")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay")
    kappa1: int = Field(15, ge=1, description="local SGD iterations per edge aggregation")
    kappa2: int = Field(4, ge=1, description="edge aggregations per cloud aggregation (one lowband round)")
    edges: int = Field(5, ge=1, description="number of gateways (edge aggregators): the last `edges` nodes")

    def samples_per_upload(self, n_train: int) -> int:
        """Samples a device trains on between an edge model and its reply (the link clock's compute)."""
        return int(self.kappa1) * min(int(self.batch_size), max(int(n_train), 1))


@register
class HierFAVG(Algorithm):
    """Client-edge-cloud hierarchical FedAvg (module docstring)."""

    name = "hierfavg"
    family = "server"
    paper = "Liu et al., Client-Edge-Cloud Hierarchical Federated Learning, ICC 2020"
    Hyperparams = HierFAVGHP
    default_protocols = ("global",)
    default_main = "global/acc"
    personalized = False

    # -- the hierarchy -------------------------------------------------------------------
    @property
    def gateways(self) -> tuple[int, ...]:
        n, e = int(self.num_nodes or 0), int(self.hp.edges)
        return tuple(range(n - e, n))

    @property
    def infrastructure(self) -> tuple[int, ...]:
        """Nodes that are infrastructure, not devices (always on; no device compute)."""
        return self.gateways

    @property
    def compute_phases(self) -> int:
        """Local trainings of a device per round (its replies to its gateway)."""
        return int(self.hp.kappa2)

    def gateway_of(self, device: int) -> int:
        n, e = int(self.num_nodes or 0), int(self.hp.edges)
        d = n - e
        return n - e + (int(device) * e) // d

    def devices_of(self, gateway: int, plan: RoundPlan) -> list[int]:
        gw = set(self.gateways)
        return [p for p in plan.participants if p not in gw and self.gateway_of(p) == gateway]

    def check_topology(self, topology: Topology, num_nodes: int) -> None:
        if getattr(topology, "kind", None) != "star":
            raise ValueError("hierfavg runs on a star (devices are sampled from it; gateways and the cloud are "
                             "the hierarchy): use topology.kind = 'star'")
        e = int(self.hp.edges)
        if num_nodes < 2 * e:
            raise ValueError(f"hierfavg: {num_nodes} nodes cannot hold {e} gateways and at least one device per "
                             f"gateway; use data.num_clients >= {2 * e} or fewer algorithm.edges")

    # -- state ---------------------------------------------------------------------------
    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params(), "n": 0} if ctx.node in self.gateways else {}

    def init_server(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def node_params(self, state: State) -> Any:
        return state.get("params")

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        gws = list(self.gateways)
        gw = set(gws)
        devices = [p for p in plan.participants if p not in gw]
        out = [Step("cloud_broadcast", [SERVER], self.cloud_broadcast)]
        for j in range(1, int(self.hp.kappa2) + 1):
            out.append(Step(f"edge_{j}", gws, partial(self.edge_round, k=j)))
            out.append(Step(f"device_{j}", devices, self.device_update))
        out.append(Step("edge_up", gws, self.edge_up))
        out.append(Step("cloud_aggregate", [SERVER], self.cloud_aggregate))
        return out

    # -- cloud ---------------------------------------------------------------------------
    def cloud_broadcast(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        return state, Outbox().broadcast(self.gateways, Message("global", dict(state["params"])))

    def cloud_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        glob = state["params"]
        models = [{k: e.msg.tensors.get(k, v) for k, v in glob.items()} for e in inbox]
        weights = [float(e.msg.meta["num_examples"]) for e in inbox]
        return {**state, "params": weighted_average(models, weights)}, Outbox()

    # -- gateways ------------------------------------------------------------------------
    def _edge_average(self, state: State, inbox: list[Envelope]) -> tuple[dict, float]:
        """The sample-weighted average of the devices' models in ``inbox`` and the examples
        behind it; when none arrived (its devices absent or gone), the edge model of the
        round's last edge aggregation and its examples (0 before any in this round)."""
        ups = [e for e in inbox if e.msg.kind == "weights"]
        if not ups:
            return state["params"], float(state.get("n", 0))
        base = state["params"]
        models = [{k: e.msg.tensors.get(k, v) for k, v in base.items()} for e in ups]
        weights = [float(e.msg.meta["num_examples"]) for e in ups]
        return weighted_average(models, weights), float(sum(weights))

    def edge_round(self, ctx: NodeContext, state: State, inbox: list[Envelope], k: int) -> tuple[State, Outbox]:
        """Edge aggregation (or, in the round's first edge round ``k = 1``, the cloud's model),
        then the edge model to this gateway's devices of the round (with ``k``, which
        addresses the devices' minibatch order)."""
        if k == 1:
            glob = [e for e in inbox if e.src == SERVER]
            params, n = (dict(glob[0].msg.tensors) if glob else state["params"]), 0.0
        else:
            params, n = self._edge_average(state, inbox)
        mine = self.devices_of(ctx.node, ctx.plan)
        out = Outbox().broadcast(mine, Message("edge", dict(params), meta={"k": k}))
        return {**state, "params": params, "n": int(n)}, out

    def edge_up(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        params, n = self._edge_average(state, inbox)
        out = Outbox()
        if n > 0:  # an edge model that learned something this round (none: nothing to send)
            out.send(SERVER, Message("edge_weights", dict(params), meta={"num_examples": int(n)}))
        return {**state, "params": params, "n": 0}, out

    # -- devices -------------------------------------------------------------------------
    def device_job(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> SGDJob:
        """``kappa1`` SGD iterations from the gateway's edge model (none without one)."""
        hp = self.hp
        edge = [e for e in inbox if e.msg.kind == "edge"]
        params = dict(edge[0].msg.tensors) if edge else ctx.init_params()
        k = int(edge[0].msg.meta.get("k", 1)) if edge else 0
        n = max(int(ctx.data.n_train), 1)
        epochs = math.ceil(hp.kappa1 * hp.batch_size / n) if edge else 0
        return SGDJob(params=params, x=ctx.data.train_x, y=ctx.data.train_y, epochs=epochs, batch_size=hp.batch_size,
                      lr=decayed_lr(hp.lr, hp.lr_decay, ctx.round), gen=ctx.rng("local", k),
                      momentum=hp.momentum, weight_decay=hp.weight_decay, max_steps=int(hp.kappa1))

    def device_reply(self, ctx: NodeContext, state: State, inbox: list[Envelope], params: dict,
                     stats: TrainStats) -> tuple[State, Outbox]:
        if not any(e.msg.kind == "edge" for e in inbox):
            return state, Outbox()
        msg = Message("weights", params, meta={"num_examples": int(ctx.data.n_train)})
        return {**state, "loss": stats.loss}, Outbox().send(self.gateway_of(ctx.node), msg)

    #: local SGD from the edge model, then the reply to the gateway (vectorisable)
    device_update = LocalSGDStep(device_job, device_reply)
