"""SPARK (Xia, "Stage-wise Projected NTK and Accelerated Regularization"): Algorithms 1 and 2
of papers/spark.txt, as read in specs/ntk_dfl_spark.md and docs/algorithms/spark.md.

SPARK runs NTK-DFL's round (:class:`~lowband.algorithms.decentralised.ntk_dfl.KernelDFL`:
share, request, reply, update, commit, in requester groups or in sequential order) and
:class:`Spark` overrides the round's hooks where the paper differs. The maths is shared with
NTK-DFL: projections, kernels, the evolution and alg. 2's schedule in
:mod:`~lowband.algorithms.decentralised.ntk`, the caches in
:mod:`~lowband.algorithms.decentralised.ntk_cache`.

Algorithm 1, round k on node i, line by line, and the method of :class:`Spark` that does it:

- line 1, ``v_i <- 0`` (and ``theta_i <- 0``, below): ``init_node``.
- lines 4-5, ``J~ = J P`` (eq. 2-3): ``P`` in R^{d x k} with entries N(0, 1/k), drawn per
  layer from (seed, layer name), fixed, never sent (``_projection``); ``J`` is taken at the
  requester's average ``w_bar_i`` (reading 1): ``jacobians`` (``X P1`` cached: ``_xp``).
- line 6, ``z_i = f(X_i; w_i)`` at the node's own pre-averaging weights: ``own_logits``.
- line 7, send ``{J~_i, z_i}``: ``jacobian_message`` (``n_j x C x k``, really encoded) and
  ``reply_extras`` (``z`` with the logits reply).
- lines 11-12, ``J~_agg = [J~_i; J~_j ...]`` (eq. 5) and ``K = J~_agg J~_agg^T`` (eq. 6, read
  as NTK-DFL's trace kernel ``(1/C) sum_c``, N x N): ``kernel``.
- line 13, ``Y_tgt = DistillTarget(k, ...)``, algorithm 2: ``targets``.
- line 14, ``KernelDescent(K, Y_tgt)`` (eq. 14-15): NTK-DFL's ``update`` (``ntk.evolve_ce``).
- line 15, ``BackProj`` (eq. 16-17), ``dtheta = -(lr/N) J~^T R`` and ``dw = P dtheta``:
  ``weight_update``.
- lines 16-17, ``v <- mu v + dw`` and ``w <- w_bar + mu v + dw`` (eq. 12-13), after the
  averaging: ``next_state``, then ``commit``.

Algorithm 2 (``targets``): rounds ``<= R_warm`` use the hard labels (lines 1-2); afterwards
``p = (k - R_warm) / (R - R_warm)``, ``alpha`` cosine-annealed from ``alpha_init`` to
``alpha_final`` and ``T`` linear from ``temp_init`` to ``temp_final`` (lines 4-6, eq. 7-9:
``ntk.distill_schedule``, ``R = distill_rounds``); ``z_agg`` stacks the members' ``z`` like
the kernel's rows (line 8) and ``Y_target = alpha Y_hard + (1 - alpha) softmax(z_agg / T)``
(lines 9-10, eq. 10-11: ``ntk.distill_target``) replaces ``Y`` in the evolution and in ``R``.

Subspace coordinates (eq. 16-17): with a fixed ``P`` and the shared initialisation ``w0``
every weight vector stays ``w0 + P theta``, so nodes exchange the k coordinates ``theta``
(``share_message``, ``average``: ``theta_bar`` is the Jacobian request, ``request_weights``
lifts it), the update ``dtheta`` lives in the subspace and ``commit`` lifts ``theta``. The
momentum buffer ``v`` (k floats) is the node's own: it persists across rounds and is never
averaged or sent. ``projection_layout`` picks the reading of eq. 3: ``sum`` (default: the
blocks stacked into one ``d x k`` ``P``) or the blocks concatenated per weight tensor / per
module (``tensor`` / ``module``: block-diagonal ``P``, k coordinates per block, a block of at
most k entries kept whole).

Beyond the paper (docs/algorithms/spark.md):

- ``projection = "kron"``: a Kronecker-structured ``P`` per weight matrix (``kron_terms``).
- ``update = "full"`` (reading 10): ``P`` serves the kernel only. ``after_evolution`` picks
  ``tau`` on the evolved predictions and sends each member its slice ``R_m`` of the residual;
  the members answer ``J(X_m; w_bar_i)^T R_m`` (``grad``) and the requester applies
  ``-(lr_r/N) sum_m`` of them (``apply``; ``second_trip_steps`` adds both steps). Weights
  travel in full and are not confined to ``w0 + Range(P)``.
- ``sample_fraction`` (figure 4): every member uses a random fraction of its samples each
  round (``sample``); ``comm.by_kind = {jacobian = "fp16"}`` (or ``"int8"``) quantises the
  projected Jacobians on the wire.
- Memory: ``num_groups`` sizes the requester groups from ``max_inflight_mb`` (SPARK at the
  paper's size moves 12 GB of projected Jacobians per round). The weight-independent product
  ``X_j P1`` (Gaussian ``P`` with the MLP) is computed once per node and run and kept across
  rounds and groups (``xp_cache``: RAM up to ``xp_cache_mb``, then memory-mapped files in the
  run folder's ``scratch/`` up to ``xp_cache_disk_mb``; float32 by default, so results are
  identical with or without it); so is the lift ``w0 + P theta_bar_i`` every responder of
  requester i computes (``LiftCache``, per round). Neither is state: a resumed run rebuilds
  them.
- ``projection = "none"``: every hook falls back to NTK-DFL's (full, declared Jacobians),
  with distillation and momentum in weight space.

Table 4's variants are configurations: A = ``distill = false, momentum = 0``; B =
``momentum = 0``; C = ``distill = false``; SPARK = the defaults. ``ntk_dfl`` accepts the same
switches, off by default: a ``ntk_dfl`` configuration that turns one on runs these hooks
under NTK-DFL's name and defaults (:class:`NTKDFLWithSwitches`).

The values of alg. 2's schedule are not in the paper. The spec's (R_warm = 3,
alpha 1.0 -> 0.3, T 1 -> 3) make SPARK unlearn at paper size from round 17 (77.8% -> 48.0%
at round 30); the defaults are the sweep's, which the spec asks for (alpha 1.0 -> 0.7, T = 1;
R_warm = 3): the same run holds and ends at round 30 above the spec's best. See
docs/algorithms/spark.md.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Literal, Optional

import torch
from pydantic import Field

from lowband.algorithms.base import Envelope, NodeContext, Outbox, Params, State, Step, register
from lowband.algorithms.decentralised import ntk
from lowband.algorithms.decentralised.ntk_cache import LiftCache, XPCache
from lowband.algorithms.decentralised.ntk_dfl import NTKDFL, KernelDFL, KernelDFLHP, Pooled
from lowband.comm.message import Message
from lowband.topology import RoundPlan


class SparkHP(KernelDFLHP):
    """SPARK's defaults for the switches :class:`KernelDFLHP` declares: the paper's projection
    (k = 1000), alg. 2's distillation (the sweep's schedule), Nesterov momentum 0.9, and the
    candidate loss on the evolved predictions."""

    projection: Literal["none", "gaussian", "kron"] = Field(
        "gaussian", description="gaussian = SPARK's P ~ N(0, 1/k) per layer; kron = Kronecker-structured P "
        "(beyond the paper); none = NTK-DFL's full Jacobians")
    k: int = Field(1000, ge=1, description="projection dimension k (paper: 1000)")
    distill: bool = Field(True, description="stage-wise annealed distillation targets (alg. 2)")
    momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum mu (paper: 0.9; 0 = off)")
    alpha_final: float = Field(
        0.7, ge=0, le=1, description="mixing weight of the hard labels at round R (the paper gives none; the "
        "spec's 0.3 unlearns at paper size from round 17, 0.7 with temp_final 1 does not: docs/algorithms/spark.md)")
    temp_final: float = Field(
        1.0, gt=0, description="distillation temperature at round R (the spec's 3.0 with alpha_final 0.3 "
        "unlearns at paper size; see alpha_final)")
    tau_select: Literal["true", "evolved", "linear"] = Field(
        "evolved", description="candidate loss: evolved predictions f_tau (paper: argmin_t L(f_t)), "
        "linearised f_0 + Jt dtheta, or (projection none only) the true network")


def switched_on(hp: KernelDFLHP) -> bool:
    """One of SPARK's switches is on: a projection, distillation, momentum or data sampling
    (``update`` and the projection's knobs need a projection, the schedule needs ``distill``)."""
    return hp.projection != "none" or hp.distill or hp.momentum > 0 or hp.sample_fraction < 1.0


@register
class Spark(KernelDFL):
    """SPARK: projected NTK-DFL with annealed distillation and Nesterov momentum (module
    docstring: which method is which line of Algorithms 1 and 2)."""

    name = "spark"
    paper = "Xia, SPARK: Stage-wise Projected NTK and Accelerated Regularization (2025)"
    Hyperparams = SparkHP
    #: two worker processes were measured 1.35x slower per round than one process with two
    #: threads (benchmarks/suite.py, 300-node proxy: 144.9 s vs 107.4 s), so "auto" stays serial
    auto_workers = False
    #: update = "full" sends each member its slice of the residual
    unaligned_kinds = {**KernelDFL.unaligned_kinds, "residual": ("peer",)}

    #: set by the engine: <run folder>/scratch (None when the run writes no folder)
    scratch_root: Optional[str] = None
    _xp_cache: Optional[XPCache] = None
    _lifts: Optional[LiftCache] = None

    # -- the switches ------------------------------------------------------------------
    @property
    def projected(self) -> bool:
        """Jacobians travel projected (``J P``); without a projection, NTK-DFL's declared ones."""
        return self.hp.projection != "none"

    @property
    def coords(self) -> bool:
        """Weights live in ``w0 + Range(P)`` and travel as k coordinates ``theta``."""
        return self.projected and self.hp.update == "subspace"

    @property
    def second_trip(self) -> bool:
        """``update = "full"``: the update needs the members' ``J_m^T R_m``."""
        return self.projected and self.hp.update == "full"

    # -- P (eq. 2-3): fixed, drawn from the seed by every node, never sent ---------------
    def _projection(self, ctx: NodeContext) -> ntk.Projection:
        w0 = ctx.init_params()
        names = self._trainable(ctx)
        seed = ctx.seed if self.hp.projection_seed is None else self.hp.projection_seed
        return ntk.cached_projection({n: w0[n] for n in names}, self.hp.k, self.hp.projection, seed,
                                     self.hp.kron_terms, self.hp.projection_layout)

    def _proj_key(self, ctx: NodeContext) -> tuple:
        w0 = ctx.init_params()
        return (tuple((n, tuple(w0[n].shape)) for n in self._trainable(ctx)), self.hp.k, self.hp.projection,
                ctx.seed if self.hp.projection_seed is None else self.hp.projection_seed, self.hp.kron_terms,
                self.hp.projection_layout)

    def _weights_of(self, ctx: NodeContext, theta: torch.Tensor, shared: bool = False) -> Params:
        """``w0 + P theta`` (buffers, if any, from ``w0``). ``shared``: from the round's
        :class:`~lowband.algorithms.decentralised.ntk_cache.LiftCache` (the same bytes; the
        dict is shared, read-only), for ``theta_bar`` that every responder lifts."""
        def lift(t: torch.Tensor) -> Params:
            w0 = ctx.init_params()
            delta = self._projection(ctx).lift(t)
            return {n: (v + delta[n]) if n in delta else v for n, v in w0.items()}

        if not shared:
            return lift(theta)
        if self._lifts is None:
            self._lifts = LiftCache()
        return self._lifts.get(ctx.round, self._proj_key(ctx), theta, lift)

    # -- alg. 1 line 1 -------------------------------------------------------------------
    def init_node(self, ctx: NodeContext) -> State:
        """``v_i <- 0``; with coordinates ``theta_i <- 0`` (``w_i = w0``)."""
        st = super().init_node(ctx)
        proj = self._projection(ctx) if self.coords else None
        if proj is not None:
            st["theta"] = torch.zeros(proj.dim, device=proj.device)
        if self.hp.momentum > 0:
            st["v"] = torch.zeros(proj.dim, device=proj.device) if proj is not None else {
                n: torch.zeros_like(st["params"][n]) for n in self._trainable(ctx)}
        return st

    # -- step 1: coordinates out; alg. 1 line 6 ------------------------------------------
    def share_message(self, ctx: NodeContext, state: State) -> Message:
        """The k coordinates ``theta_i`` instead of the weights."""
        if not self.coords:
            return super().share_message(ctx, state)
        return Message("coords", {"theta": state["theta"]})

    def own_logits(self, ctx: NodeContext, state: State) -> Optional[torch.Tensor]:
        """Alg. 1 line 6: ``z_i = f(X_i; w_i)`` on this round's rows, at the node's own
        (pre-averaging) weights, for the neighbours' distillation targets."""
        if not self.hp.distill:
            return None
        ctx.model.eval()
        x, _ = self.sample(ctx)
        return ntk.logits(ctx.model, state["params"], x)

    # -- step 2: theta_bar ------------------------------------------------------------------
    def average(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Message]:
        """``theta_bar_i`` (the mean over the closed neighbourhood), its lift ``w_bar_i``, and
        ``theta_bar_i`` as the Jacobian request (k floats)."""
        if not self.coords:
            return super().average(ctx, state, inbox)
        thetas = [state["theta"]] + [e.msg.tensors["theta"] for e in inbox if e.msg.kind == "coords"]
        tbar = torch.stack(thetas).mean(0)
        return {"thetabar": tbar, "wbar": self._weights_of(ctx, tbar, shared=True)}, Message("request", {"theta": tbar})

    # -- step 3: alg. 1 lines 4-5 and 7 -----------------------------------------------------
    def request_weights(self, ctx: NodeContext, request: dict[str, torch.Tensor]) -> Params:
        """``w_bar_i = w0 + P theta_bar_i`` (lifted once per round for all its responders)."""
        if not self.coords:
            return super().request_weights(ctx, request)
        return self._weights_of(ctx, request["theta"], shared=True)

    def _sample_idx(self, ctx: NodeContext) -> Optional[torch.Tensor]:
        """The rows of the node's training data used this round (None: all of them)."""
        f = self.hp.sample_fraction
        n = int(ctx.data.train_y.shape[0])
        if f >= 1.0 or n == 0:
            return None
        m = max(1, int(math.ceil(f * n)))
        return torch.randperm(n, generator=ctx.rng("sample"))[:m].sort().values

    def sample(self, ctx: NodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's training data of the node: a random ``sample_fraction`` of its rows
        (figure 4; drawn from (seed, round, node)), all of them by default."""
        x, y = ctx.data.train_x, ctx.data.train_y
        idx = self._sample_idx(ctx)
        return (x, y) if idx is None else (x[idx], y[idx])

    def jacobians(self, ctx: NodeContext, x: torch.Tensor, weights: list[Params]) -> list[Optional[torch.Tensor]]:
        """Alg. 1 lines 4-5: ``J~ = J(X_j; w) P`` (``n_j x C x k``) for every requested ``w``;
        the structured products share ``X_j P1`` (:meth:`_xp`)."""
        if not self.projected:
            return super().jacobians(ctx, x, weights)
        proj = self._projection(ctx)
        q = self._xp(ctx, proj) if proj.structured(ctx.model) and proj.has_xp() else None
        return proj.jacobian(ctx.model, x, weights, q=q)

    def jacobian_message(self, ctx: NodeContext, state: State, x: torch.Tensor,
                         jac: Optional[torch.Tensor]) -> Message:
        """Alg. 1 line 7: ``J~`` itself, encoded like any message (codecs apply)."""
        if jac is None:
            return super().jacobian_message(ctx, state, x, jac)
        return Message("jacobian", {"jac": jac})

    def reply_extras(self, state: State) -> dict[str, torch.Tensor]:
        """Alg. 1 line 7: the responder's own logits ``z_j`` travel with its reply."""
        z = state.get("own_z")
        return {} if z is None else {"z": z}

    @property
    def reply_keys(self) -> tuple[str, ...]:
        """With distillation a member's reply counts only with its ``z``."""
        return super().reply_keys + (("z",) if self.hp.distill else ())

    def xp_cache(self) -> XPCache:
        """This run's :class:`XPCache` (budgets from the hyperparameters; files in
        ``scratch_dir``, else the run folder's ``scratch/``)."""
        if self._xp_cache is None:
            folder = self.hp.scratch_dir or self.scratch_root
            self._xp_cache = XPCache(self.hp.xp_cache_mb, self.hp.xp_cache_disk_mb if folder else 0.0, folder,
                                     self.hp.xp_cache_dtype)
        return self._xp_cache

    def _xp(self, ctx: NodeContext, proj: ntk.Projection) -> Any:
        """``X P1`` for this round's rows of the node's data: computed on all its training
        inputs once per run (rows taken when ``sample_fraction < 1``), so a node's numbers do
        not depend on whether its product was cached."""
        q = self.xp_cache().get((ctx.node, self._proj_key(ctx)), ctx.data.train_x, proj.xp)
        idx = self._sample_idx(ctx)
        if idx is None:
            return q
        if isinstance(q, torch.Tensor):
            return q[idx]
        return q[idx.numpy()]

    # -- step 4: alg. 1 lines 11-15 and alg. 2 -----------------------------------------------
    def kernel(self, ctx: NodeContext, state: State, parts: list[dict[str, Any]]) -> tuple[torch.Tensor, Any]:
        """Lines 11-12: ``J~_agg`` stacked (eq. 5) and ``K = (1/C) sum_c J~_c J~_c^T`` (eq. 6);
        the basis of the update is ``J~_agg``."""
        if not self.projected:
            return super().kernel(ctx, state, parts)
        jt = ntk.cat_scratch([m["jac"] for m in parts])  # a reused buffer: used within this step only
        return ntk.projected_kernel(jt), jt

    def targets(self, ctx: NodeContext, y_hard: torch.Tensor, parts: list[dict[str, Any]]) -> torch.Tensor:
        """Line 13, algorithm 2: ``Y_target = alpha Y_hard + (1 - alpha) softmax(z_agg / T)``
        with ``(alpha, T)`` from the stage-wise schedule (hard labels up to ``R_warm``)."""
        hp = self.hp
        if not hp.distill:
            return super().targets(ctx, y_hard, parts)
        z = torch.cat([m["z"] for m in parts])  # line 8: z_agg, stacked like the kernel's rows
        alpha, temp = ntk.distill_schedule(ctx.round, hp.distill_warmup, hp.distill_rounds, hp.alpha_init,
                                           hp.alpha_final, hp.temp_init, hp.temp_final)
        return ntk.distill_target(y_hard, z, alpha, temp)

    def weight_update(self, ctx: NodeContext, state: State, basis: Any, r: torch.Tensor, lr: float, n: int) -> Any:
        """Line 15, eq. 16: ``dtheta = -(lr/N) J~^T R`` (k floats; ``dw = P dtheta``, eq. 17,
        is applied by lifting ``theta``)."""
        if not self.projected:
            return super().weight_update(ctx, state, basis, r, lr, n)
        return -(lr / n) * (r.reshape(1, -1) @ basis.reshape(-1, basis.shape[2])).reshape(-1)

    def linearised(self, ctx: NodeContext, state: State, basis: Any, delta: Any) -> torch.Tensor:
        """``J~ dtheta`` (``tau_select = "linear"``)."""
        if not self.projected:
            return super().linearised(ctx, state, basis, delta)
        return torch.einsum("nck,k->nc", basis, delta)

    # -- lines 16-17: Nesterov momentum after the averaging ----------------------------------
    def next_state(self, ctx: NodeContext, state: State, delta: Any, tau: int) -> State:
        """Eq. 12-13 from the average: ``v <- mu v + dw``, ``w <- w_bar + mu v + dw``
        (``theta``-space with coordinates, else per parameter); ``mu = 0``: ``w_bar + dw``."""
        mu = self.hp.momentum
        step, v = delta, None
        if mu > 0:
            if self.coords:
                v = mu * state["v"] + delta
                step = mu * v + delta
            else:
                names = self._trainable(ctx)
                v = {k: mu * state["v"][k] + delta[k] for k in names}
                step = {k: mu * v[k] + delta[k] for k in names}
        if self.coords:
            new = dict(state)
            new["next_theta"] = state["thetabar"] + step
            new["tau"] = tau
        else:
            new = super().next_state(ctx, state, step, tau)
        if v is not None:
            new["next_v"] = v
        return new

    def commit(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """``w_i = w0 + P theta_i`` with coordinates; the velocity is kept, never sent."""
        if self.coords:
            new: State = {"theta": state["next_theta"]}
            new["params"] = self._weights_of(ctx, new["theta"])
        else:
            new, _ = super().commit(ctx, state, inbox)
        if self.hp.momentum > 0:
            new["v"] = state["next_v"]
        return new, Outbox()

    # -- update = "full" (beyond the paper): the members compute J_m^T R_m --------------------
    def after_evolution(self, ctx: NodeContext, state: State, pool: Pooled) -> tuple[State, Outbox]:
        """``update = "full"``: pick tau on the evolved predictions and send each member its
        slice of ``R`` (``n_m x C`` floats); the own slice stays here."""
        if not self.second_trip:
            return super().after_evolution(ctx, state, pool)
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

    def second_trip_steps(self, tag: str, responders: list[int], requesters: list[int], group: frozenset,
                          last: bool) -> list[Step]:
        """``update = "full"``: the members' ``grad``, then the requesters' ``apply``."""
        if not self.second_trip:
            return []
        return [Step(f"grad{tag}", responders, partial(self.grad, group=group, last=last)),
                Step(f"apply{tag}", requesters, self.apply)]

    def grad(self, ctx: NodeContext, state: State, inbox: list[Envelope], *, group: frozenset,
             last: bool) -> tuple[State, Outbox]:
        """Member side of ``update = "full"``: ``J(X_m; w_bar_i)^T R_m`` (one backward pass)
        for every requester i of this group that sent a residual; ``d`` floats back."""
        new = dict(state)
        out = Outbox()
        ctx.model.eval()
        asks = [(e.src, e.msg.tensors["r"]) for e in inbox if e.msg.kind == "residual"]
        if asks or ctx.node in group:
            x, _ = self.sample(ctx)
            names = self._trainable(ctx)
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
        """Requester side of ``update = "full"``: ``dw = -(lr/N) sum_m J_m^T R_m``."""
        pend = state["pending"]
        names = self._trainable(ctx)
        total = {k: state["own_grad"][k].clone() for k in names}
        for e in inbox:
            if e.msg.kind == "grad":
                for k in names:
                    total[k] += e.msg.tensors[k]
        scale = -(self.lr_at(ctx.round) / pend["n"])
        delta = {k: scale * total[k] for k in names}
        new = self.next_state(ctx, state, delta, pend["tau"])
        new.pop("own_grad", None)
        new.pop("pending", None)
        return new, Outbox()

    # -- memory ---------------------------------------------------------------------------------
    def num_groups(self, plan: RoundPlan) -> int:
        """``reply_groups``, else as many groups as keep one group's projected Jacobians
        within ``max_inflight_mb``."""
        if self.hp.reply_groups or not self.projected:
            return super().num_groups(plan)
        n = len(plan.participants)
        edges = sum(len(v) for v in plan.neighbors.values())
        # an estimate: ~200 samples x 10 classes per reply (the paper's setting), as many
        # columns as coordinates (a concatenated layout: up to 3 k, e.g. 2.11 k for the MLP)
        width = self.hp.k * (1 if self.hp.projection_layout == "sum" else 3)
        est = edges * 200 * 10 * width * 4 * self.hp.sample_fraction
        return max(1, min(n, int(math.ceil(est / (self.hp.max_inflight_mb * 1e6)))))


class NTKDFLWithSwitches(Spark, NTKDFL):
    """``ntk_dfl`` with one of SPARK's switches on (:func:`switched_on`): SPARK's hooks under
    NTK-DFL's name, hyperparameters (defaults) and settings. ``NTKDFL(hp)`` builds it; the
    configurations and saved runs of ``ntk_dfl`` that set a switch keep their meaning."""

    name = NTKDFL.name
    paper = NTKDFL.paper
    Hyperparams = NTKDFL.Hyperparams
    auto_workers = NTKDFL.auto_workers
