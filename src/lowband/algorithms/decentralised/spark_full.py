"""SPARK's ``update = "full"`` (beyond the paper, docs/algorithms/spark.md reading 10): ``P``
compresses the kernel only; the update is NTK-DFL's full ``dw = -(lr_r/N) J^T R``.

The requester picks ``tau`` on the evolved predictions and sends each member its slice
``R_m`` of the residual (``residual``, ``n_m x C`` floats); every member answers
``J(X_m; w_bar_i)^T R_m`` (``grad``, one backward pass, ``d`` floats); the requester applies
``-(lr_r/N) sum_m`` of them (``apply``) through the method's momentum. One more round trip
than Algorithm 1; weights travel in full and leave ``w0 + Range(P)``.
"""

from __future__ import annotations

from functools import partial

import torch

from lowband.algorithms.base import Envelope, NodeContext, Outbox, State, Step
from lowband.algorithms.decentralised import ntk
from lowband.algorithms.decentralised.kernel_round import Part, Pooled
from lowband.comm.message import Message


class FullUpdate(Part):
    """The kernel round's finish for ``update = "full"``: residual slices out, ``J_m^T R_m`` back."""

    second_trip = True

    def after_evolution(self, ctx: NodeContext, state: State, pool: Pooled) -> tuple[State, Outbox]:
        """Pick tau on the evolved predictions and send each member its slice of ``R``; the
        own slice stays here."""
        hp = self.hp
        tau = hp.taus[0] if len(hp.taus) == 1 else min(
            hp.taus, key=lambda t: ntk.cross_entropy_soft(pool.fs[t], pool.y_hard))
        parts = torch.split(pool.rs[tau], pool.sizes)
        out = Outbox()
        for src, part in zip(pool.members, parts[1:]):
            out.send(src, Message("residual", {"r": part.contiguous()}))
        new = dict(state)
        new["own_residual"] = parts[0].contiguous()
        new["pending"] = {"n": pool.n, "tau": int(tau)}
        return new, out

    def steps(self, tag: str, responders: list[int], requesters: list[int], group: frozenset,
              last: bool) -> list[Step]:
        """The members' ``grad``, then the requesters' ``apply``."""
        return [Step(f"grad{tag}", responders, partial(self.grad, group=group, last=last)),
                Step(f"apply{tag}", requesters, self.apply)]

    def grad(self, ctx: NodeContext, state: State, inbox: list[Envelope], *, group: frozenset,
             last: bool) -> tuple[State, Outbox]:
        """Member side: ``J(X_m; w_bar_i)^T R_m`` (one backward pass) for every requester i of
        this group that sent a residual; ``d`` floats back."""
        new = dict(state)
        out = Outbox()
        ctx.model.eval()
        asks = [(e.src, e.msg.tensors["r"]) for e in inbox if e.msg.kind == "residual"]
        if asks or ctx.node in group:
            x, _ = self.alg.ops.sample(ctx)
            names = self.alg.trainable(ctx)
            for src, r in sorted(asks, key=lambda a: a[0]):
                w = state["requests"][src]
                g = ntk.jt_r(ctx.model, w, x, r)
                out.send(src, Message("grad", {k: g[k] for k in names}))
            if ctx.node in group:
                g = ntk.jt_r(ctx.model, state["wbar"], x, state["own_residual"])
                new["own_grad"] = {k: g[k] for k in names}
                new.pop("own_residual", None)
        if last:
            new["requests"] = {}
        return new, out

    def apply(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """Requester side: ``dw = -(lr/N) sum_m J_m^T R_m``, then the method's step."""
        pend = state["pending"]
        names = self.alg.trainable(ctx)
        total = {k: state["own_grad"][k].clone() for k in names}
        for e in inbox:
            if e.msg.kind == "grad":
                for k in names:
                    total[k] += e.msg.tensors[k]
        scale = -(self.alg.lr_at(ctx.round) / pend["n"])
        delta = {k: scale * total[k] for k in names}
        new = self.alg.next_state(ctx, state, delta, pend["tau"])
        new.pop("own_grad", None)
        new.pop("pending", None)
        return new, Outbox()
