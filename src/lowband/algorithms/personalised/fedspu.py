"""FedSPU: stochastic parameter update (Niu, Dong and Qin, 2025), as the spec reads it.

Each client keeps a full personal model. Every round the server picks, for each sampled
client, a random fraction r of the output units of every layer (rows of a Linear weight,
filters of a Conv weight, with their bias entries; a module's parameters whose first
dimension matches its weight's are sliced alike). The classifier ``head`` is always sent
whole (every class must stay trainable). The server sends the global values of the
picked units and their int32 indices; the client writes them into its personal model,
trains with every other unit frozen (their gradients zeroed), and returns the trained
picked units (the server remembers which it picked, so no indices go up). The server
averages each unit over the clients that trained it, weighted by sample counts; units
nobody trained stay unchanged.

r: ``fractions`` lists one r per client group, client i in group i mod len(fractions).
The default (0.2, 0.4, 0.6, 0.8, 1.0) is the original code's heterogeneous client
groups; ``fractions = [0.5]`` gives one r for all. Record the value used. The ``personal``
protocol evaluates each client's personal model (the initial model if never sampled).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, field_validator
from torch import nn

from lowband.algorithms.personalised._pfl import is_head, train_kwargs
from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, Params, State, register
from lowband.algorithms.server.fedavg import FedAvg, FedAvgClientHP
from lowband.comm.message import Message
from lowband.train import cross_entropy, sgd_train

IDX = "__units"


class FedSPUHP(FedAvgClientHP):
    fractions: list[float] = Field([0.2, 0.4, 0.6, 0.8, 1.0],
                                   description="r per client group (client i uses fractions[i % len])")

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < r <= 1 for r in v):
            raise ValueError("must be a non-empty list of fractions in (0, 1]")
        return v


def unit_groups(model: nn.Module) -> dict[str, list[str]]:
    """module name -> the parameter names sliced by its output units (head excluded)."""
    groups: dict[str, list[str]] = {}
    shapes = {n: p.shape for n, p in model.named_parameters()}
    for n in shapes:
        if is_head(n):
            continue
        mod = n.rsplit(".", 1)[0]
        w = f"{mod}.weight"
        if w not in shapes or len(shapes[w]) == 0:
            continue
        if len(shapes[n]) >= 1 and shapes[n][0] == shapes[w][0]:
            groups.setdefault(mod, []).append(n)
    return groups


@register
class FedSPU(FedAvg):
    """Random per-client sub-models of output units, trained with the rest frozen."""

    name = "fedspu"
    paper = "Niu, Dong and Qin, FedSPU: Personalized Federated Learning for Resource-Constrained Devices with Stochastic Parameter Update, 2025"
    Hyperparams = FedSPUHP
    personalized = True
    partial_kinds = frozenset({"weights"})  # sub-models: the selected rows of each layer
    #: a fresh random sub-model (rows of each layer) per client and round, both ways
    unaligned_kinds = {"weights": ("down", "up")}

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def fraction(self, client: int) -> float:
        fr = self.hp.fractions
        return fr[client % len(fr)]

    # -- server ------------------------------------------------------------------------
    def pick(self, ctx: NodeContext, client: int) -> dict[str, torch.Tensor]:
        r = self.fraction(client)
        out = {}
        gen = ctx.rng("spu", client)
        for mod, names in unit_groups(ctx.model).items():
            units = ctx.model.get_parameter(names[0]).shape[0]
            k = max(1, math.ceil(r * units - 1e-9))
            dev = ctx.model.get_parameter(names[0]).device  # drawn on the CPU, used where the model is
            out[mod] = torch.sort(torch.randperm(units, generator=gen)[:k]).values.to(dev)
        return out

    def server_broadcast(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = state["params"]
        groups = unit_groups(ctx.model)
        out = Outbox()
        picks = {}
        for c in ctx.participants:
            sel = self.pick(ctx, c)
            picks[str(c)] = sel
            tensors = {}
            for n, v in glob.items():
                mod = n.rsplit(".", 1)[0]
                if mod in sel and n in groups[mod]:
                    tensors[n] = v[sel[mod]]
                elif is_head(n):
                    tensors[n] = v
            for mod, idx in sel.items():
                tensors[f"{mod}.{IDX}"] = idx.to(torch.int32)
            out.send(c, Message("weights", tensors))
        return {**state, "picks": picks}, out

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = state["params"]
        picks = state.get("picks", {})
        groups = unit_groups(ctx.model)
        new = {k: v.clone() for k, v in glob.items()}
        acc = {k: torch.zeros_like(v, dtype=torch.float32) for k, v in glob.items() if v.is_floating_point()}
        wsum = {k: torch.zeros(v.shape[0] if v.ndim else 1, device=v.device) for k, v in acc.items()}
        for e in inbox:
            w = float(e.msg.meta["num_examples"])
            sel = picks[str(e.src)]
            for n, t in e.msg.tensors.items():
                mod = n.rsplit(".", 1)[0]
                if is_head(n):
                    acc[n] += w * t
                    wsum[n] += w
                elif mod in sel and n in groups[mod]:
                    acc[n].index_add_(0, sel[mod], w * t.to(torch.float32))
                    wsum[n].index_add_(0, sel[mod], torch.full((sel[mod].numel(),), w, device=wsum[n].device))
        for n, a in acc.items():
            hit = wsum[n] > 0
            if not bool(hit.any()):
                continue
            shape = (-1,) + (1,) * (a.ndim - 1)
            avg = a / wsum[n].clamp(min=1e-12).reshape(shape)
            new[n][hit] = avg[hit].to(new[n].dtype)
        return {**{k: v for k, v in state.items() if k != "picks"}, "params": new}, Outbox()

    # -- client ------------------------------------------------------------------------
    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        rx = inbox[0].msg.tensors
        groups = unit_groups(ctx.model)
        sel = {mod: rx[f"{mod}.{IDX}"].to(torch.int64) for mod in groups if f"{mod}.{IDX}" in rx}
        params = {k: v.clone() for k, v in state["params"].items()}
        for mod, idx in sel.items():
            for n in groups[mod]:
                params[n][idx] = rx[n].to(params[n].dtype)
        for n in params:
            if is_head(n) and n in rx:
                params[n] = rx[n].clone()
        masks = {}
        for mod, names in groups.items():
            keep = torch.zeros(params[names[0]].shape[0], dtype=torch.bool, device=params[names[0]].device)
            if mod in sel:
                keep[sel[mod]] = True
            for n in names:
                masks[n] = keep

        def hook(model: nn.Module) -> None:
            for n, p in model.named_parameters():
                if n in masks and p.grad is not None:
                    p.grad[~masks[n]] = 0.0

        trainable = [n for n, _ in ctx.model.named_parameters()
                     if is_head(n) or any(n in names for names in groups.values())]
        out, stats = sgd_train(ctx.model, params, ctx.data.train_x, ctx.data.train_y, gen=ctx.rng("local"),
                              loss_fn=cross_entropy, trainable=trainable, grad_hook=hook, **train_kwargs(ctx))
        up = {}
        for mod, idx in sel.items():
            for n in groups[mod]:
                up[n] = out[n][idx]
        for n in out:
            if is_head(n):
                up[n] = out[n]
        msg = Message("weights", up, meta={"num_examples": ctx.data.n_train})
        return {"params": out}, Outbox().send(SERVER, msg)
