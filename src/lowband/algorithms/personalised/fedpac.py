"""FedPAC: feature alignment and classifier collaboration (Xu, Tong and Huang, ICLR 2023;
PFLlib ``clientpac`` / ``serverpac``, after the authors' JianXu95/FedPAC).

Round:
1. server -> sampled clients: the global base (every parameter but the head) and the
   global class prototypes (C x D, with a C-vector saying which classes have one).
2. client: replaces its base by the global base (its head is its own); computes the
   feature statistics of FedPAC (V_i: a scalar variance term; h_i: C x D, p_i(c) times the
   class-mean feature) on the received model; trains the head one epoch with the base
   frozen, then the base E epochs with the head frozen on
   CE + lambda * MSE(features, global prototype of the label) (lambda = 1; a label without
   a global prototype contributes zero); computes its class prototypes; uploads base, head,
   prototypes, V_i and h_i.
3. server: base <- sample-weighted average of the bases; global prototype of class c <-
   plain mean over the uploaders that have c; for every uploader i it solves the
   quadratic programme  min_a a^T (diag(V) + D_i) a  s.t. a >= 0, sum a = 1, with
   D_i[j, k] = sum_c <h_i(c) - h_j(c), h_i(c) - h_k(c)>, zeroes weights below 1e-3 (as the
   authors' code, without renormalising) and sends client i the head sum_j a_j head_j.
   If the solver fails, client i keeps its own head (the authors' fallback).
4. client: installs the head it received.

The QP is solved with scipy's SLSQP (a handful of variables; the authors use cvxpy).
Statistics and prototypes are computed in eval mode. The ``personal`` protocol evaluates
each client's model (global base as last received and trained + its personal head). The
``global`` protocol uses the global base with the sample-weighted mean of the uploaded
heads (measurement only; that head is never sent).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.personalised._pfl import base_names, class_prototypes, features_of, head_names, is_head, train_kwargs
from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, Params, State, Step, register
from lowband.algorithms.server.fedavg import FedAvg, FedAvgClientHP
from lowband.comm.message import Message
from lowband.topology import RoundPlan
from lowband.train import sgd_train, weighted_average

PROTOS, VALID, H_REF = "pac.protos", "pac.proto_valid", "pac.h"


class FedPACHP(FedAvgClientHP):
    lam: float = Field(1.0, ge=0, description="lambda: weight of the feature-alignment MSE (0 removes it)")
    head_epochs: int = Field(1, ge=0, description="epochs training the head with the base frozen (PFLlib: 1)")
    qp_eps: float = Field(1e-3, ge=0, description="head-combination weights below this are zeroed")


def feature_statistics(feats: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[float, torch.Tensor]:
    """FedPAC's (V, h): V = [sum_c p_c E||f||^2_c - p_c^2 ||mu_c||^2] / n, h[c] = p_c mu_c."""
    n = int(y.shape[0])
    mu, valid = class_prototypes(feats, y, num_classes)
    counts = torch.bincount(y, minlength=num_classes)[:num_classes].to(torch.float32)
    py = counts / max(n, 1)
    sq = torch.zeros(num_classes, device=feats.device).index_add_(0, y, (feats.to(torch.float32) ** 2).sum(1))
    mean_sq = torch.where(valid, sq / counts.clamp(min=1), torch.zeros((), device=feats.device))
    v = float((py * mean_sq).sum() - (py ** 2 * (mu ** 2).sum(1)).sum()) / max(n, 1)
    return v, py[:, None] * mu


def combination_weights(V: Sequence[float], H: Sequence[torch.Tensor], i: int, eps: float = 1e-3) -> Optional[np.ndarray]:
    """Solve min a^T (diag(V) + D_i) a, a >= 0, sum a = 1 (D_i as in the module docstring);
    None if the solver fails."""
    m = len(V)
    diffs = torch.stack([(H[i] - H[j]).reshape(-1).to(torch.float64) for j in range(m)]).cpu()  # a CPU QP
    P = (torch.diag(torch.tensor(V, dtype=torch.float64)) + diffs @ diffs.T).numpy()
    P = 0.5 * (P + P.T)
    from scipy.optimize import minimize  # here: scipy.optimize costs 0.4 s of every import of lowband.algorithms

    res = minimize(lambda a: float(a @ P @ a), np.full(m, 1.0 / m), jac=lambda a: 2 * P @ a, method="SLSQP",
                   bounds=[(0.0, 1.0)] * m, constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0}],
                   options={"ftol": 1e-12, "maxiter": 200})
    if not res.success:
        return None
    a = np.clip(res.x, 0.0, 1.0)
    return a * (a > eps)


