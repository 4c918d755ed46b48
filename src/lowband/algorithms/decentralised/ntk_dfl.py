"""NTK-DFL (Thompson et al., ICML 2025), and the machinery SPARK shares with it.

One round ``r`` (specs/ntk_dfl_spark.md, "NTK-DFL round r"; every step below runs on one
node with its own state, data and inbox):

1. ``share``: node i sends its weights ``w_i`` to its neighbours (SPARK: its subspace
   coordinates ``theta_i``, k floats). With distillation it also computes its own logits
   ``z_i = f(X_i; w_i)`` on its own data (alg. 1 line 6).
2. ``request``: node i averages uniformly over its closed neighbourhood,
   ``w_bar_i = (w_i + sum_j w_j) / (deg + 1)``, keeps it, and sends it to every neighbour
   as a Jacobian request.
3. ``reply``: each neighbour j answers each requester i with the Jacobian of its logits on
   its data at ``w_bar_i`` (``n_j x C x d``; SPARK: ``J P``, ``n_j x C x k``), the logits
   ``f(X_j; w_bar_i)``, its labels and (distillation) ``z_j``. NTK-DFL's full Jacobian is
   a *declared* tensor (628 MB per edge at the paper's size: counted, never built) whose
   equivalent input ``X_j`` travels as an uncounted stand-in; the receiver recomputes the
   declared content ``J(X_j; w_bar_i)`` implicitly. SPARK's messages are really encoded.
4. ``update``: node i stacks the ``N`` samples of its neighbourhood, builds the trace
   kernel ``K = (1/C) sum_c J_c J_c^T`` (``N x N``; closed form for the MLP), evolves
   ``df/dt = -(1/N) K (softmax(f) - Y)`` from ``f_0 = f(X; w_bar_i)`` on ``t_s = s lr_r``
   (RK4), forms ``R_tau = sum_{s<tau} softmax(f_{t_s}) - tau Y`` and
   ``dw_tau = -(lr_r / N) J^T R_tau`` (a backward pass; SPARK: ``-(lr_r/N) Jt^T R``),
   and keeps the candidate ``tau`` with the smallest cross-entropy on the pooled data.
   ``lr_r = lr * exp(-lr_decay * (r - 1))`` (1-based rounds).
5. ``commit``: synchronous: ``w_i <- w_bar_i + dw`` for every node at once (SPARK with
   momentum: ``v <- mu v + dw``, ``theta <- theta_bar + mu v + dw``).

``order = "sequential"`` runs the loop of the reference's ``random_graph*.py`` instead
(Gauss-Seidel; its ``main.py``, which the reference numbers come from, is synchronous): nodes take
their turn in id order, and node i's turn is steps 1-5 with i as the only requester (its
neighbours send i their current weights, already updated ones included; i commits at once).
Same messages per directed edge as a synchronous round; see :meth:`KernelDFL.sequential_steps`.

With a projection and ``update = "full"`` step 4 stops after choosing ``tau`` and sends
each member its slice ``R_m`` of the residual; the members answer with
``J(X_m; w_bar_i)^T R_m`` (``grad``) and the requester applies ``-(lr_r/N) sum_m`` of them
(``apply``): NTK-DFL's update with a projected kernel, weights exchanged in full.

Steps 3 and 4 may be split into groups of requesters (``reply_groups``) so that at most a
fraction of the round's Jacobian messages is in memory at once (SPARK at the paper's size
moves 12 GB of projected Jacobians per round). The split changes nothing in the result
(a test checks it). The weight-independent product ``X_j P1`` (SPARK's Gaussian ``P``
with the MLP) is computed once per node and run and kept across rounds and groups
(:class:`~lowband.algorithms.decentralised.ntk_cache.XPCache`: RAM up to ``xp_cache_mb``,
then memory-mapped files in the run folder's ``scratch/`` up to ``xp_cache_disk_mb``, float32
by default so results are identical with or without it); so is the lift ``w0 + P theta_bar_i``
every responder of requester i computes (``LiftCache``, per round). Neither is state: a
resumed run rebuilds them.

Deliberate choices (docs/algorithms/spark.md): Jacobians at ``w_bar_i`` (reference code);
the candidate loss of ``tau_select = "true"`` evaluates the network at ``w_bar_i + dw`` on
the pooled inputs as the reference does (those inputs are the stand-ins of the declared
Jacobians: the reference's own simplification), ``"evolved"`` uses the evolved
predictions ``f_tau`` and ``"linear"`` the linearised ones ``f_0 + J dw`` (both
protocol-faithful); with the default single candidate ``[100]`` the choice does not
matter. The declared path cannot model a lossy codec's rounding of the Jacobian (the
receiver computes it in float32): figure 4's codecs are measured with SPARK.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Literal, Optional

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from lowband.algorithms.decentralised import ntk
from lowband.algorithms.decentralised.ntk_cache import (  # noqa: F401
    LiftCache, XPCache, keep_freed_heap, sweep_stale_scratch,
)
from lowband.algorithms.base import (
    Algorithm, Envelope, Hyperparams, NodeContext, Outbox, Params, State, Step, register,
)
from lowband.comm.message import DeclaredTensor, Message
from lowband.seeding import np_gen
from lowband.topology import RoundPlan
from lowband.train import weighted_average


class KernelDFLHP(Hyperparams):
    """Hyperparameters shared by NTK-DFL and SPARK (defaults: NTK-DFL's reference code)."""

    lr: float = Field(0.01, gt=0, description="eta: learning rate of the kernel evolution (reference: 0.01)")
    lr_decay: float = Field(0.07, ge=0, description="lr_r = lr * exp(-lr_decay * (r - 1))")
    taus: list[int] = Field(default_factory=lambda: [100], min_length=1,
                            description="candidate evolution steps tau (t = tau * lr_r)")
    tau_select: Literal["true", "evolved", "linear"] = Field(
        "true", description="candidate loss: true network at w_bar + dw on the pooled inputs (reference), "
        "evolved predictions f_tau, or linearised f_0 + J dw")
    ode_substeps: int = Field(0, ge=0, description="RK4 steps per lr interval (0: automatic from lambda_max(K))")
    projection: Literal["none", "gaussian", "kron"] = Field(
        "none", description="none = NTK-DFL (full, declared Jacobians); gaussian = SPARK's P ~ N(0, 1/k); "
        "kron = Kronecker-structured P per weight matrix (beyond the paper)")
    k: int = Field(1000, ge=1, description="projection dimension")
    projection_layout: Literal["sum", "tensor", "module"] = Field(
        "sum", description="how eq. 3's per-layer blocks J_l P_l combine: sum = stacked into one d x k P "
        "(J P = sum_l J_l P_l, k coordinates); tensor / module = concatenated (block-diagonal P, k coordinates "
        "per weight tensor / per module; a tensor / module of at most k entries is kept whole)")
    kron_terms: int = Field(1, ge=1, description="kron only: P = sum of this many Kronecker products / sqrt(terms)")
    projection_seed: Optional[int] = Field(None, description="seed of P (None: the experiment's seed)")
    distill: bool = Field(False, description="stage-wise annealed distillation targets (SPARK alg. 2)")
    distill_warmup: int = Field(3, ge=0, description="R_warm: rounds with hard labels only")
    distill_rounds: int = Field(30, ge=1, description="R of alg. 2 (the schedule's length)")
    alpha_init: float = Field(1.0, ge=0, le=1, description="mixing weight of the hard labels after warm-up")
    alpha_final: float = Field(0.3, ge=0, le=1, description="mixing weight of the hard labels at round R")
    temp_init: float = Field(1.0, gt=0, description="distillation temperature after warm-up")
    temp_final: float = Field(3.0, gt=0, description="distillation temperature at round R")
    momentum: float = Field(0.0, ge=0, lt=1, description="Nesterov momentum mu across rounds (0: off)")
    sample_fraction: float = Field(1.0, gt=0, le=1, description="fraction of its samples each member uses per round")
    reply_groups: int = Field(0, ge=0, description="requester groups per round (0: from max_inflight_mb)")
    max_inflight_mb: float = Field(2000.0, gt=0, description="memory budget of one group's Jacobian messages")
    update: Literal["subspace", "full"] = Field(
        "subspace", description="with a projection: subspace = dw = P dtheta, weights stay in w0 + Range(P) and "
        "nodes exchange k coordinates (paper eq. 16-17); full = P compresses the kernel only, each member "
        "returns J_m^T R_m (d floats) for its slice of the residual, dw = -(lr/N) J^T R as in NTK-DFL "
        "(beyond the paper: one more round trip, full weights exchanged)")
    order: Literal["synchronous", "sequential"] = Field(
        "synchronous", description="synchronous: every node averages and evolves from the round's start state "
        "(the spec); sequential: nodes update one after another in id order, each averaging its neighbours' "
        "current weights, already updated ones included (Gauss-Seidel, the reference's random_graph*.py loop; "
        "its main.py is synchronous)")
    xp_cache_mb: float = Field(
        2000.0, ge=0, description="performance only: RAM budget (MB, per process) of the weight-independent X P "
        "products kept across rounds (SPARK's Gaussian P with the MLP: ~80 MB per node at the paper's size)")
    xp_cache_disk_mb: float = Field(
        32000.0, ge=0, description="performance only: disk budget (MB) for the X P products beyond the RAM "
        "budget, memory-mapped files in scratch_dir (0: none; beyond both budgets X P is recomputed)")
    xp_cache_dtype: Literal["float32", "float16"] = Field(
        "float32", description="storage of the cached X P: float32 = exact (results identical to no cache); "
        "float16 = half the bytes, Jacobian replies within ~2e-4 relative")
    keep_freed_heap: bool = Field(
        True, description="performance only: the process keeps the heap memory a step frees for the next step "
        "(glibc: no heap trimming, blocks under 32 MB from the heap) instead of page-faulting it afresh; peak "
        "memory unchanged (Linux with glibc; elsewhere nothing happens)")
    scratch_dir: Optional[str] = Field(
        None, description="performance only: the folder of the X P files beyond the RAM budget "
        "(None: the run folder's scratch/, or no files when the run writes no folder)")

    @field_validator("k", "kron_terms", "projection_seed")
    @classmethod
    def _read_by_projection(cls, v: Any, info: ValidationInfo) -> Any:
        """A projection knob given with a projection that does not read it is refused (it
        would do nothing): k and projection_seed need a projection, kron_terms 'kron'."""
        projection = info.data.get("projection")
        needs = ("kron",) if info.field_name == "kron_terms" else ("gaussian", "kron")
        if projection is not None and projection not in needs \
                and v != cls.model_fields[info.field_name].get_default(call_default_factory=True):
            raise ValueError(f"not read with projection = {projection!r} (only with {' or '.join(needs)}); "
                             f"drop it or set algorithm.projection")
        return v

    @model_validator(mode="after")
    def _check(self) -> "KernelDFLHP":
        if self.tau_select == "true" and self.projection != "none":
            raise ValueError("tau_select 'true' needs the neighbours' inputs, which only NTK-DFL's declared "
                             "Jacobians stand in for; use 'evolved' or 'linear' with a projection")
        if any(t < 1 for t in self.taus):
            raise ValueError("taus must be >= 1")
        if self.update == "full" and self.projection == "none":
            raise ValueError("update 'full' only applies with a projection (NTK-DFL's update is already full); "
                             "set projection = 'gaussian' or 'kron', or drop update")
        if self.projection_layout != "sum" and self.projection == "none":
            raise ValueError("projection_layout only applies with a projection; set projection = 'gaussian' "
                             "or 'kron', or drop projection_layout")
        if self.order == "sequential" and self.reply_groups:
            raise ValueError("reply_groups does not apply with order 'sequential' (one requester at a time); "
                             "drop reply_groups")
        if self.update == "full" and self.tau_select != "evolved":
            raise ValueError("update 'full' selects tau before the members' J^T R come back; "
                             "set tau_select = 'evolved'")
        return self


def _onehot(y: torch.Tensor, c: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(y.long(), c).to(torch.float32)


def _label_dtype(c: int) -> torch.dtype:
    return torch.uint8 if c <= 255 else torch.int64


class KernelDFL(Algorithm):
    """NTK-DFL with SPARK's switches (``projection``, ``distill``, ``momentum``,
    ``sample_fraction``); see the module docstring."""

    family = "peer"
    default_protocols = ("consensus", "node_global")
    default_main = "consensus/acc"
    Hyperparams = KernelDFLHP
    #: each node's X P products are cached where it lives (xp_cache): no visits
    visiting = False
    #: per-example payloads of a (sub)sampled training batch of the neighbour (SPARK too)
    unaligned_kinds = {"residual": ("peer",), "jacobian": ("peer",), "logits": ("peer",)}

    # -- helpers --------------------------------------------------------------------
    @property
    def projected(self) -> bool:
        """Jacobians travel projected (``J P``)."""
        return self.hp.projection != "none"

    @property
    def coords(self) -> bool:
        """Weights live in ``w0 + Range(P)`` and travel as k coordinates ``theta``."""
        return self.projected and self.hp.update == "subspace"

    @property
    def split_update(self) -> bool:
        """The update needs the members' ``J_m^T R_m`` (``update = "full"``)."""
        return self.projected and self.hp.update == "full"

    def _trainable(self, ctx: NodeContext) -> list[str]:
        return ntk.float_names(ctx.model)

    def _projection(self, ctx: NodeContext) -> ntk.Projection:
        w0 = ctx.init_params()
        names = self._trainable(ctx)
        seed = ctx.seed if self.hp.projection_seed is None else self.hp.projection_seed
        return ntk.cached_projection({n: w0[n] for n in names}, self.hp.k, self.hp.projection, seed,
                                     self.hp.kron_terms, self.hp.projection_layout)

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

    def _proj_key(self, ctx: NodeContext) -> tuple:
        w0 = ctx.init_params()
        return (tuple((n, tuple(w0[n].shape)) for n in self._trainable(ctx)), self.hp.k, self.hp.projection,
                ctx.seed if self.hp.projection_seed is None else self.hp.projection_seed, self.hp.kron_terms,
                self.hp.projection_layout)

    def _sample_idx(self, ctx: NodeContext) -> Optional[torch.Tensor]:
        """The rows of the node's training data used this round (None: all of them)."""
        f = self.hp.sample_fraction
        n = int(ctx.data.train_y.shape[0])
        if f >= 1.0 or n == 0:
            return None
        m = max(1, int(math.ceil(f * n)))
        return torch.randperm(n, generator=ctx.rng("sample"))[:m].sort().values

    def _sample(self, ctx: NodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        """This round's (possibly subsampled) training data of the node."""
        x, y = ctx.data.train_x, ctx.data.train_y
        idx = self._sample_idx(ctx)
        return (x, y) if idx is None else (x[idx], y[idx])

    # -- the X P products, kept across rounds ---------------------------------------
    #: set by the engine: <run folder>/scratch (None when the run writes no folder)
    scratch_root: Optional[str] = None
    _xp_cache: Optional[XPCache] = None
    _lifts: Optional[LiftCache] = None

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

    def lr_at(self, round: int) -> float:
        return self.hp.lr * math.exp(-self.hp.lr_decay * (round - 1))

    # -- state ----------------------------------------------------------------------
    def init_node(self, ctx: NodeContext) -> State:
        st: State = {"params": ctx.init_params()}
        dim = self._projection(ctx).dim if self.coords else 0
        if self.coords:
            st["theta"] = torch.zeros(dim)
        if self.hp.momentum > 0:
            st["v"] = torch.zeros(dim) if self.coords else {
                n: torch.zeros_like(st["params"][n]) for n in self._trainable(ctx)}
        return st

    # -- orchestration ----------------------------------------------------------------
    def num_groups(self, plan: RoundPlan) -> int:
        n = len(plan.participants)
        if self.hp.reply_groups:
            return max(1, min(self.hp.reply_groups, n))
        if not self.projected:
            return 1
        edges = sum(len(v) for v in plan.neighbors.values())
        # an estimate: ~200 samples x 10 classes per reply (the paper's setting), as many
        # columns as coordinates (a concatenated layout: up to 3 k, e.g. 2.11 k for the MLP)
        width = self.hp.k * (1 if self.hp.projection_layout == "sum" else 3)
        est = edges * 200 * 10 * width * 4 * self.hp.sample_fraction
        return max(1, min(n, int(math.ceil(est / (self.hp.max_inflight_mb * 1e6)))))

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        if self.hp.order == "sequential":
            return self.sequential_steps(plan)
        nodes = list(plan.participants)
        groups = requester_groups(plan, self.num_groups(plan), round)
        out = [Step("share", nodes, self.share), Step("request", nodes, self.request)]
        for g, members in enumerate(groups):
            out.append(Step(f"reply{g}", nodes, partial(self.reply, group=frozenset(members), first=g == 0,
                                                        last=g == len(groups) - 1)))
            out.append(Step(f"update{g}", members, self.update))
            if self.split_update:
                out.append(Step(f"grad{g}", nodes, partial(self.grad, group=frozenset(members),
                                                           last=g == len(groups) - 1)))
                out.append(Step(f"apply{g}", members, self.apply))
        out.append(Step("commit", nodes, self.commit))
        return out

    def sequential_steps(self, plan: RoundPlan) -> list[Step]:
        """``order = "sequential"``: the synchronous round restricted to one requester at a
        time, nodes in id order (the loop of the reference's ``random_graph*.py``). For node i: its neighbours send
        i their *current* weights (those already updated this round included), i averages
        and requests, the neighbours reply at ``w_bar_i``, i updates and commits at once, so
        later nodes see it. Every node still sees only its own state and inbox, and every
        directed edge carries the same messages as in a synchronous round."""
        out: list[Step] = []
        for i in sorted(plan.participants):
            closed = [i, *plan.neighbors.get(i, ())]
            one = frozenset({i})
            out += [Step(f"share{i}", closed, partial(self.share, to=i)),
                    Step(f"request{i}", [i], self.request),
                    Step(f"reply{i}", closed, partial(self.reply, group=one, first=True)),
                    Step(f"update{i}", [i], self.update)]
            if self.split_update:
                out += [Step(f"grad{i}", closed, partial(self.grad, group=one, last=True)),
                        Step(f"apply{i}", [i], self.apply)]
            out.append(Step(f"commit{i}", [i], self.commit))
        return out

    # -- step 1: share weights (or coordinates) ---------------------------------------
    def share(self, ctx: NodeContext, state: State, inbox: list[Envelope], *,
              to: Optional[int] = None) -> tuple[State, Outbox]:
        """Send the weights (or coordinates) to every neighbour, or only to ``to``
        (sequential order; the requester ``to`` itself sends nothing)."""
        out = Outbox()
        dsts = ctx.neighbors if to is None else (() if ctx.node == to else (to,))
        if self.coords:
            out.broadcast(dsts, Message("coords", {"theta": state["theta"]}))
        else:
            out.broadcast(dsts, Message("weights", dict(state["params"])))
        new = dict(state)
        if self.hp.distill:
            ctx.model.eval()
            x, _ = self._sample(ctx)
            new["own_z"] = ntk.logits(ctx.model, state["params"], x)
        return new, out

    # -- step 2: average, request Jacobians at the average -----------------------------
    def request(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        new = dict(state)
        if self.coords:
            thetas = [state["theta"]] + [e.msg.tensors["theta"] for e in inbox if e.msg.kind == "coords"]
            tbar = torch.stack(thetas).mean(0)
            new["thetabar"] = tbar
            new["wbar"] = self._weights_of(ctx, tbar, shared=True)
            msg = Message("request", {"theta": tbar})
        else:
            models = [state["params"]] + [e.msg.tensors for e in inbox if e.msg.kind == "weights"]
            new["wbar"] = weighted_average(models)
            msg = Message("request", dict(new["wbar"]))
        return new, Outbox().broadcast(ctx.neighbors, msg)

    # -- step 3: answer the requests of one group -------------------------------------
    def reply(self, ctx: NodeContext, state: State, inbox: list[Envelope], *, group: frozenset,
              first: bool, last: bool = True) -> tuple[State, Outbox]:
        if self.hp.keep_freed_heap:
            keep_freed_heap()  # once per process (a worker's too)
        new = dict(state)
        if first:
            new["requests"] = {e.src: e.msg.tensors for e in inbox if e.msg.kind == "request"}
        reqs = [(s, t) for s, t in sorted(new["requests"].items()) if s in group]
        if last and not self.split_update:  # no later step needs them: free the requests' weights early
            new["requests"] = {}
        me = ctx.node in group
        out = Outbox()
        if not reqs and not me:
            return new, out
        ctx.model.eval()
        x, y = self._sample(ctx)
        weights = [(self._weights_of(ctx, t["theta"], shared=True) if self.coords else t) for _, t in reqs]
        if me:
            weights.append(state["wbar"])
        f0s = [ntk.logits(ctx.model, w, x) for w in weights]
        jts: list = [None] * len(weights)
        if self.projected:
            proj = self._projection(ctx)
            q = self._xp(ctx, proj) if proj.structured(ctx.model) and proj.has_xp() else None
            jts = proj.jacobian(ctx.model, x, weights, q=q)
        c = ctx.num_classes
        labels = y.to(_label_dtype(c))
        d = sum(int(state["params"][n].numel()) for n in self._trainable(ctx))
        z = state.get("own_z")
        for (src, _), f0, jt in zip(reqs, f0s, jts):
            lg = {"f0": f0, "y": labels}
            if z is not None:
                lg["z"] = z
            out.send(src, Message("logits", lg))
            if jt is not None:
                out.send(src, Message("jacobian", {"jac": jt}))
            else:
                out.send(src, Message("jacobian", declared={"jac": DeclaredTensor((int(x.shape[0]), c, d))},
                                      stand_in={"x": x}))
        if me:
            new["self_reply"] = {"f0": f0s[-1], "y": labels, "x": x, "jac": jts[-1], "z": z}
        return new, out

    # -- step 4: kernel, evolution, update ----------------------------------------------
    def update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        hp = self.hp
        ctx.model.eval()
        c = ctx.num_classes
        members: dict[int, dict[str, Any]] = {}
        for e in inbox:
            slot = members.setdefault(e.src, {})
            if e.msg.kind == "logits":
                slot.update(e.msg.tensors)
            elif e.msg.kind == "jacobian":
                slot["jac"] = e.msg.tensors.get("jac")
                slot["x"] = e.msg.stand_in.get("x")
        # a neighbour whose logits or Jacobian was refused by validation (or came late)
        # is left out of this round's kernel, as if it had not replied
        need = ("f0", "y", "jac") + (("z",) if hp.distill else ())
        members = {s: m for s, m in members.items() if all(k in m for k in need)}
        own = state["self_reply"]
        order = [own] + [members[s] for s in sorted(members)]
        f0 = torch.cat([m["f0"] for m in order])
        yh = _onehot(torch.cat([m["y"] for m in order]), c)
        n = int(f0.shape[0])
        lr = self.lr_at(ctx.round)
        z = torch.cat([m["z"] for m in order]) if hp.distill else None
        alpha, temp = ntk.distill_schedule(ctx.round, hp.distill_warmup, hp.distill_rounds, hp.alpha_init,
                                           hp.alpha_final, hp.temp_init, hp.temp_final)
        yt = ntk.distill_target(yh, z, alpha, temp)
        wbar = state["wbar"]
        names = self._trainable(ctx)
        if self.projected:
            jt = ntk.cat_scratch([m["jac"] for m in order])  # a reused buffer: used here only
            kern = ntk.projected_kernel(jt)
            x = None
        else:
            x = torch.cat([m["x"] for m in order])
            kern = ntk.trace_kernel(ctx.model, wbar, x)
        fs = ntk.evolve_ce(kern, f0, yt, lr, max(hp.taus), hp.ode_substeps)
        rs = ntk.residuals(fs, yt, hp.taus)
        if self.split_update:
            return self._send_residuals(state, order, members, fs, rs, yh, n)
        best: tuple[float, Any, int] | None = None
        for tau in hp.taus:
            if self.projected:
                delta = -(lr / n) * (rs[tau].reshape(1, -1) @ jt.reshape(-1, jt.shape[2])).reshape(-1)
            else:
                g = ntk.jt_r(ctx.model, wbar, x, rs[tau])
                delta = {k: -(lr / n) * g[k] for k in names}
            if len(hp.taus) == 1:
                best = (0.0, delta, tau)
                break
            if hp.tau_select == "evolved":
                loss = ntk.cross_entropy_soft(fs[tau], yh)
            elif hp.tau_select == "linear":
                fl = f0 + (torch.einsum("nck,k->nc", jt, delta) if self.projected
                           else ntk.j_v(ctx.model, {k: wbar[k] for k in names}, x, delta))
                loss = ntk.cross_entropy_soft(fl, yh)
            else:
                cand = {k: (v + delta[k]) if k in delta else v for k, v in wbar.items()}
                loss = ntk.cross_entropy_soft(ntk.logits(ctx.model, cand, x), yh)
            if best is None or loss < best[0]:
                best = (loss, delta, tau)
        assert best is not None
        _, delta, tau = best
        return self._step(ctx, state, delta, int(tau)), Outbox()

    def _step(self, ctx: NodeContext, state: State, delta: Any, tau: int) -> State:
        """Momentum (if any) and the next weights from the update ``delta`` (``theta``-space
        with coordinates, else a parameter dict)."""
        new = dict(state)
        mu = self.hp.momentum
        if self.coords:
            if mu > 0:
                v = mu * state["v"] + delta
                new["next_v"] = v
                step = mu * v + delta
            else:
                step = delta
            new["next_theta"] = state["thetabar"] + step
        else:
            names = self._trainable(ctx)
            if mu > 0:
                v = {k: mu * state["v"][k] + delta[k] for k in names}
                new["next_v"] = v
                step = {k: mu * v[k] + delta[k] for k in names}
            else:
                step = delta
            wbar = state["wbar"]
            new["next_params"] = {k: (w + step[k]) if k in step else w.clone() for k, w in wbar.items()}
        new["tau"] = tau
        return new

    # -- update = "full": the members compute J_m^T R_m ------------------------------------
    def _send_residuals(self, state: State, order: list, members: dict, fs: torch.Tensor, rs: dict,
                        yh: torch.Tensor, n: int) -> tuple[State, Outbox]:
        """Pick tau on the evolved predictions and send each member its slice of ``R``
        (``n_m x C`` floats); the own slice stays here."""
        hp = self.hp
        tau = hp.taus[0] if len(hp.taus) == 1 else min(hp.taus, key=lambda t: ntk.cross_entropy_soft(fs[t], yh))
        r = rs[tau]
        out = Outbox()
        sizes = [int(m["f0"].shape[0]) for m in order]
        parts = torch.split(r, sizes)
        for src, part in zip(sorted(members), parts[1:]):
            out.send(src, Message("residual", {"r": part.contiguous()}))
        new = dict(state)
        new["own_residual"] = parts[0].contiguous()
        new["pending"] = {"n": n, "tau": int(tau)}
        return new, out

    def grad(self, ctx: NodeContext, state: State, inbox: list[Envelope], *, group: frozenset,
             last: bool) -> tuple[State, Outbox]:
        """Member side of ``update = "full"``: ``J(X_m; w_bar_i)^T R_m`` (one backward pass)
        for every requester i of this group that sent a residual; ``d`` floats back."""
        new = dict(state)
        out = Outbox()
        ctx.model.eval()
        asks = [(e.src, e.msg.tensors["r"]) for e in inbox if e.msg.kind == "residual"]
        if asks or ctx.node in group:
            x, _ = self._sample(ctx)
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
        new = self._step(ctx, state, delta, pend["tau"])
        new.pop("own_grad", None)
        new.pop("pending", None)
        return new, Outbox()

    # -- step 5: synchronous commit ---------------------------------------------------------
    def commit(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        new: State = {}
        if self.coords:
            new["theta"] = state["next_theta"]
            new["params"] = self._weights_of(ctx, new["theta"])
        else:
            new["params"] = state["next_params"]
        if self.hp.momentum > 0:
            new["v"] = state["next_v"]
        return new, Outbox()


def requester_groups(plan: RoundPlan, groups: int, round: int, sweeps: int = 30) -> list[list[int]]:
    """Split the round's nodes into ``groups`` balanced groups of requesters.

    A node answers the requesters of every group its closed neighbourhood meets, and
    recomputes its weight-independent ``X P`` product once per such group; a short
    swap search (deterministic, seeded by the round) lowers that count below a random
    split's. Orchestration only: node ids and the graph, never a node's state.
    """
    nodes = list(plan.participants)
    if groups <= 1 or len(nodes) <= 1:
        return [nodes]
    rng = np_gen(0, "ntk-groups", round)
    perm = [nodes[i] for i in rng.permutation(len(nodes))]
    g = {v: i % groups for i, v in enumerate(perm)}
    closed = {v: [v, *plan.neighbors.get(v, ())] for v in nodes}
    touch: dict[int, list[int]] = {v: [] for v in nodes}  # u -> nodes whose closed nbhd holds u
    for v in nodes:
        for u in closed[v]:
            if u in touch:
                touch[u].append(v)
    cnt = {v: np.bincount([g[u] for u in closed[v] if u in g], minlength=groups) for v in nodes}

    def cost_of(vs: set) -> int:
        return sum(int((cnt[v] > 0).sum()) for v in vs)

    for _ in range(sweeps * len(nodes)):
        a, b = rng.integers(len(nodes), size=2)
        a, b = nodes[a], nodes[b]
        ga, gb = g[a], g[b]
        if ga == gb:
            continue
        aff = set(touch[a]) | set(touch[b])
        before = cost_of(aff)
        for v in touch[a]:
            cnt[v][ga] -= 1
            cnt[v][gb] += 1
        for v in touch[b]:
            cnt[v][gb] -= 1
            cnt[v][ga] += 1
        if cost_of(aff) <= before:
            g[a], g[b] = gb, ga
        else:
            for v in touch[a]:
                cnt[v][gb] -= 1
                cnt[v][ga] += 1
            for v in touch[b]:
                cnt[v][ga] -= 1
                cnt[v][gb] += 1
    return [sorted(v for v in nodes if g[v] == i) for i in range(groups)]


@register
class NTKDFL(KernelDFL):
    """NTK-DFL: full Jacobians (declared), trace kernel, CE evolution, tau selection."""

    name = "ntk_dfl"
    paper = "Thompson et al., NTK-DFL: Enhancing Decentralized Federated Learning in Heterogeneous Settings via NTK, ICML 2025"
    Hyperparams = KernelDFLHP
