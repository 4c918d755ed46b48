"""FedMD (Li & Wang, "FedMD: Heterogenous Federated Learning via Model Distillation",
NeurIPS 2019 workshop; reference code diogenes0319/FedMD_clean), faithful.

FedMD's public dataset is *labelled* and known to every party (it is a public dataset).
Here it is the federation's public set (``data.public_size``); the server holds it with
its labels and sends the labels once to each client (kind ``public_labels``, counted in
the ledger). This differs from KTA v2, whose clients only ever see the inputs.

Phase 0, transfer learning (each client, the first round it takes part): train on the
labelled public set (Adam 1e-3, batch 128, up to 20 epochs, early stopping with
min_delta 0.005 and patience 3), then on its private data (Adam 1e-3, batch 32, up to
25 epochs, early stopping with min_delta 0.001 and patience 10), as in FedMD_clean.

Each round (steps ``align`` -> ``logits`` -> ``consensus`` -> ``digest``):

1. server: draw a stratified alignment subset of ``n_alignment`` public samples
   (5000 in the reference code; all of the public set when it is smaller) and broadcast
   its indices;
2. client: (phase 0 on its first round) upload its logits on the alignment subset;
3. server: the consensus is the plain average of the clients' logits, the same for
   everyone; broadcast it;
4. client: *digest*: fit its logits to the consensus with mean absolute error,
   ``digest_epochs`` = 1 epoch, Adam 1e-3, batch 256; *revisit*: ``revisit_epochs`` = 4
   epochs of cross-entropy on its private data, Adam 1e-3, batch 5 (the reference
   code's ``N_private_training_round`` and ``private_training_batchsize``).

Deviations (written in docs/algorithms/kta.md): Keras keeps one Adam state per compiled
model across calls; we start a fresh Adam for every phase. Early stopping monitors the
accuracy on a held-out ``es_val_fraction`` of the data being fitted (the reference code
monitors the private *test* set), keeps the last weights (Keras' default) and can be
turned off (``early_stopping = false``: the full epoch budgets). The round-0 evaluation
is of the initial model; phase 0 happens inside round 1.

Diagnostics (``alg/...``): the consensus' mean row entropy (``teacher_entropy``, nats,
softmax at T = 1; ``ensemble_entropy`` is the same number for FedMD), its accuracy on
the alignment labels (``teacher_acc``), the clients' accuracy on them
(``ref_acc_mean/min/max``) and the mean absolute distance of the clients' logits to the
consensus (``logit_mae``).
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.base import SERVER, Algorithm, Envelope, Hyperparams, NodeContext, Outbox, State, Step, register
from lowband.algorithms.knowledge.kta import require_public
from lowband.comm.message import Message
from lowband.seeding import np_gen
from lowband.topology import RoundPlan
from lowband.train import predict_logits
from lowband.train.distill import adam_fit

Params = dict[str, torch.Tensor]


class FedMDHP(Hyperparams):
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of every phase (reference code: 1e-3)")
    transfer_public_epochs: int = Field(20, ge=0, description="phase 0: max epochs on the labelled public set")
    transfer_public_batch: int = Field(128, ge=1, description="phase 0: batch size on the public set")
    transfer_private_epochs: int = Field(25, ge=0, description="phase 0: max epochs on private data")
    transfer_private_batch: int = Field(32, ge=1, description="phase 0: batch size on private data")
    early_stopping: bool = Field(True, description="phase 0: stop when held-out accuracy stops improving")
    es_val_fraction: float = Field(0.1, ge=0, lt=1, description="phase 0: fraction held out to monitor early stopping")
    public_patience: int = Field(3, ge=1, description="phase 0 public: early-stopping patience (epochs)")
    public_min_delta: float = Field(0.005, ge=0, description="phase 0 public: minimum improvement")
    private_patience: int = Field(10, ge=1, description="phase 0 private: early-stopping patience (epochs)")
    private_min_delta: float = Field(0.001, ge=0, description="phase 0 private: minimum improvement")
    n_alignment: int = Field(5000, ge=1, description="alignment subset drawn (stratified) each round; capped at the public size")
    digest_epochs: int = Field(1, ge=0, description="epochs of MAE logit matching to the consensus")
    digest_batch: int = Field(256, ge=1, description="batch size of the digest")
    revisit_epochs: int = Field(4, ge=0, description="epochs on private data after the digest (2-4 in the paper)")
    revisit_batch: int = Field(5, ge=1, description="batch size of the revisit (reference code: 5)")
    bn_skip: bool = Field(True, description="skip steps on batches of <= 1 sample when the model has BatchNorm")


def stratified_subset(y: torch.Tensor, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices of ``y`` with class proportions kept (largest remainders), sorted;
    every index when ``n >= len(y)``."""
    m = int(y.numel())
    if n >= m:
        return np.arange(m, dtype=np.int64)
    labels = y.cpu().numpy()
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n / m
    take = np.floor(exact).astype(np.int64)
    rest = n - int(take.sum())
    if rest > 0:
        order = np.argsort(-(exact - take), kind="stable")[:rest]
        take[order] += 1
    out = [rng.choice(np.flatnonzero(labels == c), t, replace=False) for c, t in zip(classes, take) if t > 0]
    return np.sort(np.concatenate(out)).astype(np.int64)


