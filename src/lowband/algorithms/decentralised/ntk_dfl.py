"""NTK-DFL (Thompson et al., ICML 2025): its round, written once, with the hooks where SPARK
(:mod:`lowband.algorithms.decentralised.spark`) differs.

One round ``r`` (specs/ntk_dfl_spark.md, "NTK-DFL round r"; every step below runs on one
node with its own state, data and inbox):

1. ``share``: node i sends its weights ``w_i`` to its neighbours.
2. ``request``: node i averages uniformly over its closed neighbourhood,
   ``w_bar_i = (w_i + sum_j w_j) / (deg + 1)``, keeps it, and sends it to every neighbour
   as a Jacobian request.
3. ``reply``: each neighbour j answers each requester i with the Jacobian of its logits on
   its data at ``w_bar_i`` (``n_j x C x d``), the logits ``f(X_j; w_bar_i)`` and its labels.
   The full Jacobian is a *declared* tensor (628 MB per edge at the paper's size: counted,
   never built) whose equivalent input ``X_j`` travels as an uncounted stand-in; the
   receiver recomputes the declared content ``J(X_j; w_bar_i)`` implicitly.
4. ``update``: node i stacks the ``N`` samples of its neighbourhood, builds the trace
   kernel ``K = (1/C) sum_c J_c J_c^T`` (``N x N``; closed form for the MLP), evolves
   ``df/dt = -(1/N) K (softmax(f) - Y)`` from ``f_0 = f(X; w_bar_i)`` on ``t_s = s lr_r``
   (RK4), forms ``R_tau = sum_{s<tau} softmax(f_{t_s}) - tau Y`` and
   ``dw_tau = -(lr_r / N) J^T R_tau`` (a backward pass), and keeps the candidate ``tau``
   with the smallest cross-entropy on the pooled data.
   ``lr_r = lr * exp(-lr_decay * (r - 1))`` (1-based rounds).
5. ``commit``: synchronous: ``w_i <- w_bar_i + dw`` for every node at once.

``order = "sequential"`` runs the loop of the reference's ``random_graph*.py`` instead
(Gauss-Seidel; its ``main.py``, which the reference numbers come from, is synchronous): nodes take
their turn in id order, and node i's turn is steps 1-5 with i as the only requester (its
neighbours send i their current weights, already updated ones included; i commits at once).
Same messages per directed edge as a synchronous round; see :meth:`KernelDFL.sequential_steps`.

Steps 3 and 4 may be split into groups of requesters (``reply_groups``) so that at most a
fraction of the round's Jacobian messages is in memory at once. The split changes nothing
in the result (a test checks it).

:class:`KernelDFL` holds the round (steps, grouping, order, lr schedule) and asks small
hooks what differs between NTK-DFL and SPARK; their implementations here are NTK-DFL's:

=========================  =================================================================
hook                       NTK-DFL (here)
=========================  =================================================================
``init_node``              ``{params: w0}``
``share_message``          the weights ``w_i`` (``weights``)
``own_logits``             none (SPARK: ``z_i`` for distillation)
``average``                ``w_bar_i``, sent in full as the request
``request_weights``        the request is ``w_bar_i`` itself
``sample``                 all of the node's training data
``jacobians``              none built: the reply declares ``J`` (``jacobian_message``)
``reply_extras``           nothing beyond ``f0`` and the labels
``reply_keys``             a member counts when its ``f0``, ``y`` and ``jac`` arrived
``targets``                the hard labels ``Y``
``kernel``                 the trace kernel from the pooled inputs (``basis = X``)
``weight_update``          ``dw = -(lr/N) J^T R`` (one backward pass at ``w_bar_i``)
``linearised``             ``J dw`` (one forward-mode pass)
``after_evolution``        pick ``tau``, then ``next_state``
``next_state``/``commit``  ``w_i <- w_bar_i + dw``
``second_trip_steps``      none (SPARK's ``update = "full"``: the members' ``J^T R``)
``num_groups``             ``reply_groups``, else one group
=========================  =================================================================

Hyperparameters: :class:`KernelDFLHP` declares NTK-DFL's knobs and, off (NTK-DFL's values),
SPARK's switches (``projection``, ``distill``, ``momentum``, ``sample_fraction``, ``update``
and what they read). ``ntk_dfl`` has always accepted them (docs/algorithms/spark.md: "available
on ``ntk_dfl`` too"; tests/test_ntk.py runs them on the declared Jacobians), and a run folder's
hyperparams.json, which ``--resume`` compares, holds every one of them. A ``ntk_dfl``
configuration that turns a switch on runs SPARK's hooks under NTK-DFL's name and defaults
(:class:`NTKDFL` hands its construction to
:class:`~lowband.algorithms.decentralised.spark.NTKDFLWithSwitches`); the class here has no
SPARK code.

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
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal, Optional

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from lowband.algorithms.decentralised import ntk
from lowband.algorithms.decentralised.ntk_cache import keep_freed_heap
from lowband.algorithms.base import (
    Algorithm, Envelope, Hyperparams, NodeContext, Outbox, Params, State, Step, register,
)
from lowband.comm.message import DeclaredTensor, Message
from lowband.seeding import np_gen
from lowband.topology import RoundPlan
from lowband.train import weighted_average


class KernelDFLHP(Hyperparams):
    """NTK-DFL's hyperparameters (defaults: its reference code) and SPARK's switches, off.

    The switches (``projection`` and the knobs it reads, ``distill`` and its schedule,
    ``momentum``, ``sample_fraction``, ``update``, the ``X P`` cache) are declared here, with
    NTK-DFL's values, because ``ntk_dfl`` accepts them: a configuration that turns one on runs
    SPARK's hooks (:class:`NTKDFL`), and a run folder's hyperparams.json, which ``--resume``
    compares, holds every one of them. :class:`~lowband.algorithms.decentralised.spark.SparkHP`
    gives them SPARK's defaults."""

    #: memory and speed knobs: the requester groups change nothing in the result
    #: (tests/test_spark.py, grouping tests), nor does where X P is cached (float32; the
    #: tiers test) or the heap policy; ``xp_cache_dtype`` float16 rounds X P and is not here
    PERFORMANCE_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"reply_groups", "max_inflight_mb", "xp_cache_mb", "xp_cache_disk_mb", "keep_freed_heap", "scratch_dir"})

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


