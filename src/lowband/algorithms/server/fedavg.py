"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020).

Round: the server broadcasts the global model to the sampled clients; each client trains
``local_epochs`` of SGD from it (FedProx adds ``mu/2 ||w - w_global||^2``) and replies
with its model (or its delta) and its number of training examples; the server replaces
the global model by the sample-weighted average of the replies.
With ``server_opt`` other than ``sgd`` the server instead steps along the averaged delta
with a server optimiser: FedAvgM, FedAdam, FedYogi, FedAdagrad (Reddi et al., 2021; see
lowband.algorithms.server.server_opt); its moments live in the server's state.
Clients keep no model between rounds, so the ``personal`` protocol evaluates the global
model on each client's local test split (PFLlib's convention).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator, model_validator
from torch import nn

from lowband.algorithms.base import SERVER, Algorithm, Envelope, NodeContext, Outbox, State, Step, default_by, register
from lowband.algorithms.common import LocalSGD, local_job
from lowband.algorithms.server.server_opt import DEFAULT_SERVER_LR, KNOB_READERS, ServerOpt, server_step, \
    trainable_names
from lowband.comm.message import Message
from lowband.train.cohort import LocalSGDStep, SGDJob
from lowband.topology import RoundPlan
from lowband.train import Params, TrainStats, sub


class FedAvgClientHP(LocalSGD):
    """FedAvg's client settings, for methods that keep FedAvg's local training but have an
    upload and aggregation of their own (FedAS, FedPAC, FedSPU): they take no ``upload``
    or ``server_lr``, which only FedAvg's aggregation reads."""

    lr: float = Field(0.05, gt=0, description="client learning rate")
    batch_size: int = Field(10, ge=1, description="client minibatch size")
    local_epochs: int = Field(5, ge=0, description="client epochs per round")


class FedAvgHP(FedAvgClientHP):
    upload: Literal["weights", "delta"] = Field(
        "weights", description="what clients send up: their weights, or weights minus the received global model "
        "(use delta with lossy codecs such as top-k)")
    server_opt: ServerOpt = Field(
        "sgd", description="server optimiser on the averaged delta: sgd (plain FedAvg), avgm (FedAvgM), adam, "
        "yogi, adagrad (FedAdam/FedYogi/FedAdagrad, Reddi et al. 2021)")
    server_lr: Optional[float] = Field(
        None, gt=0, description="server learning rate; unset: by server_opt, sgd/avgm 1.0 (1.0 with sgd = plain "
        "FedAvg), adam/yogi 0.01, adagrad 0.1 (Reddi et al. 2021)")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server momentum (server_opt = avgm; Hsu et al. 2019)")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay (server_opt = adam, yogi, adagrad)")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay (server_opt = adam, yogi)")
    tau: float = Field(1e-3, gt=0, description="adaptivity (epsilon) tau (server_opt = adam, yogi, adagrad)")

    @model_validator(mode="before")
    @classmethod
    def _default_server_lr(cls, data: Any) -> Any:
        """An unset ``server_lr`` takes the chosen optimiser's default (so ``hp.server_lr`` is a number)."""
        return default_by(data, "server_lr", "server_opt", "sgd", DEFAULT_SERVER_LR)

    @field_validator("server_momentum", "beta1", "beta2", "tau")
    @classmethod
    def _read_by_the_optimiser(cls, v: float, info: ValidationInfo) -> float:
        """A knob the chosen optimiser does not read is refused, not silently ignored (rule 7)."""
        opt = info.data.get("server_opt", "sgd")
        readers = KNOB_READERS[str(info.field_name)]
        if opt not in readers:
            raise ValueError(f"read only with server_opt = {' / '.join(readers)}, not {opt!r}; drop it or set "
                             f"algorithm.server_opt")
        return v