def _ce(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _mae(model: nn.Module, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return (model(x) - z).abs().mean()


@register
class FedMD(Algorithm):
    """FedMD: transfer learning, then rounds of consensus logits (digest with MAE, revisit)."""

    name = "fedmd"
    family = "server"
    paper = "Li & Wang, FedMD: Heterogenous Federated Learning via Model Distillation, NeurIPS 2019 workshop"
    Hyperparams = FedMDHP
    #: logits on a fresh alignment subset of the public set every round
    unaligned_kinds = {"logits": ("up",), "consensus": ("down",)}
    default_protocols = ("personal", "node_global")
    default_main = "node_global/acc"
    personalized = True
    server_model = False  # the server holds predictions, not a model: no "global" protocol
    needs_public = True
    supports_mixed_models = True

    def init_node(self, ctx: NodeContext) -> State:
        require_public(ctx, "fedmd")
        return {"params": ctx.init_params(), "pretrained": False}

    def init_server(self, ctx: NodeContext) -> State:
        y = ctx.data.public_y
        if y is None or int(y.numel()) == 0:
            raise ValueError("fedmd needs a labelled public set at the server: set data.public_size (e.g. 2000)")
        return {"labelled": torch.zeros(0, dtype=torch.int64, device=y.device)}

    def server_params(self, state: State):
        return None

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return [
            Step("align", [SERVER], self.server_align),
            Step("logits", plan.participants, self.client_logits),
            Step("consensus", [SERVER], self.server_consensus),
            Step("digest", plan.participants, self.client_digest),
        ]

    def round_metrics(self, server_state: State) -> dict[str, float]:
        return dict(server_state.get("diag", {}))

    # -- server ---------------------------------------------------------------------
    def server_align(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        y = ctx.data.public_y
        idx = stratified_subset(y, self.hp.n_alignment, np_gen(ctx.seed, "fedmd", "align", ctx.round))
        out = Outbox()
        have = set(state["labelled"].tolist())
        new = [c for c in ctx.participants if c not in have]
        if new:  # the public dataset's labels, once per client (FedMD's public set is labelled)
            out.broadcast(new, Message("public_labels", {"y": y.to(torch.int64)}))
        out.broadcast(ctx.participants, Message("align", {"idx": torch.from_numpy(idx).to(torch.int32)}))
        labelled = torch.tensor(sorted(have | set(new)), dtype=torch.int64, device=y.device)
        return {**state, "labelled": labelled, "align_idx": torch.from_numpy(idx).to(y.device)}, out

    def server_consensus(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        z = torch.stack([e.msg.tensors["z"].to(torch.float64) for e in inbox])
        cons = z.mean(0)
        y = ctx.data.public_y[state["align_idx"]]
        p = torch.softmax(cons, -1)
        accs = (z.argmax(-1) == y.view(1, -1)).to(torch.float64).mean(1)
        ent = float(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean())
        diag = {
            "teacher_entropy": ent,
            "ensemble_entropy": ent,
            "teacher_acc": float((cons.argmax(-1) == y).to(torch.float64).mean()),
            "ref_acc_mean": float(accs.mean()),
            "ref_acc_min": float(accs.min()),
            "ref_acc_max": float(accs.max()),
            "logit_mae": float((z - cons).abs().mean()),
        }
        msg = Message("consensus", {"z": cons.to(torch.float32)})
        return {**state, "diag": diag}, Outbox().broadcast([e.src for e in inbox], msg)

    # -- client ---------------------------------------------------------------------
    def _split_val(self, ctx: NodeContext, n: int, purpose: str) -> tuple[np.ndarray, np.ndarray]:
        perm = np_gen(ctx.seed, "fedmd", "es", ctx.node, purpose).permutation(n)
        nv = int(round(self.hp.es_val_fraction * n)) if self.hp.early_stopping else 0
        nv = min(nv, n - 1) if n > 1 else 0
        return np.sort(perm[nv:]), np.sort(perm[:nv])

    def _fit_es(self, ctx: NodeContext, params: Params, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
                batch: int, patience: int, min_delta: float, purpose: str) -> Params:
        tr, va = self._split_val(ctx, int(y.numel()), purpose)
        tr_t, va_t = torch.from_numpy(tr), torch.from_numpy(va)
        val = (x[va_t], y[va_t]) if va.size and self.hp.early_stopping else None
        params, _ = adam_fit(ctx.model, params, x[tr_t], y[tr_t], _ce, epochs=epochs, batch_size=batch,
                             lr=self.hp.lr, gen=ctx.rng(purpose), bn_skip=self.hp.bn_skip, val=val,
                             patience=patience if val is not None else 0, min_delta=min_delta)
        return params

    def client_logits(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        msgs = {e.msg.kind: e.msg for e in inbox}
        state = dict(state)
        if "public_labels" in msgs:
            state["public_y"] = msgs["public_labels"].tensors["y"].to(torch.int64)
        pub_x = require_public(ctx, "fedmd")
        params = state["params"]
        if not state["pretrained"]:
            hp = self.hp
            params = self._fit_es(ctx, params, pub_x, state["public_y"], epochs=hp.transfer_public_epochs,
                                  batch=hp.transfer_public_batch, patience=hp.public_patience,
                                  min_delta=hp.public_min_delta, purpose="transfer_public")
            params = self._fit_es(ctx, params, ctx.data.train_x, ctx.data.train_y,
                                  epochs=hp.transfer_private_epochs, batch=hp.transfer_private_batch,
                                  patience=hp.private_patience, min_delta=hp.private_min_delta,
                                  purpose="transfer_private")
            state["pretrained"] = True
        idx = msgs["align"].tensors["idx"].to(torch.int64)
        z = predict_logits(ctx.model, params, pub_x[idx])
        state.update(params=params, align_idx=idx)
        return state, Outbox().send(SERVER, Message("logits", {"z": z}))

    def client_digest(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        state = dict(state)
        idx = state.pop("align_idx", None)
        if not inbox or idx is None:
            return state, Outbox()
        hp = self.hp
        cons = inbox[0].msg.tensors["z"]
        params, dstats = adam_fit(ctx.model, state["params"], require_public(ctx, "fedmd")[idx], cons, _mae,
                                  epochs=hp.digest_epochs, batch_size=hp.digest_batch, lr=hp.lr,
                                  gen=ctx.rng("digest"), bn_skip=hp.bn_skip)
        params, rstats = adam_fit(ctx.model, params, ctx.data.train_x, ctx.data.train_y, _ce,
                                  epochs=hp.revisit_epochs, batch_size=hp.revisit_batch, lr=hp.lr,
                                  gen=ctx.rng("revisit"), bn_skip=hp.bn_skip)
        state.update(params=params, digest_loss=dstats.loss, loss=rstats.loss)
        return state, Outbox()


__all__ = ["FedMD", "FedMDHP", "adam_fit", "stratified_subset"]
