"""Decentralised baselines: DFedAvg, DFedAvgM (Sun et al., 2022) and D-PSGD (Lian et al., 2017).

DFedAvg and DFedAvgM follow the NTK-DFL reference code's loop (specs/ntk_dfl_spark.md):
every node trains locally from its current weights, then sends them to its neighbours in
the round's graph and replaces its weights by the uniform average over its closed
neighbourhood (weight 1/(deg+1) each). Updates are synchronous: everyone averages the
weights sent in this round. A fresh optimiser is created every round (momentum reset), as
in the reference code. Defaults are the reference code's:

| method   | lr   | batch | local epochs | momentum |
|----------|------|-------|--------------|----------|
| DFedAvg  | 0.1  | 25    | 20           | 0        |
| DFedAvgM | 0.01 | 50    | 20           | 0.9      |

D-PSGD is Lian et al.'s Algorithm 1, one iteration per lowband round (``iterations``
raises it; each iteration is one gossip exchange): node i draws ONE minibatch xi_i, takes
the stochastic gradient g_i = grad F_i(x_i; xi_i) at its current model x_i, sends x_i to
its neighbours, and sets x_i <- sum_j W_ij x_j - lr * g_i (the gradient is taken before the
averaging and applied after it). W is the same closed-neighbourhood uniform matrix
(W_ij = 1/(deg_i+1)), symmetric and doubly stochastic on the k-regular graphs of the
papers, as Lian et al. require. Defaults lr 0.1 and batch 10 are the spec's / NTK-DFL
code's. No local epochs, no momentum: plain SGD, as the paper writes it.

Deviation from the spec, said here and in docs/algorithms.md: the NTK-DFL code that
produced the spec's table-1 D-PSGD numbers runs one local *epoch* (about 20 minibatches of
10) between two gossips, which is DFedAvg with ``local_epochs = 1, batch_size = 10``; that
reading is available as exactly that. BatchNorm running statistics (not parameters of
the objective) are updated by the gradient's forward pass, sent with the weights and
averaged with them.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.base import (Algorithm, Envelope, Hyperparams, NodeContext, Outbox, Params, State, Step,
                                     register)
from lowband.algorithms.common import LocalSGD, local_job
from lowband.comm.message import Message
from lowband.train.cohort import LocalSGDStep, SGDJob
from lowband.train.steps import sgd_update
from lowband.topology import RoundPlan
from lowband.train import TrainStats, clone_params, get_params, load_params, weighted_average


class DFedAvgHP(LocalSGD):
    lr: float = Field(0.1, gt=0, description="local learning rate")
    batch_size: int = Field(25, ge=1, description="local minibatch size")
    local_epochs: int = Field(20, ge=0, description="local epochs per round")
    momentum: float = Field(0.0, ge=0, lt=1, description="heavy-ball momentum, reset every round")


def neighbourhood_average(ctx: NodeContext, own: Params, inbox: list[Envelope]) -> Params:
    """The uniform average of the closed neighbourhood (own model first, then the inbox),
    through the ``[aggregation]`` hook around the node's own model (a peer rule sees the
    neighbours' models minus ``own``, and its own zero update)."""
    models = [own] + [e.msg.tensors for e in inbox]
    return ctx.aggregate(models, [1.0] * len(models), own, senders=[ctx.node] + [e.src for e in inbox],
                         plain=lambda: weighted_average(models))


