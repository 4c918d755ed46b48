"""FOL: Federated Oriented Learning (Huang & Shu, ICML 2025), one-shot personalised FL.

Stages (paper section 3, algorithms 1-2; specs/fol.md):

1. **Pretraining** (round 1, first step; every client): local cross-entropy training with
   early stopping on the local validation split (eq. 3).
2. **Model collection** (rounds e = 1..E): the contact plan (``topology.kind =
   "contact_plan"``, each pair meets at most once) says whom a client meets in round e;
   at a contact **both** sides send their current local model to the other (two
   messages, one per direction, each encoded and counted by the Network). Nothing else
   is ever sent, so a client's bytes are (number of contacts) x (model size) whatever
   the local work.
3. **Alignment** (target clients only): each received model is fine-tuned on the local
   train split (eq. 4), pruned with gates, alignment and group-lasso terms (eq. 5) and
   physically shrunk (:mod:`lowband.algorithms.oneshot.fol_prune`), then fine-tuned again
   (eq. 6). The aligned models, the models kept from the previous round and the current
   local model are scored by validation accuracy; the top K are kept, ties at the
   cut-off broken by cosine similarity to the local model (eq. 8, algorithm 2).
4. **Ensemble** (eq. 10-11): ``A(x) = sum_i w_i f_i(x)`` over the K logits with
   ``w = softmax(beta)`` fitted by minimising the cross-entropy of ``A`` on the local
   train split.
5. **Distillation** (eq. 12): the local model minimises
   ``KL(softmax(A/T) || softmax(f/T)) + lambda ||theta - theta_prev||^2`` on the local
   train split; the result is the client's model for the next round.

Variants: ``align = true`` gives FOL (the distilled model, the node's ``params``) and
FOL-A (the ensemble); ``align = false`` skips fine-tuning, pruning and post-fine-tuning
and gives FOL-N and FOL-AN. ``targets`` restricts stages 3-5 to chosen clients (the
paper evaluates 1-3 clients per setting); the others pretrain and serve as sources.

Per target client ``k`` the run reports (``node_metrics``, written as ``alg/...`` in
metrics.jsonl): ``fol/c<k>/local_acc`` (the pretrained model, the paper's "Local"),
``fol/c<k>/distilled_acc`` (FOL / FOL-N), ``fol/c<k>/ensemble_acc`` (FOL-A / FOL-AN) on
the client's local test split, and pruning sizes. Every interpretation is listed in
docs/algorithms/fol.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.base import Algorithm, Envelope, Hyperparams, NodeContext, Outbox, State, Step, register
from lowband.algorithms.oneshot.fol_prune import (
    Arch, GraphNet, _infer_shapes, arch_key, count_params, effective_gates, match_layers, prune, prune_groups,
    shared_cosine, to_graph, to_native, trace_arch,
)
from lowband.comm.message import Message
from lowband.topology import RoundPlan
from lowband.train import Params, batches, get_params, predict_logits
from lowband.train.fit import fit, val_score
from lowband.train.steps import descend, fit_mixture_weights

#: bump when pretraining changes meaning, so that stale cache entries are never reused
PRETRAIN_VERSION = 1


# --------------------------------------------------------------------------- hyperparameters


class PretrainHP(Hyperparams):
    """Local training settings shared by FOL and its baselines (one-shot FedAvg, DENSE,
    Co-Boosting: "all baselines follow the same hyperparameter settings"). Defaults: the
    paper's CIFAR-10 settings (SGD momentum 0.9, weight decay 1e-3, lr 0.01, batch 128, up
    to 300 epochs with patience 20)."""

    lr: float = Field(0.01, gt=0, description="SGD learning rate of every local training stage")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(1e-3, ge=0, description="SGD weight decay")
    batch_size: int = Field(128, ge=1, description="minibatch size")
    pretrain_epochs: int = Field(300, ge=0, description="maximum pretraining epochs")
    patience: int = Field(20, ge=1, description="early-stopping patience (epochs without a better validation accuracy)")
    pretrain_cache: Optional[str] = Field(
        None, description="folder memoising pretrained models by (data, init, settings, seed); runs that "
        "share it skip identical pretraining (results are unchanged)")


class OneShotHP(PretrainHP):
    """Pretraining plus the contact exchange (FOL and one-shot FedAvg)."""

    targets: Optional[list[int]] = Field(
        None, description="clients that run the expensive stages and are reported (None: all)")
    exchange: Literal["all", "targets"] = Field(
        "all", description="all: every contact moves both models (the full protocol's bytes); "
        "targets: only models addressed to target clients are sent (a cheaper simulation)")


class FOLHP(OneShotHP):
    Q: int = Field(29, ge=1, description="peer models a client can hold (paper: 29)")
    K: int = Field(10, ge=1, description="models kept after each round / ensemble size (paper: 10)")
    align: bool = Field(True, description="fine-tune, prune and post-fine-tune received models (false: FOL-N / FOL-AN)")
    finetune_epochs: int = Field(300, ge=0, description="maximum fine-tuning epochs (eq. 4), early-stopped")
    prune_epochs: int = Field(30, ge=0, description="epochs of the gated pruning objective (eq. 5)")
    post_finetune_epochs: int = Field(300, ge=0, description="maximum post-pruning fine-tuning epochs (eq. 6), early-stopped")
    distill_epochs: int = Field(300, ge=0, description="maximum distillation epochs (eq. 12), early-stopped")
    stage_patience: Optional[int] = Field(
        None, ge=1, description="early-stopping patience of fine-tuning and post-fine-tuning (None: patience)")
    lambda_p: float = Field(0.1, ge=0, description="alignment weight lambda_p (appendix C.2)")
    gamma_shared: float = Field(0.05, ge=0, description="group-lasso weight on shared layers (appendix C.2)")
    gamma_unshared: float = Field(0.02, ge=0, description="group-lasso weight on unshared layers (appendix C.2)")
    gate_lr: float = Field(0.05, gt=0, description="Adam learning rate of the gates (not in the paper)")
    prune_threshold: float = Field(0.05, ge=0, lt=1, description="filters whose gate ends below this are removed")
    ensemble_steps: int = Field(300, ge=0, description="full-batch Adam steps fitting the ensemble weights (eq. 11)")
    ensemble_lr: float = Field(0.05, gt=0, description="Adam learning rate of the ensemble logits beta")
    kd_temperature: float = Field(3.0, gt=0, description="distillation temperature T (not given in the paper)")
    kd_lambda: float = Field(0.01, ge=0, description="weight of ||theta - theta_prev||^2 in eq. 12 (appendix C.2)")


# --------------------------------------------------------------------------- training helpers


def _hash_tensors(*ts: torch.Tensor) -> str:
    h = hashlib.blake2b(digest_size=16)
    for t in ts:
        t = t.detach().contiguous().cpu()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def pretrain(ctx: NodeContext, hp: PretrainHP, start: Params) -> tuple[Params, dict[str, float]]:
    """Stage 1 (eq. 3): early-stopped local training of ``ctx.model`` from ``start``.

    With ``hp.pretrain_cache`` the result is memoised on disk under a hash of everything it
    depends on (node data, start parameters, the settings, seed, round and node): a second
    run with the same inputs loads the identical parameters instead of training again."""
    d = ctx.data
    kw = dict(epochs=hp.pretrain_epochs, patience=hp.patience, lr=hp.lr, momentum=hp.momentum,
              weight_decay=hp.weight_decay, batch_size=hp.batch_size)
    path = None
    if hp.pretrain_cache:
        key = repr((PRETRAIN_VERSION, ctx.seed, ctx.round, ctx.node, type(ctx.model).__name__, sorted(kw.items()),
                    _hash_tensors(d.train_x, d.train_y, d.val_x, d.val_y),
                    _hash_tensors(*[start[k] for k in sorted(start)]), torch.__version__))
        digest = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
        path = Path(hp.pretrain_cache) / f"pretrain-{digest}.pt"
        if path.is_file():
            try:
                blob = torch.load(path, weights_only=True)
                return blob["params"], blob["info"]
            except Exception:  # a torn file: train again and overwrite it
                pass
    params, info = fit(ctx.model, start, d.train_x, d.train_y, d.val_x, d.val_y, gen=ctx.rng("pretrain"), **kw)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"params": params, "info": info}, tmp)
        os.replace(tmp, path)
    return params, info


def wire_arch(arch: Arch) -> str:
    """The descriptor as sent in a message's metadata: compact JSON without the shapes
    (the receiver recomputes them)."""
    slim = {**arch, "ops": [{k: v for k, v in op.items() if k != "shape"} for op in arch["ops"]]}
    return json.dumps(slim, separators=(",", ":"), sort_keys=True)


def read_arch(text: str) -> Arch:
    arch = json.loads(text)
    _infer_shapes(arch)
    return arch


def model_message(params: Params, arch: Arch, meta: Optional[dict[str, Any]] = None) -> Message:
    """A model as it crosses a link: its parameters (descriptor names) and its descriptor."""
    return Message("weights", to_graph(params, arch), meta={"arch": wire_arch(arch), **(meta or {})})


def _build(arch: Arch, params: Params) -> GraphNet:
    net = GraphNet(arch)
    if params:  # on the parameters' device (the run's)
        net = net.to(next(iter(params.values())).device)
    net.load_state_dict(params)
    return net


# --------------------------------------------------------------------------- the algorithm


class _OneShotBase(Algorithm):
    """Pretraining, target selection and the contact exchange shared by FOL and one-shot
    FedAvg."""

    family = "oneshot"
    default_protocols = ("personal",)
    default_main = "personal/acc_weighted"

    def is_target(self, node: int) -> bool:
        t = self.hp.targets
        return t is None or node in t

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params(), "arch": self._arch(ctx, {}), "pretrained": False}

    def _arch(self, ctx: NodeContext, state: State) -> Arch:
        """The descriptor of this node's own architecture (traced once, kept in the state)."""
        if state.get("arch"):
            return state["arch"]
        return trace_arch(ctx.model, list(ctx.data.train_x.shape[1:]))

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        nodes = list(plan.neighbors.keys()) if plan.neighbors else list(plan.participants)
        steps = []
        if round == 1:
            steps.append(Step("pretrain", sorted(nodes), self._pretrain))
        steps.append(Step("send", list(plan.participants), self._send))
        steps.append(Step("collect", list(plan.participants), self._collect))
        return steps

    def _pretrain(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if state.get("pretrained"):
            return state, Outbox()
        arch = self._arch(ctx, state)
        params, info = pretrain(ctx, self.hp, state["params"])
        new = {**state, "params": params, "arch": arch, "pretrained": True,
               "pretrain_epochs": info["epochs"]}
        if self.is_target(ctx.node):
            new["local0"] = {k: v.clone() for k, v in params.items()}
        return new, Outbox()

    def _send(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        peers = list(ctx.neighbors)
        if self.hp.exchange == "targets":
            peers = [p for p in peers if self.is_target(p)]
        out = Outbox()
        if peers:
            out.broadcast(peers, model_message(state["params"], self._arch(ctx, state)))
        return state, out

    def _collect(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        raise NotImplementedError

    @torch.no_grad()
    def _acc(self, net: nn.Module, params: Optional[Params], ctx: NodeContext) -> float:
        d = ctx.data
        if int(d.test_y.numel()) == 0:
            return float("nan")
        logits = predict_logits(net, params, d.test_x)
        return float((logits.argmax(1) == d.test_y).float().mean())


@register
class FOL(_OneShotBase):
    """Federated Oriented Learning with the variants FOL / FOL-A (align = true) and
    FOL-N / FOL-AN (align = false)."""

    name = "fol"
    #: received models are rebuilt from their own descriptors (appendix B.1 matching), so
    #: a federation may mix architectures (``[model] mix``)
    supports_mixed_models = True
    paper = "Huang & Shu, Federated Oriented Learning: A Practical One-Shot Personalized Federated Learning Framework, ICML 2025"
    Hyperparams = FOLHP

    # -- per-model alignment (eq. 4-6) --------------------------------------------------
    def _train_kw(self, stage: bool = False) -> dict[str, Any]:
        hp = self.hp
        patience = hp.stage_patience if (stage and hp.stage_patience is not None) else hp.patience
        return dict(patience=patience, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay,
                    batch_size=hp.batch_size)

    def align(self, ctx: NodeContext, arch: Arch, params: Params, local_arch: Arch, local: Params,
              src: int) -> tuple[Arch, Params, dict[str, Any]]:
        """Fine-tune, prune (eq. 5, physically) and post-fine-tune one received model."""
        hp, d = self.hp, ctx.data
        net = GraphNet(arch)
        ft, _ = fit(net, params, d.train_x, d.train_y, d.val_x, d.val_y, epochs=hp.finetune_epochs,
                    gen=ctx.rng("finetune", src), **self._train_kw(stage=True))
        gates, gated = self.gate_train(ctx, arch, ft, local_arch, local, src)
        p_arch, p_params, report = prune(arch, gated, gates, hp.prune_threshold)
        # the equivalence check, on this client's validation inputs: the physically pruned
        # model and the gated model with the pruned gates at zero give the same logits
        with torch.no_grad():
            x = d.val_x[:64] if d.n_val else d.train_x[:64]
            ref = _build(arch, gated).eval()(x, gates=effective_gates(gates, hp.prune_threshold))
            got = _build(p_arch, p_params).eval()(x)
            report["equiv_maxdiff"] = float((ref - got).abs().max()) if x.numel() else 0.0
        net = GraphNet(p_arch)
        post, _ = fit(net, p_params, d.train_x, d.train_y, d.val_x, d.val_y, epochs=hp.post_finetune_epochs,
                      gen=ctx.rng("postfinetune", src), **self._train_kw(stage=True))
        return p_arch, post, report

    def gate_train(self, ctx: NodeContext, arch: Arch, params: Params, local_arch: Arch, local: Params,
                   src: int) -> tuple[dict[int, torch.Tensor], Params]:
        """Minimise eq. 5 over the weights and the gates; returns the gates (gate op index
        -> vector in [0, 1]) and the trained weights (into which :func:`prune` folds them)."""
        hp, d = self.hp, ctx.data
        net = _build(arch, params)
        groups = prune_groups(arch)
        if hp.prune_epochs <= 0 or not groups or d.n_train == 0:
            return {}, params
        shared = {ni: li for li, ni in match_layers(local_arch, arch)}
        gates = {g["gate"]: torch.ones(g["channels"], device=d.train_x.device, requires_grad=True) for g in groups}
        anchors = {}
        for g in groups:
            li = shared.get(g["layer"])
            if li is not None:
                anchors[g["layer"]] = local[f"mods.{li}.weight"].detach().flatten(1)
        opt_w = torch.optim.SGD(net.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        opt_g = torch.optim.Adam(list(gates.values()), lr=hp.gate_lr)
        has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
        gen = ctx.rng("prune", src)
        for _ in range(hp.prune_epochs):
            net.train()
            for idx in batches(d.n_train, hp.batch_size, gen):
                if has_bn and idx.numel() <= 1:
                    continue
                loss = F.cross_entropy(net(d.train_x[idx], gates=gates), d.train_y[idx])
                for g in groups:
                    a = gates[g["gate"]]
                    w = net.mods[str(g["layer"])].weight.flatten(1)
                    lasso = (a * w.norm(dim=1)).sum()
                    anchor = anchors.get(g["layer"])
                    if anchor is not None:
                        loss = loss + hp.lambda_p * ((a[:, None] * w - anchor) ** 2).sum() + hp.gamma_shared * lasso
                    else:
                        loss = loss + hp.gamma_unshared * lasso
                descend([opt_w, opt_g], loss)
                with torch.no_grad():
                    for a in gates.values():
                        a.clamp_(0.0, 1.0)
        return {k: v.detach().clone() for k, v in gates.items()}, get_params(net)

    # -- selection, ensemble, distillation -------------------------------------------------
    @staticmethod
    def top_k(cands: list[dict[str, Any]], k: int, cos: Callable[[dict[str, Any]], float]) -> list[dict[str, Any]]:
        """Algorithm 2: the ``k`` best candidates by validation score; at the cut-off score
        the ties are ordered by cosine similarity to the local model (more similar first)."""
        if len(cands) <= k:
            return sorted(cands, key=lambda c: -c["score"])
        ranked = sorted(cands, key=lambda c: -c["score"])
        cut = ranked[k - 1]["score"]
        above = [c for c in ranked if c["score"] > cut]
        tie = [c for c in ranked if c["score"] == cut]
        tie.sort(key=lambda c: -cos(c))
        return above + tie[: k - len(above)]

    def fit_weights(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. 11: ``w = softmax(beta)`` minimising CE of ``sum_i w_i logits_i`` (K, N, C)."""
        return fit_mixture_weights(logits, y, steps=self.hp.ensemble_steps, lr=self.hp.ensemble_lr)

    def distill(self, ctx: NodeContext, arch: Arch, start: Params, teacher_train: torch.Tensor) -> Params:
        """Eq. 12 on the local train split: KL(softmax(A/T) || softmax(f/T)) + lambda ||theta -
        theta_prev||^2, early-stopped on validation accuracy."""
        hp, d = self.hp, ctx.data
        T = hp.kd_temperature
        anchor = {k: v.detach().clone() for k, v in start.items() if v.is_floating_point()}
        soft = F.softmax(teacher_train / T, dim=1)

        def loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            kl = F.kl_div(F.log_softmax(net(x) / T, dim=1), soft[idx], reduction="batchmean")
            reg = sum(((p - anchor[f"{n}"]) ** 2).sum() for n, p in net.named_parameters())
            return kl + hp.kd_lambda * reg

        out, _ = fit(GraphNet(arch), start, d.train_x, d.train_y, d.val_x, d.val_y, epochs=hp.distill_epochs,
                     gen=ctx.rng("distill"), loss_fn=loss, **self._train_kw())
        return out

    # -- the round -------------------------------------------------------------------------
    def _collect(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not self.is_target(ctx.node) or not inbox:
            return state, Outbox()
        hp, d = self.hp, ctx.data
        arch = self._arch(ctx, state)
        local = to_graph(state["params"], arch)
        kept = list(state.get("kept", []))
        cap = (hp.Q + 1 - len(kept)) if kept else hp.Q
        log = list(state.get("log", []))
        cands = []
        for env in sorted(inbox, key=lambda e: e.src)[: max(cap, 0)]:
            n_arch = read_arch(str(env.msg.meta["arch"]))
            n_params = {k: v.clone() for k, v in env.msg.tensors.items()}
            before = count_params(n_arch)
            equiv = 0.0
            if hp.align:
                n_arch, n_params, report = self.align(ctx, n_arch, n_params, arch, local, env.src)
                equiv = report["equiv_maxdiff"]
            score = val_score(_build(n_arch, n_params), d.val_x, d.val_y)[0]
            cands.append({"arch": n_arch, "params": n_params, "score": score, "src": env.src, "round": ctx.round})
            log.append([float(ctx.round), float(env.src), float(before), float(count_params(n_arch)), score, equiv])
        me = {"arch": copy.deepcopy(arch), "params": {k: v.clone() for k, v in local.items()},
              "score": val_score(_build(arch, local), d.val_x, d.val_y)[0], "src": ctx.node, "round": ctx.round}
        pool = kept + cands + [me]
        chosen = self.top_k(pool, hp.K, lambda c: shared_cosine(arch, local, c["arch"], c["params"]))
        logits = torch.stack([predict_logits(_build(c["arch"], c["params"]), None, d.train_x) for c in chosen])
        w = self.fit_weights(logits, d.train_y)
        teacher = torch.einsum("k,knc->nc", w, logits)
        student = self.distill(ctx, arch, local, teacher)
        new = {**state, "params": to_native(student, arch), "kept": chosen, "weights": w,
               "log": log}
        return new, Outbox()

    # -- measurement -----------------------------------------------------------------------
    def node_metrics(self, ctx: NodeContext, state: State) -> dict[str, float]:
        if not self.is_target(ctx.node) or not state.get("pretrained"):
            return {}
        k = ctx.node
        out = {f"fol/c{k}/local_acc": self._acc(ctx.model, state["local0"], ctx),
               f"fol/c{k}/distilled_acc": self._acc(ctx.model, state["params"], ctx)}
        kept = state.get("kept")
        if kept:
            d = ctx.data
            with torch.no_grad():
                logits = torch.stack([predict_logits(_build(c["arch"], c["params"]), None, d.test_x) for c in kept])
                ens = torch.einsum("k,knc->nc", state["weights"], logits)
            out[f"fol/c{k}/ensemble_acc"] = float((ens.argmax(1) == d.test_y).float().mean())
            out[f"fol/c{k}/ensemble_params_mean"] = float(sum(count_params(c["arch"]) for c in kept) / len(kept))
            out[f"fol/c{k}/ensemble_peers"] = float(sum(1 for c in kept if c["src"] != k))
        log = state.get("log")
        if log:
            this = [r for r in log if int(r[0]) == ctx.round] or log
            out[f"fol/c{k}/received"] = float(len(this))
            out[f"fol/c{k}/params_before_mean"] = sum(r[2] for r in this) / len(this)
            out[f"fol/c{k}/params_after_mean"] = sum(r[3] for r in this) / len(this)
            out[f"fol/c{k}/aligned_val_acc_mean"] = sum(r[4] for r in this) / len(this)
            out[f"fol/c{k}/params_after_min"] = min(r[3] for r in this)
            out[f"fol/c{k}/pruned_models"] = float(sum(1 for r in this if r[3] < r[2]))
            out[f"fol/c{k}/prune_equiv_maxdiff"] = max(r[5] for r in this)
        return out
