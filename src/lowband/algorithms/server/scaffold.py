"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020): Algorithm 1 with option II control variates.

The server holds the global model x and the server control variate c; client i holds its
control variate c_i (all control variates start at 0). Round r, sampled clients S:

1. server -> each i in S: x (message kind ``weights``) and c (kind ``control``);
2. client i: y_i <- x, then K local steps y_i <- y_i - eta_l (g_i(y_i) - c_i + c);
   c_i+ <- c_i - c + (x - y_i) / (K eta_l)                                  (option II);
   i -> server: Delta y_i = y_i - x (kind ``delta``, with n_i) and Delta c_i = c_i+ - c_i
   (kind ``control_delta``); c_i <- c_i+;
3. server: x <- x + eta_g (1/|S|) sum_i Delta y_i;  c <- c + (1/N) sum_i Delta c_i.

Both directions carry a control variate beside the model, each as its own encoded message,
so SCAFFOLD's traffic is about twice FedAvg's in the ledger (the price the paper pays for
removing client drift); ``comm.by_kind`` can put a codec on ``control``/``control_delta``.

Choices: the control variates cover the model's trainable parameters (float buffers such as
BatchNorm statistics have no gradient; they travel in Delta y and are averaged). K is the
number of local steps client i actually took (``local_epochs`` x batches) and eta_l the
round's local learning rate; the correction is added to the minibatch gradient before
SGD's momentum, weight decay and clipping (with their defaults, 0 / 0 / off, the update is
the paper's). Averages are uniform over the replies that arrived, as in Algorithm 1 (not
FedAvg's sample weights); c's step 1/N keeps c the mean of all N clients' c_i. Local SGD
defaults are FedAvg's (the paper tunes eta_l per experiment); eta_g = 1 as in the paper's
experiments. Clients keep c_i but no model: ``personal`` evaluates the global model.

Under an ``[aggregation]`` rule (lowband.aggregation) the rule replaces the uniform mean of
the Delta y_i, and, in a call of its own (its own counters), the sum of the Delta c_i:
``c <- c + (|S|/N) rule(Delta c_i)``, so a poisoned control variate is screened like a
poisoned model delta. The two calls select independently (Krum may keep a client's
Delta y and drop its Delta c).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from lowband.algorithms.base import SERVER, Algorithm, Envelope, NodeContext, Outbox, State, Step, register
from lowband.algorithms.common import local_train, round_lr
from lowband.algorithms.server.fedavg import FedAvgClientHP
from lowband.algorithms.server.server_opt import trainable_names
from lowband.comm.message import Message
from lowband.topology import RoundPlan
from lowband.train import Params, add_scaled, is_float, sub


class ScaffoldHP(FedAvgClientHP):
    server_lr: float = Field(1.0, gt=0, description="global step size eta_g (paper's experiments: 1)")


def zeros_like(params: Params) -> Params:
    return {k: torch.zeros_like(v) for k, v in params.items()}


def mean(items: list[Params], like: Params) -> Params:
    """Uniform mean of ``items`` over the entries of ``like`` (a missing entry counts as 0)."""
    out = zeros_like(like)
    for it in items:
        for k in out:
            if k in it:
                out[k] += it[k].to(out[k].dtype)
    return {k: v / len(items) for k, v in out.items()}


def correction_hook(correction: Params):
    """grad_hook adding ``c - c_i`` to each parameter's minibatch gradient."""
    def hook(model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if name in correction:
                if p.grad is None:
                    p.grad = correction[name].clone()
                else:
                    p.grad.add_(correction[name])
    return hook


@register
class Scaffold(Algorithm):
    """FedAvg with control variates that correct each client's drift."""

    name = "scaffold"
    family = "server"
    paper = "Karimireddy et al., SCAFFOLD: Stochastic Controlled Averaging for Federated Learning, ICML 2020"
    Hyperparams = ScaffoldHP
    default_protocols = ("global", "personal")
    default_main = "personal/acc_weighted"
    personalized = False
    aggregation_hook = True

    def init_node(self, ctx: NodeContext) -> State:
        return {}  # c_i = 0 until the client first takes part

    def init_server(self, ctx: NodeContext) -> State:
        x = ctx.init_params()
        names = trainable_names(ctx.model)
        return {"params": x, "c": {k: torch.zeros_like(v) for k, v in x.items() if k in names}}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return [
            Step("broadcast", [SERVER], self.server_broadcast),
            Step("client", plan.participants, self.client_update),
            Step("aggregate", [SERVER], self.server_aggregate),
        ]

    # -- 1. server sends x and c ------------------------------------------------------
    def server_broadcast(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        out = Outbox().broadcast(ctx.participants, Message("weights", dict(state["params"])))
        return state, out.broadcast(ctx.participants, Message("control", dict(state["c"])))

    # -- 2. client: corrected local SGD, option II control variate -------------------------
    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        got = {e.msg.kind: e.msg.tensors for e in inbox}
        if "weights" not in got or "control" not in got:
            return state, Outbox()  # a message was lost or rejected: sit this round out
        x, c = got["weights"], got["control"]
        c_i = state.get("c") or zeros_like(c)
        y, stats = local_train(ctx, x, grad_hook=correction_hook({k: c[k] - c_i[k] for k in c}))
        K, eta_l = stats.steps, round_lr(ctx)
        if K > 0:
            c_new = {k: c_i[k] - c[k] + (x[k] - y[k]) / (K * eta_l) for k in c}
        else:
            c_new = c_i
        delta_y = sub(y, x)
        delta_c = {k: c_new[k] - c_i[k] for k in c}
        out = Outbox().send(SERVER, Message("delta", delta_y, meta={"num_examples": ctx.data.n_train}))
        out.send(SERVER, Message("control_delta", delta_c))
        return {**state, "c": c_new, "loss": stats.loss}, out

    # -- 3. server: average the deltas -----------------------------------------------
    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        x, c = state["params"], state["c"]
        dys = [e.msg.tensors for e in inbox if e.msg.kind == "delta"]
        dcs = [e.msg.tensors for e in inbox if e.msg.kind == "control_delta"]
        if dys:
            floats = {k: v for k, v in x.items() if is_float(v)}
            senders = [e.src for e in inbox if e.msg.kind == "delta"]
            avg = ctx.aggregate_updates([{k: d.get(k, torch.zeros_like(v)) for k, v in floats.items()} for d in dys],
                                        [1.0] * len(dys), floats, senders=senders, plain=lambda: mean(dys, floats))
            x = add_scaled(x, avg, self.hp.server_lr)
        if dcs:
            if ctx.aggregation is None:
                total = {k: sum(d[k] for d in dcs if k in d) for k in c}
            else:  # the rule's aggregate of the Delta c_i, times |S| (the plain step sums them)
                senders = [e.src for e in inbox if e.msg.kind == "control_delta"]
                agg = ctx.aggregate_updates([{k: d.get(k, torch.zeros_like(v)) for k, v in c.items()} for d in dcs],
                                            [1.0] * len(dcs), c, senders=senders)
                total = {k: v * len(dcs) for k, v in agg.items()}
            c = add_scaled(c, total, 1.0 / ctx.num_nodes)
        return {**state, "params": x, "c": c}, Outbox()