@register
class FedPAC(FedAvg):
    """Prototype-aligned features and QP-combined personal classifiers."""

    name = "fedpac"
    paper = "Xu, Tong and Huang, Personalized Federated Learning with Feature Alignment and Classifier Collaboration, ICLR 2023"
    Hyperparams = FedPACHP
    personalized = True

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def init_server(self, ctx: NodeContext) -> State:
        d, params = ctx.model.feature_dim, ctx.init_params()
        dev = next(iter(params.values())).device
        return {"params": params, "protos": torch.zeros(ctx.num_classes, d, device=dev),
                "proto_valid": torch.zeros(ctx.num_classes, dtype=torch.bool, device=dev)}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return super().steps(round, plan) + [Step("pac_head", plan.participants, self.client_set_head)]

    # -- server ------------------------------------------------------------------------
    def server_broadcast(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        tensors = {k: v for k, v in state["params"].items() if not is_head(k)}
        tensors[PROTOS], tensors[VALID] = state["protos"], state["proto_valid"]
        return state, Outbox().broadcast(ctx.participants, Message("weights", tensors))

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        heads = head_names(ctx.model)
        glob = state["params"]
        n = [float(e.msg.meta["num_examples"]) for e in inbox]
        models = [{k: e.msg.tensors[k] for k in glob} for e in inbox]
        new = weighted_average(models, n)  # base for the clients; head only for the "global" protocol
        protos = torch.stack([e.msg.tensors[PROTOS] for e in inbox])
        valid = torch.stack([e.msg.tensors[VALID].to(torch.bool) for e in inbox])
        cnt = valid.sum(0)
        g_valid = cnt > 0
        g_protos = (protos * valid[..., None]).sum(0)
        g_protos[g_valid] /= cnt[g_valid, None].to(torch.float32)
        V = [float(e.msg.meta["V"]) for e in inbox]
        H = [e.msg.tensors[H_REF] for e in inbox]
        out = Outbox()
        for i, e in enumerate(inbox):
            a = combination_weights(V, H, i, self.hp.qp_eps)
            if a is None:
                continue  # the client keeps its own head
            head = {k: sum(float(a[j]) * models[j][k] for j in range(len(inbox))) for k in heads}
            out.send(e.src, Message("head", head))
        return {**state, "params": new, "protos": g_protos, "proto_valid": g_valid}, out

    # -- client ------------------------------------------------------------------------
    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        hp = self.hp
        rx = inbox[0].msg.tensors
        g_protos, g_valid = rx[PROTOS], rx[VALID].to(torch.bool)
        own = state["params"]
        params = {k: (own[k] if is_head(k) else rx[k]) for k in own}
        x, y = ctx.data.train_x, ctx.data.train_y
        V, h = feature_statistics(features_of(ctx.model, params, x), y, ctx.num_classes)
        kw = train_kwargs(ctx)
        epochs = kw.pop("epochs")

        def ce(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(xb), yb)

        def aligned(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            rep = model.features(xb)
            loss = F.cross_entropy(model.head(rep), yb)
            if hp.lam > 0 and bool(g_valid.any()):
                target = torch.where(g_valid[yb][:, None], g_protos[yb], rep.detach())
                loss = loss + hp.lam * F.mse_loss(target, rep)
            return loss

        gen = ctx.rng("local")
        params, _ = sgd_train(ctx.model, params, x, y, epochs=hp.head_epochs, gen=gen, loss_fn=ce,
                             trainable=head_names(ctx.model), **kw)
        params, stats = sgd_train(ctx.model, params, x, y, epochs=epochs, gen=gen, loss_fn=aligned,
                                 trainable=base_names(ctx.model), **kw)
        protos, valid = class_prototypes(features_of(ctx.model, params, x), y, ctx.num_classes)
        tensors = dict(params)
        tensors[PROTOS], tensors[VALID], tensors[H_REF] = protos, valid, h
        msg = Message("weights", tensors, meta={"num_examples": ctx.data.n_train, "V": V})
        return {"params": params}, Outbox().send(SERVER, msg)

    def client_set_head(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        head = inbox[0].msg.tensors
        return {**state, "params": {**state["params"], **{k: v.clone() for k, v in head.items()}}}, Outbox()
