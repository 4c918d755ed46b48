"""KTA v2: a prediction-space knowledge market (arXiv 2512.00841; specs/kta_fedmd.md).

Every client keeps its own model (architectures may differ: only predictions cross the
network). A public reference set D_ref of inputs (``data.public_size``, carved from
training data no client owns) is known to everyone; only the server holds its labels.

Round r (steps ``local`` -> ``market`` -> ``distill``):

1. Stage 1, local supervision (client): ``local_epochs`` of SGD with cross-entropy on
   the private train split (BN-safe skip rule on).
2. Upload (client -> server): the logits Z_i = f_i(D_ref), N_ref x C, in eval mode.
3. Market (server): P_i = softmax(Z_i); S_ij = cos(vec P_i, vec P_j);
   a_j = accuracy of argmax Z_j on the D_ref labels; score_ij = S_ij * a_j (j != i);
   N(i) = the top ``k`` scores; w_ij = score_ij / sum_{l in N(i)} score_il;
   Q_i = sum_{j in N(i)} w_ij softmax(Z_j / T).
4. Download (server -> client i): Q_i, N_ref x C (personalised, one message per client).
5. Stage 2, market distillation (client): ``distill_epochs`` passes over D_ref in batches;
   each step pairs a D_ref batch with a private batch and minimises
   ``lam * T^2 * KL(Q_i || softmax(f_i / T)) + (1 - lam) * CE(f_i(x_priv), y_priv)``.
6. BN-safe skip rule: with BatchNorm in the model, a step whose batch holds at most one
   sample is skipped (both stages).

Choices the summary leaves open (named options; see docs/algorithms/kta.md): the local
optimiser and epochs, ``distill_epochs``, the pairing of D_ref and private batches in
stage 2 (one private batch of ``batch_size`` per D_ref batch, cycling a fresh permutation
of the private data), cosine similarity on softmax at T = 1, ties in the top-k broken by
the lower client id, a zero score sum falling back to uniform weights, and a client with
no teacher (a single participant) skipping stage 2.

Ablations (options): ``weighting = "uniform"`` (w_ij = 1/|N(i)|, same N(i));
``score = "similarity"`` (a = 1) or ``"accuracy"`` (S = 1); ``k`` (0 = every other
client); ``include_self``; ``temperature``; ``lam``. The *global teacher* of the FedMD
check is ``k = 0, include_self = true, weighting = "uniform"``: every client gets the
same average of all clients' softened predictions.

Per-round market diagnostics (``round_metrics``, measurement only) reach metrics.jsonl as
``alg/...``: the mean row entropy of the soft labels sent (``teacher_entropy``, nats, at
temperature T) and of the same ensemble at T = 1 (``ensemble_entropy``), the teachers'
accuracy on the D_ref labels (``teacher_acc``), the clients' reference accuracy
(``ref_acc_mean/min/max``), the mean off-diagonal similarity (``sim_mean``), and the
weights (``w_max``: mean over clients of the largest weight; ``w_entropy``; ``k_eff``).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from lowband.algorithms.base import SERVER, Algorithm, Envelope, NodeContext, Outbox, State, Step, register
from lowband.algorithms.common import LocalSGD
from lowband.comm.message import Message
from lowband.topology import RoundPlan
from lowband.train import decayed_lr, predict_logits, sgd_train
from lowband.train.distill import distill

Params = dict[str, torch.Tensor]


class KTAHP(LocalSGD):
    # Stage 1 / stage 2 optimiser: the summary gives none; MOON's simple-cnn recipe
    # (SGD lr 0.01, momentum 0.9, weight decay 1e-5, batch 64) -- ours, documented.
    lr: float = Field(0.01, gt=0, description="client SGD learning rate (both stages)")
    batch_size: int = Field(64, ge=1, description="minibatch size (stage 1; stage 2 D_ref and private batches)")
    local_epochs: int = Field(2, ge=0, description="E: stage-1 epochs of cross-entropy on private data per round")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (fresh optimiser every stage)")
    weight_decay: float = Field(1e-5, ge=0, description="L2 weight decay")
    distill_epochs: int = Field(2, ge=0, description="E_d: stage-2 passes over D_ref per round")
    temperature: float = Field(2.0, gt=0, description="T: softmax temperature of teachers and student in stage 2")
    lam: float = Field(0.5, ge=0, le=1, description="lambda: weight of the T^2 KL term; 1 - lambda weighs private CE")
    k: int = Field(5, ge=0, description="teachers per client (top-k by score); 0 = all candidates")
    score: Literal["similarity_accuracy", "similarity", "accuracy"] = Field(
        "similarity_accuracy", description="market score: S_ij * a_j (KTA v2), S_ij only (a = 1), a_j only (S = 1)")
    weighting: Literal["score", "uniform"] = Field(
        "score", description="teacher weights: proportional to the score (KTA v2) or uniform 1/|N(i)|")
    include_self: bool = Field(False, description="client i may be its own teacher (global-teacher ablation)")
    bn_skip: bool = Field(True, description="BN-safe skip rule: skip steps on batches of <= 1 sample with BatchNorm")


def market(z: torch.Tensor, y: torch.Tensor, *, k: int = 5, temperature: float = 2.0,
           score: str = "similarity_accuracy", weighting: str = "score",
           include_self: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The server's market on stacked logits ``z`` (n, N_ref, C) and D_ref labels ``y``.

    Returns ``(W, Q, diag)``: W (n, n) teacher weights (row i: client i's teachers, rows
    sum to 1, or 0 for a client without teachers), Q (n, N_ref, C) the soft labels
    ``sum_j W_ij softmax(z_j / T)``, and the diagnostics of the module docstring.
    """
    n, nref, c = z.shape
    z = z.to(torch.float64)
    p = torch.softmax(z, dim=-1)
    v = F.normalize(p.reshape(n, -1), dim=1)
    sim = v @ v.T  # cosine; >= 0 because probabilities are >= 0
    acc = (z.argmax(-1) == y.view(1, -1)).to(torch.float64).mean(1) if nref else torch.zeros(n, dtype=torch.float64, device=z.device)
    if score == "similarity_accuracy":
        s = sim * acc.view(1, -1)
    elif score == "similarity":
        s = sim.clone()
    elif score == "accuracy":
        s = acc.view(1, -1).expand(n, n).clone()
    else:
        raise ValueError(f"score must be similarity_accuracy, similarity or accuracy; got {score!r}")
    w = torch.zeros(n, n, dtype=torch.float64, device=z.device)
    for i in range(n):
        cand = [j for j in range(n) if include_self or j != i]
        if not cand:
            continue
        kk = len(cand) if k <= 0 else min(k, len(cand))
        sc = s[i, cand].cpu().numpy()
        order = np.argsort(-sc, kind="stable")[:kk]  # ties: lower client id first
        chosen = [cand[o] for o in order]
        if weighting == "uniform":
            w[i, chosen] = 1.0 / kk
        else:
            tot = float(s[i, chosen].sum())
            w[i, chosen] = s[i, chosen] / tot if tot > 0 else 1.0 / kk
    soft = torch.softmax(z / temperature, dim=-1)
    q = torch.einsum("ij,jnc->inc", w, soft)
    ens1 = torch.einsum("ij,jnc->inc", w, p)
    has = w.sum(1) > 0

    def ent(d: torch.Tensor) -> float:
        return float(-(d * torch.log(d.clamp_min(1e-30))).sum(-1).mean()) if d.numel() else float("nan")

    wr = w[has]
    nz = wr > 0
    diag = {
        "teacher_entropy": ent(q[has]),
        "ensemble_entropy": ent(ens1[has]),
        "teacher_acc": float((q[has].argmax(-1) == y.view(1, -1)).to(torch.float64).mean()) if has.any() and nref else float("nan"),
        "ref_acc_mean": float(acc.mean()),
        "ref_acc_min": float(acc.min()),
        "ref_acc_max": float(acc.max()),
        "sim_mean": float((sim.sum() - sim.diagonal().sum()) / (n * (n - 1))) if n > 1 else float("nan"),
        "w_max": float(wr.max(1).values.mean()) if has.any() else float("nan"),
        "w_entropy": float(-(torch.where(nz, wr * torch.log(wr.clamp_min(1e-30)), torch.zeros_like(wr))).sum(1).mean())
        if has.any() else float("nan"),
        "k_eff": float(nz.sum(1).to(torch.float64).mean()) if has.any() else 0.0,
        "self_weight": float(w.diagonal()[has].mean()) if has.any() else 0.0,
    }
    return w.to(torch.float32), q.to(torch.float32), diag


