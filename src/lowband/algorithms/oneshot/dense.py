"""DENSE (Zhang et al., NeurIPS 2022): one-shot FL by data-free distillation at the server.

Round 1: every client trains its model once on its own data (the same early-stopped
local training as FOL's pretraining, :func:`lowband.algorithms.oneshot.fol.pretrain`) and uploads
it: one message per client, encoded and counted. The default topology is a star on which
every client takes part in round 1 (``sampling = "all"``); a topology on which some client
would never upload is refused before the run starts (:meth:`DENSE.check_topology`). From
then on only the server works; each round is one DENSE epoch:

1. **Synthesis**: a :class:`~lowband.algorithms.oneshot.generator.Generator`, re-initialised
   (DCGAN init, :meth:`~lowband.algorithms.oneshot.generator.Generator.reset`) with a fresh
   batch of latent codes, is optimised with Adam (``lr_g``, betas 0.5/0.999) for ``g_steps``
   steps on ``bn * L_BN + oh * CE(A(x), y) + adv * L_adv``, where ``A`` is the uniform
   average of the client models' logits, ``y`` random labels, ``L_BN`` the
   BatchNorm-statistics term of the client models (zero for models without BatchNorm,
   such as FOL's CIFAR CNN or the MLP) and ``L_adv = -mean(mask * KL(A(x) || S(x)))`` with
   ``mask`` = the samples on which the student ``S`` and ``A`` *disagree* (official code,
   ``helpers/synthesizers.py``). The teachers see the batch after a random crop (zero
   padding of 1/8 of the image side: 4 pixels at 32x32, as the reference) and a
   horizontal flip (``flip``). The batch of the lowest loss joins the synthetic pool.
2. **Distillation**: the student is trained with SGD on the pool (same crop and flip)
   to minimise ``T^2 KL(softmax(A/T) || softmax(S/T))``, ``T = 20``.

Generated images live in ``[0, 1]``; before a classifier sees them they are normalised
with the dataset's published per-channel mean/std (the server's
:class:`~lowband.engine.executor.ServerData`; ``pixel_mean``/``pixel_std`` override it),
so that they cover the same input range as the data the clients trained on.

The student is the server's model (``global`` protocol). ``eval_reference`` (optional) names
a FOL config whose federation's target clients ``eval_targets`` are evaluated on their local
test split (``node_metrics`` on the server: ``dense/c<k>/acc``, and ``dense/c<k>/ensemble_acc``
for the clients' ensemble); ``dense/agree`` is the student's agreement with the ensemble
on the newest synthetic batch and ``dense/synth_match`` the share of that batch the
ensemble assigns to its target label (diagnostics of a collapsing synthesis).
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from pydantic import Field

from lowband.algorithms.base import SERVER, Algorithm, Envelope, NodeContext, Outbox, State, Step, register
from lowband.algorithms.oneshot.fol import PretrainHP, _build, model_message, pretrain, read_arch
from lowband.algorithms.oneshot.fol_prune import trace_arch
from lowband.algorithms.oneshot.generator import DEFAULT_STATS, BNStatLoss, Generator, augment_batch, normalise
from lowband.data.build import federation_of_config
from lowband.topology import RoundPlan, Topology
from lowband.train import Params, batches, get_params, predict_logits
from lowband.train.steps import descend


def kldiv(student: torch.Tensor, teacher: torch.Tensor, T: float, reduction: str = "batchmean") -> torch.Tensor:
    """``T^2 KL(softmax(teacher/T) || softmax(student/T))`` (the reference code's kldiv)."""
    q = F.log_softmax(student / T, dim=1)
    p = F.softmax(teacher / T, dim=1)
    if reduction == "none":
        return F.kl_div(q, p, reduction="none") * (T * T)
    return F.kl_div(q, p, reduction="batchmean") * (T * T)


class DenseHP(PretrainHP):
    nz: int = Field(256, ge=1, description="latent size of the generator")
    ngf: int = Field(64, ge=1, description="generator width")
    synthesis_batch: int = Field(256, ge=1, description="synthetic images per epoch")
    g_steps: int = Field(30, ge=1, description="generator/latent Adam steps per epoch")
    lr_g: float = Field(1e-3, gt=0, description="Adam learning rate of the generator and the latent codes")
    bn: float = Field(1.0, ge=0, description="weight of the BatchNorm-statistics term")
    oh: float = Field(1.0, ge=0, description="weight of the cross-entropy (one-hot) term")
    adv: float = Field(1.0, ge=0, description="weight of the adversarial term")
    kd_T: float = Field(20.0, gt=0, description="distillation temperature (DENSE README: 20)")
    kd_lr: float = Field(0.01, gt=0, description="student SGD learning rate")
    kd_momentum: float = Field(0.9, ge=0, lt=1, description="student SGD momentum")
    kd_batch: int = Field(128, ge=1, description="distillation batch size")
    kd_steps: Optional[int] = Field(None, ge=1, description="distillation batches per epoch, over as many passes "
                                    "of the pool as they need (None: one pass over the pool, the reference)")
    pool_cap: Optional[int] = Field(None, ge=1, description="keep only the newest pool_cap synthetic images (None: all)")
    kd_weight_decay: float = Field(0.0, ge=0, description="student SGD weight decay")
    kd_clip: Optional[float] = Field(None, gt=0, description="clip the student's gradient norm (None: no clipping)")
    g_clip: Optional[float] = Field(None, gt=0, description="clip the generator's gradient norm (None: no clipping)")
    synth_augment: bool = Field(True, description="random crop and flip of the synthetic batch before the teachers "
                                "see it during synthesis (DENSE: true)")
    aug_pad: Optional[int] = Field(None, ge=0, description="zero padding of the random crop, in pixels (None: image "
                                   "side // 8, the reference's 4 at 32x32)")
    flip: bool = Field(True, description="random horizontal flips in the synthesis and distillation augmentation "
                       "(false for data that is not mirror-symmetric, e.g. digits)")
    pixel_mean: Optional[list[float]] = Field(None, description="per-channel mean for normalising synthetic images "
                                              "(None: the dataset's published normalisation)")
    pixel_std: Optional[list[float]] = Field(None, description="per-channel std (see pixel_mean)")
    eval_reference: Optional[str] = Field(None, description="FOL config whose federation's target clients are evaluated")
    eval_targets: list[int] = Field(default_factory=list, description="clients of eval_reference evaluated on their local test split")


@register
class DENSE(Algorithm):
    """Data-free ensemble distillation into a server model from one upload per client."""

    name = "dense"
    family = "server"
    #: the clients' models are rebuilt from their own descriptors; only logits are mixed
    supports_mixed_models = True
    paper = "Zhang et al., DENSE: Data-Free One-Shot Federated Learning, NeurIPS 2022"
    Hyperparams = DenseHP
    default_protocols = ("global",)
    default_main = "global/acc"
    personalized = False
    #: one upload per client in round 1: a star on which every client takes part
    default_topology = {"kind": "star", "sampling": "all"}
    #: divide the BatchNorm term by the number of teachers (Co-Boosting's code; DENSE's sums)
    bn_per_teacher = False

    def check_topology(self, topology: Topology, num_nodes: int) -> None:
        """Every client uploads once, in round 1, to the server: refuse a topology on
        which some client would never upload (no server, or not all clients in round 1)."""
        fix = 'use topology.kind = "star" with topology.sampling = "all" (the default)'
        if topology.kind != "star":
            raise ValueError(f"{self.name} needs a server (each client uploads its model to it once); "
                             f"topology kind {topology.kind!r} has none; {fix}")
        first = set(topology.plan(0).participants)
        missing = sorted(set(range(num_nodes)) - first)
        if missing:
            raise ValueError(f"{self.name} takes one upload from every client in round 1, but this star lets only "
                             f"{len(first)} of {num_nodes} clients take part then, so {len(missing)} would never "
                             f"upload; {fix}")

    # -- state -------------------------------------------------------------------------
    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def init_server(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params(), "epoch": 0, "teachers": [], "teacher_archs": []}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        if round == 1:
            return [Step("pretrain", list(plan.participants), self.client_upload),
                    Step("distill", [SERVER], self.server_epoch)]
        return [Step("distill", [SERVER], self.server_epoch)]

    # -- clients -----------------------------------------------------------------------
    def client_upload(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        params, _ = pretrain(ctx, self.hp, state["params"])
        arch = trace_arch(ctx.model, list(ctx.data.train_x.shape[1:]))
        msg = model_message(params, arch, {"num_examples": ctx.data.n_train})
        return {**state, "params": params}, Outbox().send(SERVER, msg)

    # -- server ------------------------------------------------------------------------
    def _stats(self, ctx: NodeContext, shape: list[int]) -> tuple[list[float], list[float]]:
        """Per-channel (mean, std) mapping ``[0, 1]`` images into the classifiers' input
        space: ``pixel_mean``/``pixel_std``, else the dataset's published normalisation
        (server data), else :data:`DEFAULT_STATS` by channel count."""
        c = int(shape[0])
        mean, std = DEFAULT_STATS.get(c, ((0.5,) * c, (0.5,) * c))
        published = getattr(ctx.data, "input_stats", None)
        if published is not None and len(published[0]) == c:
            mean, std = published
        return list(self.hp.pixel_mean or mean), list(self.hp.pixel_std or std)

    def teachers(self, state: State) -> list[torch.nn.Module]:
        nets = []
        for arch, params in zip(state["teacher_archs"], state["teachers"]):
            net = _build(arch, params)
            net.eval()
            for p in net.parameters():
                p.requires_grad_(False)
            nets.append(net)
        return nets

    def ensemble_logits(self, nets: list[torch.nn.Module], x: torch.Tensor, state: State) -> torch.Tensor:
        """DENSE: the uniform average of the client models' logits."""
        return torch.stack([n(x) for n in nets]).mean(0)

    def synthesis_loss(self, t_out: torch.Tensor, s_out: torch.Tensor, y: torch.Tensor,
                       loss_bn: torch.Tensor) -> torch.Tensor:
        hp = self.hp
        loss_oh = F.cross_entropy(t_out, y)
        mask = (s_out.argmax(1) != t_out.argmax(1)).float()
        loss_adv = -(kldiv(s_out, t_out, 1.0, reduction="none").sum(1) * mask).mean()
        return hp.bn * loss_bn + hp.oh * loss_oh + hp.adv * loss_adv

    def synthesize(self, ctx: NodeContext, state: State, nets: list[torch.nn.Module], student: torch.nn.Module,
                   shape: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch of synthesis: returns the best batch (images in [0, 1]) and its labels."""
        hp = self.hp
        mean, std = self._stats(ctx, shape)
        gen = ctx.rng("synth", state["epoch"])
        dev = next(student.parameters()).device  # drawn on the CPU (the same on any device), then moved
        G = Generator(hp.nz, hp.ngf, shape)
        G.reset()
        G.to(dev)
        z = torch.randn(hp.synthesis_batch, hp.nz, generator=gen).to(dev).requires_grad_()
        y = torch.randint(0, ctx.num_classes, (hp.synthesis_batch,), generator=gen).to(dev)
        opt = torch.optim.Adam([{"params": G.parameters()}, {"params": [z]}], lr=hp.lr_g, betas=(0.5, 0.999))
        bn_loss = BNStatLoss(nets)
        bn_scale = 1.0 / len(nets) if self.bn_per_teacher else 1.0
        student.eval()
        best, best_cost = None, float("inf")
        try:
            for _ in range(hp.g_steps):
                x = G(z)
                xa = normalise(self.augment(x, gen) if hp.synth_augment else x, mean, std)
                t_out = self.ensemble_logits(nets, xa, state)
                lb = bn_loss.pop() * bn_scale
                loss = self.synthesis_loss(t_out, student(xa), y, lb)
                if loss.item() < best_cost or best is None:
                    best_cost, best = loss.item(), x.detach().clone()
                descend(opt, loss, clip=(G.parameters(), hp.g_clip) if hp.g_clip is not None else None)
        finally:
            bn_loss.close()
        return best, y

    def augment(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """Random crop (zero padding ``aug_pad``, default image side // 8) and flip (``flip``)."""
        pad = self.hp.aug_pad if self.hp.aug_pad is not None else max(1, int(x.shape[-1]) // 8)
        return augment_batch(x, gen, pad=pad, flip=self.hp.flip)

    def kd_inputs(self, ctx: NodeContext, x: torch.Tensor, nets: list[torch.nn.Module], state: State,
                  mean: list[float], std: list[float], gen: torch.Generator) -> torch.Tensor:
        """The (normalised) student inputs of one distillation batch of pool images."""
        return normalise(x, mean, std)

    def distill_epoch(self, ctx: NodeContext, state: State, nets: list[torch.nn.Module], pool_x: torch.Tensor,
                      shape: list[int]) -> tuple[Params, float]:
        hp = self.hp
        mean, std = self._stats(ctx, shape)
        student = ctx.model
        student.load_state_dict(state["params"])
        student.train()
        opt = torch.optim.SGD(student.parameters(), lr=hp.kd_lr, momentum=hp.kd_momentum,
                              weight_decay=hp.kd_weight_decay)
        gen = ctx.rng("kd", state["epoch"])
        total, steps = 0.0, 0
        for idx in self._kd_batches(int(pool_x.shape[0]), gen):
            x = self.augment(pool_x[idx].float(), gen)
            xin = self.kd_inputs(ctx, x, nets, state, mean, std, gen)
            with torch.no_grad():
                t = self.ensemble_logits(nets, xin, state)
            loss = kldiv(student(xin), t, self.kd_temperature())
            descend(opt, loss, clip=(student.parameters(), hp.kd_clip) if hp.kd_clip is not None else None)
            total += float(loss.detach())
            steps += 1
        return get_params(student), total / max(steps, 1)

    def _kd_batches(self, n: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
        """One pass over the pool in a random order (``kd_steps`` None, the reference), else
        exactly ``kd_steps`` batches: a pass cut short, or passes over fresh permutations."""
        steps = self.hp.kd_steps
        done = 0
        while True:
            for idx in batches(n, self.hp.kd_batch, gen):
                if steps is not None and done >= steps:
                    return
                yield idx
                done += 1
            if steps is None or done >= steps:
                return

    def kd_temperature(self) -> float:
        return self.hp.kd_T

    def after_synthesis(self, ctx: NodeContext, state: State, nets: list[torch.nn.Module], pool_x: torch.Tensor,
                        pool_y: torch.Tensor, shape: list[int]) -> State:
        """Hook for Co-Boosting's ensemble re-weighting (DENSE: nothing)."""
        return state

    def server_epoch(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        state = dict(state)
        if inbox:  # round 1: the clients' one-shot uploads
            state["teacher_archs"] = [read_arch(str(e.msg.meta["arch"])) for e in sorted(inbox, key=lambda e: e.src)]
            state["teachers"] = [dict(e.msg.tensors) for e in sorted(inbox, key=lambda e: e.src)]
            state = self.init_teachers(state)
        if not state["teachers"]:
            return state, Outbox()
        shape = list(state["teacher_archs"][0]["input_shape"])
        nets = self.teachers(state)
        student = ctx.model
        student.load_state_dict(state["params"])
        x, y = self.synthesize(ctx, state, nets, student, shape)
        pool_x = torch.cat([state["pool_x"].float(), x]) if "pool_x" in state else x
        pool_y = torch.cat([state["pool_y"], y]) if "pool_y" in state else y
        if self.hp.pool_cap is not None and pool_x.shape[0] > self.hp.pool_cap:
            pool_x, pool_y = pool_x[-self.hp.pool_cap:], pool_y[-self.hp.pool_cap:]
        state = self.after_synthesis(ctx, state, nets, pool_x, pool_y, shape)
        params, kd_loss = self.distill_epoch(ctx, state, nets, pool_x, shape)
        with torch.no_grad():  # diagnostics on the newest batch (measurement only)
            mean, std = self._stats(ctx, shape)
            xn = normalise(x, mean, std)
            t_pred = self.ensemble_logits(nets, xn, state).argmax(1)
            s_pred = predict_logits(student, params, xn).argmax(1)
        state.update({"params": params, "pool_x": pool_x.to(torch.float16), "pool_y": pool_y,
                      "epoch": state["epoch"] + 1, "kd_loss": kd_loss,
                      "synth_match": float((t_pred == y).float().mean()),
                      "agree": float((s_pred == t_pred).float().mean())})
        return state, Outbox()

    def init_teachers(self, state: State) -> State:
        return state

    # -- measurement -------------------------------------------------------------------
    def round_metrics(self, server_state: State) -> dict[str, float]:
        out = {f"{self.name}/pool": float(server_state["pool_x"].shape[0]) if "pool_x" in server_state else 0.0}
        for key in ("kd_loss", "synth_match", "agree"):
            if key in server_state:
                out[f"{self.name}/{key}"] = float(server_state[key])
        return out

    def node_metrics(self, ctx: NodeContext, state: State) -> dict[str, float]:
        if ctx.node != SERVER or not self.hp.eval_reference or not self.hp.eval_targets or not state.get("teachers"):
            return {}
        fed = federation_of_config(self.hp.eval_reference)
        nets = self.teachers(state)
        out: dict[str, float] = {}
        with torch.no_grad():
            for t in self.hp.eval_targets:
                d = fed.nodes[t]
                if int(d.test_y.numel()) == 0:
                    continue
                logits = predict_logits(ctx.model, state["params"], d.test_x)
                out[f"{self.name}/c{t}/acc"] = float((logits.argmax(1) == d.test_y).float().mean())
                ens = self.ensemble_logits(nets, d.test_x, state)
                out[f"{self.name}/c{t}/ensemble_acc"] = float((ens.argmax(1) == d.test_y).float().mean())
        return out
