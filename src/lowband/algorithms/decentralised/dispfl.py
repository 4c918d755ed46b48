"""DisPFL (Dai et al., "DisPFL: Towards Communication-Efficient Personalized Federated
Learning via Decentralized Sparse Training", ICML 2022), as the NTK-DFL reference code
runs it (specs/ntk_dfl_spark.md, baselines).

Each node keeps its own sparse mask (ERK, density 0.5 over all parameters, drawn per
node) and a weight vector that is zero outside it. One round:

1. ``train_send``: SGD on the node's own data with the mask applied after every step
   (lr 0.1 * 0.998^(r-1), batch 10, 10 epochs, weight decay 5e-4, gradient-norm clip 10);
   then the mask evolves: in each sparse layer the ``ceil(q * kept)`` smallest-magnitude
   kept weights are pruned, with ``q = 0.5/2 (1 + cos(pi (r-1) / R))`` (cosine-annealed), and
   as many positions are regrown uniformly at random among the unkept ones (the reference
   config's ``dis_gradient_check``: random regrowth); regrown weights start at zero.
   The node sends its neighbours a *sparse* message: for each sparse layer a packed bitmap
   of the mask (``ceil(numel / 8)`` bytes) and the values at the kept positions; dense
   layers (ERK makes the biases and the small head dense) travel as they are.
2. ``average``: every coordinate is averaged over the closed neighbourhood members whose
   masks keep it, and the node's own mask is applied (DisPFL's ``_aggregate_func``).

Neighbours: DisPFL draws its own random neighbour set per node and round; here the
round's graph (a fresh 5-regular graph) is used, as for every other baseline. The order
"train, prune/regrow, send, aggregate" is DisPFL's "aggregate, train, prune/regrow" with
the round boundary moved (the same sequence of operations).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field

from lowband.algorithms.base import Envelope, NodeContext, Outbox, State, register
from lowband.algorithms.common import LocalSGD
from lowband.algorithms.decentralised.gossip import GossipAlgorithm
from lowband.comm.message import Message
from lowband.train import Params, decayed_lr
from lowband.train.steps import masked_sgd_train


class DisPFLHP(LocalSGD):
    lr: float = Field(0.1, gt=0, description="local learning rate")
    lr_decay: float = Field(0.998, gt=0, le=1, description="lr_r = lr * lr_decay**(r-1)")
    batch_size: int = Field(10, ge=1, description="local minibatch size")
    local_epochs: int = Field(10, ge=0, description="local epochs per round")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(5e-4, ge=0, description="L2 weight decay")
    grad_clip: float | None = Field(10.0, gt=0, description="gradient-norm clip")
    density: float = Field(0.5, gt=0, le=1, description="ERK density of the masks (over all parameters)")
    erk_power: float = Field(1.0, gt=0, description="ERK power scale")
    anneal_factor: float = Field(0.5, ge=0, le=1, description="prune rate q_r = anneal/2 (1 + cos(pi (r-1) / R))")
    anneal_rounds: int = Field(200, ge=1, description="R of the cosine annealing (the run's length)")


def erk_densities(shapes: dict[str, tuple[int, ...]], density: float, power: float = 1.0) -> dict[str, float]:
    """Per-layer densities of the Erdos-Renyi-Kernel rule (RigL / DisPFL): layer density
    ``eps * (sum(shape) / prod(shape))**power``, layers that would exceed 1 made dense and
    ``eps`` re-solved, so that the overall density is ``density``."""
    dense: set[str] = set()
    while True:
        rhs, div, raw = 0.0, 0.0, {}
        for n, s in shapes.items():
            numel = math.prod(s)
            if n in dense:
                rhs -= numel * (1 - density)
            else:
                rhs += numel * density
                raw[n] = (sum(s) / numel) ** power
                div += raw[n] * numel
        if not raw:
            return {n: 1.0 for n in shapes}
        eps = rhs / div
        top = max(raw.values())
        if top * eps > 1:
            dense |= {n for n, r in raw.items() if r == top}
        else:
            return {n: 1.0 if n in dense else eps * raw[n] for n in shapes}


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask as a packed bitmap (uint8, ``ceil(numel / 8)`` bytes)."""
    return torch.from_numpy(np.packbits(mask.reshape(-1).cpu().numpy().astype(np.uint8)))