def require_public(ctx: NodeContext, name: str) -> torch.Tensor:
    if ctx.public_x is None or int(ctx.public_x.shape[0]) == 0:
        raise ValueError(f"{name} needs a public reference set: set data.public_size (e.g. 2000)")
    return ctx.public_x


@register
class KTA(Algorithm):
    """KTA v2: logits on D_ref up, personalised similarity x accuracy soft labels down."""

    name = "kta"
    family = "server"
    paper = ("Prediction-space knowledge markets for communication-efficient federated learning on "
             "multimedia tasks (KTA v2), arXiv 2512.00841")
    Hyperparams = KTAHP
    default_protocols = ("personal", "node_global")
    default_main = "node_global/acc"
    personalized = True
    server_model = False  # the server holds predictions, not a model: no "global" protocol
    needs_public = True
    supports_mixed_models = True

    def init_node(self, ctx: NodeContext) -> State:
        require_public(ctx, "kta")
        return {"params": ctx.init_params()}

    def init_server(self, ctx: NodeContext) -> State:
        y = ctx.data.public_y
        if y is None or int(y.numel()) == 0:
            raise ValueError("kta needs a public reference set with labels at the server: set data.public_size (e.g. 2000)")
        return {}

    def server_params(self, state: State):
        return None

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return [
            Step("local", plan.participants, self.client_local),
            Step("market", [SERVER], self.server_market),
            Step("distill", plan.participants, self.client_distill),
        ]

    def round_metrics(self, server_state: State) -> dict[str, float]:
        return dict(server_state.get("diag", {}))

    # -- client ---------------------------------------------------------------------
    def client_local(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        hp = self.hp
        lr = decayed_lr(hp.lr, hp.lr_decay, ctx.round)
        params, stats = sgd_train(
            ctx.model, state["params"], ctx.data.train_x, ctx.data.train_y, epochs=hp.local_epochs,
            batch_size=hp.batch_size, lr=lr, momentum=hp.momentum, weight_decay=hp.weight_decay,
            grad_clip=hp.grad_clip, gen=ctx.rng("local"), skip_singleton_bn=hp.bn_skip,
        )
        z = predict_logits(ctx.model, params, require_public(ctx, "kta"))
        return {**state, "params": params, "loss": stats.loss}, Outbox().send(SERVER, Message("logits", {"z": z}))

    def client_distill(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:  # no teacher this round
            return state, Outbox()
        hp = self.hp
        lr = decayed_lr(hp.lr, hp.lr_decay, ctx.round)
        params, stats = distill(
            ctx.model, state["params"], require_public(ctx, "kta"), inbox[0].msg.tensors["q"],
            ctx.data.train_x, ctx.data.train_y, epochs=hp.distill_epochs, batch_size=hp.batch_size, lr=lr,
            momentum=hp.momentum, weight_decay=hp.weight_decay, temperature=hp.temperature, lam=hp.lam,
            gen=ctx.rng("distill"), bn_skip=hp.bn_skip, grad_clip=hp.grad_clip,
        )
        return {**state, "params": params, "distill_loss": stats.loss}, Outbox()

    # -- server ---------------------------------------------------------------------
    def server_market(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        hp = self.hp
        ids = [e.src for e in inbox]
        z = torch.stack([e.msg.tensors["z"] for e in inbox])
        w, q, diag = market(z, ctx.data.public_y, k=hp.k, temperature=hp.temperature, score=hp.score,
                            weighting=hp.weighting, include_self=hp.include_self)
        out = Outbox()
        for row, i in enumerate(ids):
            if float(w[row].sum()) > 0:
                out.send(i, Message("soft_labels", {"q": q[row]}))
        # diagnostics and the weights (in client-id order) stay on the server: measurement only
        return {**state, "diag": diag, "weights": w, "weight_ids": torch.tensor(ids, dtype=torch.int64, device=w.device)}, out


__all__ = ["KTA", "KTAHP", "distill", "market", "require_public"]