class GossipAlgorithm(Algorithm):
    """Local training, then synchronous closed-neighbourhood averaging."""

    family = "peer"
    default_protocols = ("consensus", "node_global")
    default_main = "consensus/acc"
    #: the neighbourhood average goes through ctx.aggregate; a subclass overriding
    #: ``average`` or ``steps`` gets False unless it says otherwise
    aggregation_hook = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "aggregation_hook" not in cls.__dict__ and ("average" in cls.__dict__ or "steps" in cls.__dict__):
            cls.aggregation_hook = False

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return [Step("train_send", plan.participants, self.train_send),
                Step("average", plan.participants, self.average)]

    def train_job(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> SGDJob:
        """Local SGD from the node's current weights."""
        return local_job(ctx, state["params"])

    def send_trained(self, ctx: NodeContext, state: State, inbox: list[Envelope], params: Params,
                     stats: TrainStats) -> tuple[State, Outbox]:
        """Keep the trained weights and send them to the round's neighbours."""
        out = Outbox().broadcast(ctx.neighbors, Message("weights", params))
        return {"params": params, "loss": stats.loss}, out

    #: train locally, then send (vectorisable: lowband.train.cohort)
    train_send = LocalSGDStep(train_job, send_trained)

    def average(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        return {**state, "params": neighbourhood_average(ctx, state["params"], inbox)}, Outbox()


@register
class DFedAvg(GossipAlgorithm):
    name = "dfedavg"
    paper = "Sun et al., Decentralized Federated Averaging, IEEE TPAMI 2022"
    Hyperparams = DFedAvgHP


class DFedAvgMHP(DFedAvgHP):
    lr: float = Field(0.01, gt=0, description="local learning rate")
    batch_size: int = Field(50, ge=1, description="local minibatch size")
    local_epochs: int = Field(20, ge=0, description="local epochs per round")
    momentum: float = Field(0.9, ge=0, lt=1, description="heavy-ball momentum, reset every round")


@register
class DFedAvgM(GossipAlgorithm):
    name = "dfedavgm"
    paper = "Sun et al., Decentralized Federated Averaging (with momentum), IEEE TPAMI 2022"
    Hyperparams = DFedAvgMHP


class DPSGDHP(Hyperparams):
    lr: float = Field(0.1, gt=0, description="step size gamma (spec / NTK-DFL code: 0.1)")
    batch_size: int = Field(10, ge=1, description="minibatch size of the one stochastic gradient per iteration "
                                                  "(spec / NTK-DFL code: 10)")
    iterations: int = Field(1, ge=1, description="D-PSGD iterations per lowband round, each one minibatch "
                                                 "gradient and one gossip exchange (bytes grow with it)")


@register
class DPSGD(Algorithm):
    """Lian et al.'s Algorithm 1: x_i <- sum_j W_ij x_j - lr * grad F_i(x_i; xi_i).

    One iteration = two exchange phases: ``grad_send`` (draw one minibatch, take the
    gradient at the current x_i, keep it, send x_i to the neighbours) and ``mix_step``
    (average the closed neighbourhood's x_j, subtract lr * g_i).
    """

    name = "dpsgd"
    family = "peer"
    aggregation_hook = True
    paper = "Lian et al., Can Decentralized Algorithms Outperform Centralized Algorithms?, NeurIPS 2017"
    Hyperparams = DPSGDHP
    default_protocols = ("consensus", "node_global")
    default_main = "consensus/acc"

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        out: list[Step] = []
        for t in range(self.hp.iterations):
            out += [Step(f"grad_send{t}", plan.participants, partial(self.grad_send, iteration=t)),
                    Step(f"mix_step{t}", plan.participants, self.mix_step)]
        return out

    def grad_send(self, ctx: NodeContext, state: State, inbox: list[Envelope], *,
                  iteration: int = 0) -> tuple[State, Outbox]:
        """Lines 1-2 of Algorithm 1 (sample xi_i, g_i at x_i), then send x_i."""
        x = state["params"]
        grad, x_sent, loss = stochastic_gradient(ctx.model, x, ctx.data.train_x, ctx.data.train_y,
                                                 self.hp.batch_size, ctx.rng("dpsgd", iteration))
        out = Outbox().broadcast(ctx.neighbors, Message("weights", x_sent))
        return {"params": x_sent, "grad": grad, "loss": loss}, out

    def mix_step(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """Lines 3-4: x_i <- sum_j W_ij x_j - lr * g_i (uniform W over the closed neighbourhood)."""
        mixed = neighbourhood_average(ctx, state["params"], inbox)
        new = sgd_update(mixed, state["grad"], self.hp.lr)
        return {"params": new, "loss": state["loss"]}, Outbox()


def stochastic_gradient(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                        gen: torch.Generator) -> tuple[Params, Params, float]:
    """Cross-entropy gradient of ``params``'s trainable parameters on ONE minibatch of
    ``batch_size`` samples drawn without replacement from ``(x, y)`` by ``gen``.

    Returns (gradient by parameter name, ``params`` with the buffers the forward pass
    updated, e.g. BatchNorm running statistics, and the minibatch loss). An empty split
    gives a zero gradient."""
    load_params(model, params)
    model.train()
    named = dict(model.named_parameters())
    n = int(y.shape[0])
    if n == 0:
        return {k: torch.zeros_like(v) for k, v in named.items()}, clone_params(params), float("nan")
    idx = torch.randperm(n, generator=gen)[:batch_size]
    loss = F.cross_entropy(model(x[idx]), y[idx])
    grads = torch.autograd.grad(loss, list(named.values()))
    return ({k: g.detach().clone() for k, g in zip(named, grads)}, get_params(model), float(loss.detach()))
