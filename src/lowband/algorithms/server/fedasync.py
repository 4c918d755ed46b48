"""FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", arXiv:1903.03934).

The server never waits for a cohort: each client's update is mixed into the global model
the moment it arrives, weighted down by its staleness,
``x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new`` with ``alpha_t = alpha * s(t - tau)``
(``tau``: the version the client downloaded, ``t - tau`` the server updates since;
``s``: constant, polynomial ``(t - tau + 1)^-a`` or hinge, :mod:`lowband.asynchronous.staleness`).
A client trains from the version it downloaded with the paper's regularised objective
``f(x) + rho/2 ||x - x_tau||^2``.

It runs on the event clock (:mod:`lowband.asynchronous.clock`): a driver round is one
arrival, its plan (:class:`~lowband.asynchronous.plan.AsyncPlan`) names the clients the
server starts (``dispatch``: they receive the current model and keep it in their own
state), the client whose update arrives (it trains from its kept model and uploads) and
the clients whose device went away (they drop their copy). The server records the version
it sent each client (one integer per client), so staleness is the server's own count.

Defaults: ``alpha = 0.6``, polynomial staleness with ``a = 0.5`` (hinge: ``a = 10, b = 4``)
and ``rho = 0.005`` are the paper's experimental settings. Deliberate deviations: local
training is FedAvg's (``lr``, ``batch_size``, ``local_epochs`` as :mod:`fedavg`'s defaults),
so a comparison with synchronous FedAvg differs in the aggregation only; and the number
of clients training at once (``concurrency``, 10: FedAvg's default cohort of a 100-client
federation) replaces the paper's simulated maximum staleness, since staleness here follows
from the devices' times.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator, model_validator
from torch import nn

from lowband.algorithms.base import (
    SERVER, Algorithm, Envelope, NodeContext, Outbox, Params, State, Step, default_by, register,
)
from lowband.algorithms.common import local_job
from lowband.algorithms.server.fedavg import FedAvgClientHP
from lowband.asynchronous.plan import AsyncPlan
from lowband.asynchronous.staleness import fedasync_alpha
from lowband.comm.message import Message
from lowband.topology import RoundPlan
from lowband.train import TrainStats, is_float, sub
from lowband.train.cohort import LocalSGDStep, SGDJob

__all__ = ["AsyncServer", "AsyncHP", "FedAsync", "FedAsyncHP"]

#: the hinge function's paper setting of ``a`` (polynomial: 0.5)
_DEFAULT_A = {"polynomial": 0.5, "hinge": 10.0}


class AsyncHP(FedAvgClientHP):
    """Settings every algorithm on the event clock has: FedAvg's local training and the
    number of clients training at once."""

    concurrency: int = Field(10, ge=1, description="clients training at once (the event clock keeps this many "
                             "jobs in flight while devices are available)")


class AsyncServer(Algorithm):
    """What FedAsync and FedBuff share: the event clock's steps (dispatch, receive, lose,
    client, aggregate), the client that keeps the model it downloaded, and the server's
    record of the version it sent each client."""

    family = "server"
    default_protocols = ("global", "personal")
    default_main = "personal/acc_weighted"
    personalized = False
    #: the run is driven by lowband.asynchronous.clock.EventClock (engine/observers)
    event_clock = True
    #: what the client uploads ("weights" or "delta")
    upload_kind = "weights"

    @property
    def buffer_size(self) -> int:
        """Arrivals per server update (1: every arrival updates the model)."""
        return 1

    def init_node(self, ctx: NodeContext) -> State:
        return {}

    def init_server(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params(), "version": 0, "staleness": -1,
                "sent": torch.full((int(ctx.num_nodes),), -1, dtype=torch.long)}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        if not isinstance(plan, AsyncPlan):
            raise ValueError(f"{self.name} runs on the event clock (lowband.asynchronous.clock): its rounds are "
                             f"arrivals, planned by the clock, not a topology's rounds")
        steps = []
        if plan.dispatch:
            steps += [Step("dispatch", [SERVER], self.server_dispatch),
                      Step("receive", list(plan.dispatch), self.client_receive)]
        if plan.lost:
            steps.append(Step("lose", list(plan.lost), self.client_lose))
        if plan.arrivals:
            steps.append(Step("client", list(plan.arrivals), self.client_update))
        steps.append(Step("aggregate", [SERVER], self.server_aggregate))
        return steps

    # -- messages (the event clock times them before they are encoded: probe_messages) -----
    @staticmethod
    def model_message(params: Params) -> Message:
        return Message("weights", dict(params))

    def reply_message(self, payload: Params, n_train: int) -> Message:
        return Message(self.upload_kind, dict(payload), meta={"num_examples": int(n_train)})

    def probe_messages(self, params: Params, n_train: int) -> tuple[Message, Message]:
        """A download and an upload of the shapes this algorithm sends (``params``: the
        model), for the event clock to time a job before it is encoded."""
        return self.model_message(params), self.reply_message(params, n_train)

    # -- server ------------------------------------------------------------------------
    def server_dispatch(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """Send the current model to the clients the clock starts; note the version each got."""
        dsts = list(ctx.plan.dispatch)  # type: ignore[attr-defined]
        sent = state["sent"].clone()
        sent[dsts] = int(state["version"])
        return {**state, "sent": sent}, Outbox().broadcast(dsts, self.model_message(state["params"]))

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        for e in sorted(inbox, key=lambda e: e.src):
            s = int(state["version"]) - int(state["sent"][e.src])
            sent = state["sent"].clone()
            sent[e.src] = -1
            state = self.apply(ctx, {**state, "sent": sent, "staleness": s}, e.msg.tensors, s)
        return state, Outbox()

    def apply(self, ctx: NodeContext, state: State, update: Params, staleness: int) -> State:
        """The server's use of one arrived update of the given staleness."""
        raise NotImplementedError

    def round_metrics(self, server_state: State) -> dict[str, float]:
        out = {"version": float(server_state.get("version", 0))}
        if int(server_state.get("staleness", -1)) >= 0:
            out["staleness"] = float(server_state["staleness"])
        return out

    # -- client ------------------------------------------------------------------------
    def client_receive(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """Keep the downloaded model until the job's compute is done (the client's own copy)."""
        return {**state, "held": dict(inbox[0].msg.tensors)}, Outbox()

    def client_lose(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """The device went away before its upload was through: its work is gone."""
        return {k: v for k, v in state.items() if k != "held"}, Outbox()

    def loss_fn(self, ctx: NodeContext, anchor: Params) -> Any:
        return None

    def client_job(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> SGDJob:
        held = state["held"]
        loss = self.loss_fn(ctx, held)
        return local_job(ctx, held, loss) if loss else local_job(ctx, held)

    def client_reply(self, ctx: NodeContext, state: State, inbox: list[Envelope], params: Params,
                     stats: TrainStats) -> tuple[State, Outbox]:
        held = state["held"]
        payload = params if self.upload_kind == "weights" else sub(params, held)
        rest = {k: v for k, v in state.items() if k != "held"}
        return {**rest, "loss": stats.loss}, Outbox().send(SERVER, self.reply_message(payload, ctx.data.n_train))

    #: local SGD from the kept model, then the upload (vectorisable: lowband.train.cohort)
    client_update = LocalSGDStep(client_job, client_reply)


class FedAsyncHP(AsyncHP):
    alpha: float = Field(0.6, gt=0, le=1, description="mixing weight alpha (alpha_t = alpha x s(staleness))")
    staleness: Literal["constant", "polynomial", "hinge"] = Field(
        "polynomial", description="staleness function s: constant 1, polynomial (s+1)^-a, hinge (1 up to b, then "
        "1/(a(s-b)+1))")
    a: Optional[float] = Field(None, gt=0, description="the staleness function's a; unset: polynomial 0.5, "
                               "hinge 10 (the paper's)")
    b: int = Field(4, ge=0, description="hinge: staleness up to b is not discounted")
    rho: float = Field(0.005, ge=0, description="client regulariser rho/2 ||x - x_downloaded||^2")

    @model_validator(mode="before")
    @classmethod
    def _default_a(cls, data: Any) -> Any:
        return default_by(data, "a", "staleness", "polynomial", _DEFAULT_A)

    @field_validator("a")
    @classmethod
    def _a_read(cls, v: Optional[float], info: ValidationInfo) -> Optional[float]:
        if v is not None and info.data.get("staleness") == "constant":
            raise ValueError("read only with staleness = polynomial / hinge, not 'constant'; drop it")
        return v

    @field_validator("b")
    @classmethod
    def _b_read(cls, v: int, info: ValidationInfo) -> int:
        if v != 4 and info.data.get("staleness") != "hinge":
            raise ValueError(f"read only with staleness = hinge, not {info.data.get('staleness')!r}; drop it")
        return v


@register
class FedAsync(AsyncServer):
    """Staleness-weighted mixing of each arriving model into the global one."""

    name = "fedasync"
    paper = "Xie, Koyejo and Gupta, Asynchronous Federated Optimization, arXiv:1903.03934 (2019)"
    Hyperparams = FedAsyncHP

    def alpha_t(self, staleness: int) -> float:
        hp = self.hp
        return fedasync_alpha(hp.alpha, hp.staleness, staleness, hp.a if hp.a is not None else 0.0, hp.b)

    def apply(self, ctx: NodeContext, state: State, update: Params, staleness: int) -> State:
        a = self.alpha_t(staleness)
        glob = state["params"]
        new = {k: ((1.0 - a) * v + a * update[k].to(v.dtype)) if is_float(v) and k in update else v
               for k, v in glob.items()}
        return {**state, "params": new, "version": int(state["version"]) + 1}

    def loss_fn(self, ctx: NodeContext, anchor: Params) -> Any:
        rho = self.hp.rho
        if not rho:
            return None
        anchors = {k: v.detach() for k, v in anchor.items()}

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            ce = F.cross_entropy(model(x), y)
            prox = sum(((p - anchors[n]) ** 2).sum() for n, p in model.named_parameters())
            return ce + 0.5 * rho * prox

        return loss