@register
class FedAvg(Algorithm):
    """Federated averaging with sample-count weights."""

    name = "fedavg"
    stateless_clients = True  # a client keeps no model between rounds (config.bounds)
    family = "server"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017"
    Hyperparams = FedAvgHP
    default_protocols = ("global", "personal")
    default_main = "personal/acc_weighted"
    personalized = False
    #: the server's average goes through ctx.aggregate (lowband.aggregation); a subclass
    #: that overrides ``server_aggregate`` or ``steps`` gets False unless it says otherwise
    aggregation_hook = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "aggregation_hook" not in cls.__dict__ and ("server_aggregate" in cls.__dict__ or "steps" in cls.__dict__):
            cls.aggregation_hook = False

    def init_node(self, ctx: NodeContext) -> State:
        return {}

    def init_server(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return [
            Step("broadcast", [SERVER], self.server_broadcast),
            Step("client", plan.participants, self.client_update),
            Step("aggregate", [SERVER], self.server_aggregate),
        ]

    # -- server ---------------------------------------------------------------------
    def server_broadcast(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        return state, Outbox().broadcast(ctx.participants, Message("weights", dict(state["params"])))

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        glob = state["params"]
        weights = [float(e.msg.meta["num_examples"]) for e in inbox]
        senders = [e.src for e in inbox]
        if self.hp.upload == "weights":
            models = [_complete(e.msg.tensors, glob) for e in inbox]
            avg = ctx.aggregate(models, weights, glob, senders=senders)  # the [aggregation] hook
            delta = sub(avg, glob)
        else:
            deltas = [_complete(e.msg.tensors, glob, zero=True) for e in inbox]
            delta = ctx.aggregate_updates(deltas, weights, glob, senders=senders)
        return self.server_apply(ctx, state, delta), Outbox()

    def server_apply(self, ctx: NodeContext, state: State, delta: Params) -> State:
        """Step the global model along the averaged delta with ``hp.server_opt`` (``sgd``:
        ``w + server_lr * delta``); the optimiser's moments stay in the server state."""
        new, opt_state = server_step(self.hp, state["params"], delta, state.get("server_opt"),
                                     trainable_names(ctx.model))
        # integer buffers (BatchNorm counters) keep the global model's value
        out = {**state, "params": new}
        if opt_state:
            out["server_opt"] = opt_state
        return out

    # -- client ---------------------------------------------------------------------
    def loss_fn(self, ctx: NodeContext, global_params: Params):
        return None

    def client_job(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> SGDJob:
        """The client's local SGD from the received global model (``loss_fn``'s loss, if any)."""
        glob = inbox[0].msg.tensors
        loss_fn = self.loss_fn(ctx, glob)
        return local_job(ctx, glob, loss_fn) if loss_fn else local_job(ctx, glob)

    def client_reply(self, ctx: NodeContext, state: State, inbox: list[Envelope], params: Params,
                     stats: TrainStats) -> tuple[State, Outbox]:
        """Send the trained model (or its delta) and the number of training examples."""
        glob = inbox[0].msg.tensors
        payload = params if self.hp.upload == "weights" else sub(params, glob)
        msg = Message("weights" if self.hp.upload == "weights" else "delta", payload,
                      meta={"num_examples": ctx.data.n_train})
        return {**state, "loss": stats.loss}, Outbox().send(SERVER, msg)

    #: local SGD from the global model, then the reply (vectorisable: lowband.train.cohort)
    client_update = LocalSGDStep(client_job, client_reply)


def _complete(received: Params, like: Params, zero: bool = False) -> Params:
    """Fill entries a codec may have dropped (never for the built-in codecs) from ``like``."""
    return {k: received[k] if k in received else (torch.zeros_like(v) if zero else v) for k, v in like.items()}


class FedProxHP(FedAvgHP):
    mu: float = Field(0.01, ge=0, description="proximal coefficient mu (paper's grid; 0 would be FedAvg)")


@register
class FedProx(FedAvg):
    """FedAvg with the proximal term (mu/2)||w - w_global||^2 in the client objective."""

    name = "fedprox"
    stateless_clients = True  # a client keeps no model between rounds (config.bounds)
    paper = "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020"
    Hyperparams = FedProxHP

    def loss_fn(self, ctx: NodeContext, global_params: Params):
        mu = self.hp.mu
        anchors = {k: v.detach() for k, v in global_params.items()}

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            ce = F.cross_entropy(model(x), y)
            prox = sum(((p - anchors[n]) ** 2).sum() for n, p in model.named_parameters())
            return ce + 0.5 * mu * prox

        return loss