def unpack_mask(bits: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    return torch.from_numpy(np.unpackbits(bits.cpu().numpy(), count=n).astype(bool)).reshape(shape)


@register
class DisPFL(GossipAlgorithm):
    """Sparse personalised models, masked neighbourhood averaging, prune and regrow."""

    name = "dispfl"
    paper = "Dai et al., DisPFL: Communication-Efficient Personalized FL via Decentralized Sparse Training, ICML 2022"
    Hyperparams = DisPFLHP
    #: the values under a mask that is pruned and regrown every round
    unaligned_kinds = {"sparse_weights": ("peer",)}

    def init_node(self, ctx: NodeContext) -> State:
        w = ctx.init_params()
        names = [n for n, _ in ctx.model.named_parameters()]
        dens = erk_densities({n: tuple(w[n].shape) for n in names}, self.hp.density, self.hp.erk_power)
        masks = {}
        g = ctx.rng("mask-init")
        for n in names:
            if dens[n] >= 1.0:
                continue
            numel = w[n].numel()
            keep = int(dens[n] * numel)
            m = torch.zeros(numel, dtype=torch.bool, device=w[n].device)
            m[torch.randperm(numel, generator=g)[:keep]] = True
            masks[n] = m.view(w[n].shape)
            w[n] = w[n] * masks[n]
        return {"params": w, "masks": masks}

    def prune_rate(self, round: int) -> float:
        """``anneal/2 (1 + cos(pi t / R))`` with ``t = round - 1`` (DisPFL counts rounds from 0)."""
        return self.hp.anneal_factor / 2 * (1 + math.cos((round - 1) * math.pi / self.hp.anneal_rounds))

    def _train(self, ctx: NodeContext, params: Params, masks: dict[str, torch.Tensor]) -> Params:
        hp = self.hp
        return masked_sgd_train(ctx.model, params, ctx.data.train_x, ctx.data.train_y, masks,
                                epochs=hp.local_epochs, batch_size=hp.batch_size,
                                lr=decayed_lr(hp.lr, hp.lr_decay, ctx.round), gen=ctx.rng("local"),
                                momentum=hp.momentum, weight_decay=hp.weight_decay, grad_clip=hp.grad_clip)

    def _evolve_masks(self, ctx: NodeContext, params: Params, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        q = self.prune_rate(ctx.round)
        g = ctx.rng("regrow")
        out = {}
        for k in sorted(masks):
            m = masks[k].reshape(-1).clone()
            kept = int(m.sum())
            r = int(math.ceil(q * kept))
            if r > 0:
                mag = torch.where(m, params[k].reshape(-1).abs(), torch.full_like(m, float("inf"), dtype=torch.float32))
                drop = torch.argsort(mag, stable=True)[:r]
                m[drop] = False
                free = torch.nonzero(~m).reshape(-1)
                grow = free[torch.randperm(free.numel(), generator=g)[:r]]
                m[grow] = True
            out[k] = m.view(masks[k].shape)
        return out

    def train_send(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        masks = state["masks"]
        params = self._train(ctx, state["params"], masks)
        masks = self._evolve_masks(ctx, params, masks)
        params = {k: (v * masks[k]) if k in masks else v for k, v in params.items()}
        tensors: dict[str, torch.Tensor] = {}
        for k, v in params.items():
            if k in masks:
                tensors[f"{k}::mask"] = pack_mask(masks[k])
                tensors[f"{k}::vals"] = v[masks[k]]
            else:
                tensors[k] = v
        out = Outbox().broadcast(ctx.neighbors, Message("sparse_weights", tensors))
        return {"params": params, "masks": masks}, out

    def average(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        own, masks = state["params"], state["masks"]
        total = {k: v.clone().to(torch.float32) for k, v in own.items()}
        count = {k: masks[k].to(torch.float32) for k in masks}
        dense_n = 1
        for e in inbox:
            t = e.msg.tensors
            dense_n += 1
            for k, v in own.items():
                if k in masks:
                    m = unpack_mask(t[f"{k}::mask"], tuple(v.shape)).to(v.device)
                    full = torch.zeros(v.numel(), device=v.device)
                    full[m.reshape(-1)] = t[f"{k}::vals"]
                    total[k] += full.view(v.shape)
                    count[k] += m.to(torch.float32)
                else:
                    total[k] += t[k]
        new = {}
        for k, v in own.items():
            if k in masks:
                avg = torch.where(count[k] > 0, total[k] / count[k].clamp(min=1), torch.zeros_like(total[k]))
                new[k] = (avg * masks[k]).to(v.dtype)
            else:
                new[k] = (total[k] / dense_n).to(v.dtype)
        return {**state, "params": new}, Outbox()