@dataclass
class Pooled:
    """Step 4 on requester i: its closed neighbourhood stacked (its own rows first, then
    the members' in id order) and the predictions evolved on it. Lives within one step."""

    members: list[int]  #: the members whose rows follow i's own, in stacking order
    sizes: list[int]  #: rows per part, i's own first
    basis: Any  #: what the Jacobian is known by (NTK-DFL: the pooled inputs X; SPARK: J P)
    f0: torch.Tensor  #: f(X; w_bar_i), N x C
    y_hard: torch.Tensor  #: one-hot labels, N x C
    lr: float  #: lr_r
    fs: torch.Tensor  #: the evolved predictions f_{t_s}, s = 0..max(taus)
    rs: dict[int, torch.Tensor]  #: R_tau per candidate tau

    @property
    def n(self) -> int:
        return int(self.f0.shape[0])


class KernelDFL(Algorithm):
    """NTK-DFL's round: share, request, reply, update, commit (module docstring), in
    requester groups or in sequential order. The hooks (``-- hooks`` below) are NTK-DFL's;
    SPARK overrides them (:class:`~lowband.algorithms.decentralised.spark.Spark`)."""

    family = "peer"
    default_protocols = ("consensus", "node_global")
    default_main = "consensus/acc"
    Hyperparams = KernelDFLHP
    #: each node's per-node work stays where it lives (SPARK: its cached X P products): no visits
    visiting = False
    #: per-example payloads of the neighbour's (possibly subsampled) training data
    unaligned_kinds = {"jacobian": ("peer",), "logits": ("peer",)}

    def _trainable(self, ctx: NodeContext) -> list[str]:
        return ntk.float_names(ctx.model)

    def lr_at(self, round: int) -> float:
        return self.hp.lr * math.exp(-self.hp.lr_decay * (round - 1))

    # -- hooks: NTK-DFL's answers (SPARK overrides them) ---------------------------------
    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def share_message(self, ctx: NodeContext, state: State) -> Message:
        """What step 1 sends the neighbours: the weights."""
        return Message("weights", dict(state["params"]))

    def own_logits(self, ctx: NodeContext, state: State) -> Optional[torch.Tensor]:
        """Logits the node computes on its own data at its own weights in step 1 and sends
        with its replies (None: none)."""
        return None

    def average(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Message]:
        """Step 2: the entries the node keeps (``wbar`` at least) and its Jacobian request."""
        models = [state["params"]] + [e.msg.tensors for e in inbox if e.msg.kind == "weights"]
        wbar = weighted_average(models)
        return {"wbar": wbar}, Message("request", dict(wbar))

    def request_weights(self, ctx: NodeContext, request: dict[str, torch.Tensor]) -> Params:
        """The weights a request asks the Jacobian at (``w_bar`` of the requester)."""
        return request

    def sample(self, ctx: NodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The node's training data used this round: all of it."""
        return ctx.data.train_x, ctx.data.train_y

    def jacobians(self, ctx: NodeContext, x: torch.Tensor, weights: list[Params]) -> list[Optional[torch.Tensor]]:
        """The Jacobians the replies carry, one per weight vector (None: declared, not built)."""
        return [None] * len(weights)

    def jacobian_message(self, ctx: NodeContext, state: State, x: torch.Tensor,
                         jac: Optional[torch.Tensor]) -> Message:
        """The reply's Jacobian: declared (``n_j x C x d`` float32, counted), with the inputs
        ``X_j`` as its uncounted stand-in."""
        d = sum(int(state["params"][n].numel()) for n in self._trainable(ctx))
        return Message("jacobian", declared={"jac": DeclaredTensor((int(x.shape[0]), ctx.num_classes, d))},
                       stand_in={"x": x})

    def reply_extras(self, state: State) -> dict[str, torch.Tensor]:
        """Tensors the logits reply carries beyond ``f0`` and the labels."""
        return {}

    @property
    def reply_keys(self) -> tuple[str, ...]:
        """What a member's reply must hold to enter the kernel."""
        return ("f0", "y", "jac")

    def targets(self, ctx: NodeContext, y_hard: torch.Tensor, parts: list[dict[str, Any]]) -> torch.Tensor:
        """The targets ``Y`` of the evolution and of ``R``: the hard labels."""
        return y_hard

    def kernel(self, ctx: NodeContext, state: State, parts: list[dict[str, Any]]) -> tuple[torch.Tensor, Any]:
        """The trace kernel over the pooled samples, and the basis the update reads: the
        pooled inputs (the declared Jacobians' stand-ins), from which ``J`` is implicit."""
        x = torch.cat([m["x"] for m in parts])
        return ntk.trace_kernel(ctx.model, state["wbar"], x), x

    def weight_update(self, ctx: NodeContext, state: State, basis: Any, r: torch.Tensor, lr: float, n: int) -> Any:
        """``dw = -(lr/N) J^T R`` (a backward pass at ``w_bar`` over the pooled inputs)."""
        g = ntk.jt_r(ctx.model, state["wbar"], basis, r)
        return {k: -(lr / n) * g[k] for k in self._trainable(ctx)}

    def linearised(self, ctx: NodeContext, state: State, basis: Any, delta: Any) -> torch.Tensor:
        """``J dw``: the change of the linearised predictions (``tau_select = "linear"``)."""
        wbar = state["wbar"]
        return ntk.j_v(ctx.model, {k: wbar[k] for k in self._trainable(ctx)}, basis, delta)

    def after_evolution(self, ctx: NodeContext, state: State, pool: Pooled) -> tuple[State, Outbox]:
        """The end of step 4: the update of every candidate tau, the best one kept."""
        hp = self.hp
        best: tuple[float, Any, int] | None = None
        for tau in hp.taus:
            delta = self.weight_update(ctx, state, pool.basis, pool.rs[tau], pool.lr, pool.n)
            if len(hp.taus) == 1:
                best = (0.0, delta, tau)
                break
            if hp.tau_select == "evolved":
                loss = ntk.cross_entropy_soft(pool.fs[tau], pool.y_hard)
            elif hp.tau_select == "linear":
                loss = ntk.cross_entropy_soft(pool.f0 + self.linearised(ctx, state, pool.basis, delta), pool.y_hard)
            else:
                wbar = state["wbar"]
                cand = {k: (v + delta[k]) if k in delta else v for k, v in wbar.items()}
                loss = ntk.cross_entropy_soft(ntk.logits(ctx.model, cand, pool.basis), pool.y_hard)
            if best is None or loss < best[0]:
                best = (loss, delta, tau)
        assert best is not None
        _, delta, tau = best
        return self.next_state(ctx, state, delta, int(tau)), Outbox()

    def next_state(self, ctx: NodeContext, state: State, delta: Any, tau: int) -> State:
        """The weights step 5 commits: ``w_bar + dw``."""
        new = dict(state)
        new["next_params"] = {k: (w + delta[k]) if k in delta else w.clone() for k, w in state["wbar"].items()}
        new["tau"] = tau
        return new

    def commit(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """Step 5 (synchronous: every node at once, after every update)."""
        return {"params": state["next_params"]}, Outbox()

    @property
    def second_trip(self) -> bool:
        """The update needs a second trip to the members (:meth:`second_trip_steps`), so the
        responders keep the requests past their replies."""
        return False

    def second_trip_steps(self, tag: str, responders: list[int], requesters: list[int], group: frozenset,
                          last: bool) -> list[Step]:
        """Steps between a group's ``update`` and the commit (none)."""
        return []

    def num_groups(self, plan: RoundPlan) -> int:
        """Requester groups of a synchronous round: ``reply_groups``, else one."""
        n = len(plan.participants)
        if self.hp.reply_groups:
            return max(1, min(self.hp.reply_groups, n))
        return 1

    # -- orchestration ----------------------------------------------------------------
    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        if self.hp.order == "sequential":
            return self.sequential_steps(plan)
        nodes = list(plan.participants)
        groups = requester_groups(plan, self.num_groups(plan), round)
        out = [Step("share", nodes, self.share), Step("request", nodes, self.request)]
        for g, members in enumerate(groups):
            last = g == len(groups) - 1
            out.append(Step(f"reply{g}", nodes, partial(self.reply, group=frozenset(members), first=g == 0,
                                                        last=last)))
            out.append(Step(f"update{g}", members, self.update))
            out += self.second_trip_steps(str(g), nodes, members, frozenset(members), last)
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
            out += self.second_trip_steps(str(i), closed, [i], one, True)
            out.append(Step(f"commit{i}", [i], self.commit))
        return out

    # -- step 1: share ----------------------------------------------------------------
    def share(self, ctx: NodeContext, state: State, inbox: list[Envelope], *,
              to: Optional[int] = None) -> tuple[State, Outbox]:
        """Send :meth:`share_message` to every neighbour, or only to ``to`` (sequential
        order; the requester ``to`` itself sends nothing)."""
        out = Outbox()
        dsts = ctx.neighbors if to is None else (() if ctx.node == to else (to,))
        out.broadcast(dsts, self.share_message(ctx, state))
        new = dict(state)
        z = self.own_logits(ctx, state)
        if z is not None:
            new["own_z"] = z
        return new, out

    # -- step 2: average, request Jacobians at the average -----------------------------
    def request(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        new = dict(state)
        kept, msg = self.average(ctx, state, inbox)
        new.update(kept)
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
        if last and not self.second_trip:  # no later step needs them: free the requests' weights early
            new["requests"] = {}
        me = ctx.node in group
        out = Outbox()
        if not reqs and not me:
            return new, out
        ctx.model.eval()
        x, y = self.sample(ctx)
        weights = [self.request_weights(ctx, t) for _, t in reqs]
        if me:
            weights.append(state["wbar"])
        f0s = [ntk.logits(ctx.model, w, x) for w in weights]
        jts = self.jacobians(ctx, x, weights)
        labels = y.to(_label_dtype(ctx.num_classes))
        extras = self.reply_extras(state)
        for (src, _), f0, jt in zip(reqs, f0s, jts):
            out.send(src, Message("logits", {"f0": f0, "y": labels, **extras}))
            out.send(src, self.jacobian_message(ctx, state, x, jt))
        if me:
            new["self_reply"] = {"f0": f0s[-1], "y": labels, "x": x, "jac": jts[-1], **extras}
        return new, out

    # -- step 4: kernel, evolution, update ----------------------------------------------
    def update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        hp = self.hp
        ctx.model.eval()
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
        need = self.reply_keys
        members = {s: m for s, m in members.items() if all(k in m for k in need)}
        parts = [state["self_reply"]] + [members[s] for s in sorted(members)]
        f0 = torch.cat([m["f0"] for m in parts])
        yh = _onehot(torch.cat([m["y"] for m in parts]), ctx.num_classes)
        lr = self.lr_at(ctx.round)
        yt = self.targets(ctx, yh, parts)
        kern, basis = self.kernel(ctx, state, parts)
        fs = ntk.evolve_ce(kern, f0, yt, lr, max(hp.taus), hp.ode_substeps)
        rs = ntk.residuals(fs, yt, hp.taus)
        pool = Pooled(members=sorted(members), sizes=[int(m["f0"].shape[0]) for m in parts], basis=basis, f0=f0,
                      y_hard=yh, lr=lr, fs=fs, rs=rs)
        return self.after_evolution(ctx, state, pool)


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

    def __new__(cls, hp: Optional[Hyperparams] = None, *args: Any, **kwargs: Any) -> "NTKDFL":
        """A configuration that turns one of SPARK's switches on runs SPARK's hooks under this
        name and these defaults (module docstring): the object built is then
        :class:`~lowband.algorithms.decentralised.spark.NTKDFLWithSwitches` (a subclass).
        Without ``hp`` (unpickling) the class is kept."""
        if cls is NTKDFL and hp is not None:
            from lowband.algorithms.decentralised import spark  # imports this module: here, not at the top

            if spark.switched_on(hp):
                cls = spark.NTKDFLWithSwitches
        return super().__new__(cls)
