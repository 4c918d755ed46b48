"""The kernel round of NTK-DFL and SPARK, written once, over a small set of operations.

One round ``r`` (specs/ntk_dfl_spark.md, "NTK-DFL round r"; every step runs on one node with
its own state, data and inbox; :mod:`~lowband.algorithms.decentralised.ntk_dfl` tells it in
full):

1. ``share``: node i sends what it exchanges (its weights) to its neighbours.
2. ``request``: node i averages over its closed neighbourhood and asks every neighbour for
   Jacobians at the average ``w_bar_i``.
3. ``reply``: each neighbour answers with its logits ``f(X_j; w_bar_i)``, its labels and a
   Jacobian message.
4. ``update``: node i pools the replies, builds a kernel, evolves the predictions
   (``ntk.evolve_ce``), forms the residuals ``R_tau`` and turns one into a weight update.
5. ``commit``: synchronous, every node at once (or, ``order = "sequential"``, each node
   right after its own update).

What differs between the methods is in :class:`Operations`, six parts with a few methods
each; the round calls nothing else:

==============  ====================================================  ====================
part            what it answers                                        NTK-DFL (here)
==============  ====================================================  ====================
``exchange``    what is shared and averaged, the request, the commit   weights ``w``
``payload``     the Jacobian reply, the kernel, ``dw`` from ``R``      declared ``J``
``targets``     ``Y`` of the evolution and what replies carry for it   hard labels
``momentum``    the step taken from ``dw``                             none: ``dw``
``sample``      the rows of its data a node uses this round            all of them
``finish``      the end of step 4 and any steps before the commit      best tau, one trip
==============  ====================================================  ====================

NTK-DFL's parts are here because they are the round's own protocol; SPARK's
(:mod:`~lowband.algorithms.decentralised.spark`, Algorithms 1-2) replace them switch by switch,
and :mod:`~lowband.algorithms.decentralised.spark_full` supplies ``update = "full"``'s finish.
A method is an :class:`KernelDFL` whose :meth:`~KernelDFL.operations` picks its parts.

Steps 3 and 4 may be split into groups of requesters (``reply_groups``) so that at most a
fraction of the round's Jacobian messages is in memory at once; the split changes nothing in
the result (a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal, Optional, Protocol

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from lowband.algorithms.base import (
    Algorithm, Envelope, Hyperparams, NodeContext, Outbox, Params, State, Step,
)
from lowband.algorithms.decentralised import ntk
from lowband.algorithms.decentralised.ntk_cache import keep_freed_heap
from lowband.comm.message import DeclaredTensor, Message
from lowband.seeding import np_gen
from lowband.topology import RoundPlan
from lowband.train import weighted_average


class KernelDFLHP(Hyperparams):
    """NTK-DFL's hyperparameters (defaults: its reference code) and SPARK's switches, off.

    The switches (``projection`` and the knobs it reads, ``distill`` and its schedule,
    ``momentum``, ``sample_fraction``, ``update``, the ``X P`` cache) are declared here, with
    NTK-DFL's values, because ``ntk_dfl`` accepts them: a configuration that turns one on runs
    SPARK's parts (:class:`~lowband.algorithms.decentralised.ntk_dfl.NTKDFL`), and a run folder's
    hyperparams.json, which ``--resume`` compares, holds every one of them.
    :class:`~lowband.algorithms.decentralised.spark.SparkHP` gives them SPARK's defaults."""

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
    max_inflight_mb: float = Field(
        2000.0, gt=0, description="memory budget (MB) of one requester group's Jacobian messages and the steps' "
        "working memory: the process stays within its base (data, model, P) + xp_cache_mb + max_inflight_mb")
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



# -- the operations ----------------------------------------------------------------------------
class Exchange(Protocol):
    """What nodes share and average, what a request asks the Jacobian at, how a node's new
    weights are written (steps 1, 2, 5)."""

    def init(self, ctx: NodeContext, state: State) -> None: ...
    def zeros(self, ctx: NodeContext, state: State) -> Any: ...
    def message(self, ctx: NodeContext, state: State) -> Message: ...
    def average(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Message]: ...
    def weights(self, ctx: NodeContext, request: dict[str, torch.Tensor]) -> Params: ...
    def apply(self, ctx: NodeContext, state: State, step: Any, tau: int) -> State: ...
    def commit(self, ctx: NodeContext, state: State) -> State: ...


class Payload(Protocol):
    """The Jacobian a reply carries and what the requester makes of it (steps 3, 4)."""

    def jacobians(self, ctx: NodeContext, x: torch.Tensor, weights: list[Params]) -> list[Optional[torch.Tensor]]: ...
    def message(self, ctx: NodeContext, state: State, x: torch.Tensor, jac: Optional[torch.Tensor]) -> Message: ...
    def kernel(self, ctx: NodeContext, state: State, parts: list[dict[str, Any]]) -> tuple[torch.Tensor, Any]: ...
    def update(self, ctx: NodeContext, state: State, basis: Any, r: torch.Tensor, lr: float, n: int) -> Any: ...
    def linearised(self, ctx: NodeContext, state: State, basis: Any, delta: Any) -> torch.Tensor: ...
    def groups(self, plan: RoundPlan) -> int: ...


class Targets(Protocol):
    """``Y`` of the evolution and of ``R``, and what the replies carry for it."""

    keys: tuple[str, ...]

    def own_logits(self, ctx: NodeContext, state: State) -> Optional[torch.Tensor]: ...
    def extras(self, state: State) -> dict[str, torch.Tensor]: ...
    def targets(self, ctx: NodeContext, y_hard: torch.Tensor, parts: list[dict[str, Any]]) -> torch.Tensor: ...


class Momentum(Protocol):
    """The step taken from the update ``dw`` (and the node's own buffer, if any)."""

    def init(self, ctx: NodeContext, state: State, exchange: Exchange) -> None: ...
    def step(self, state: State, delta: Any) -> tuple[Any, Any]: ...
    def commit(self, state: State, new: State) -> None: ...


class Sample(Protocol):
    """The rows of its training data a node uses this round."""

    def indices(self, ctx: NodeContext) -> Optional[torch.Tensor]: ...
    def __call__(self, ctx: NodeContext) -> tuple[torch.Tensor, torch.Tensor]: ...


class Finish(Protocol):
    """The end of step 4 and the steps between a group's update and the commit."""

    second_trip: bool

    def after_evolution(self, ctx: NodeContext, state: State, pool: Pooled) -> tuple[State, Outbox]: ...
    def steps(self, tag: str, responders: list[int], requesters: list[int], group: frozenset,
              last: bool) -> list[Step]: ...


@dataclass
class Operations:
    """The parts a method supplies to the round (module docstring)."""

    exchange: Exchange
    payload: Payload
    targets: Targets
    momentum: Momentum
    sample: Sample
    finish: Finish
    #: performance-only caches of the parts (SPARK's ``X P`` and lifts), None without any
    caches: Any = None


# -- NTK-DFL's parts ---------------------------------------------------------------------------
class Part:
    """A part reads the method's hyperparameters when it runs (not when it is built)."""

    def __init__(self, alg: "KernelDFL") -> None:
        self.alg = alg

    @property
    def hp(self) -> Any:
        return self.alg.hp


class Weights(Part):
    """Nodes share their weights ``w_i``; the request is ``w_bar_i`` itself; the commit
    writes ``w_bar_i + step``."""

    def init(self, ctx: NodeContext, state: State) -> None:
        pass

    def zeros(self, ctx: NodeContext, state: State) -> Params:
        return {n: torch.zeros_like(state["params"][n]) for n in self.alg.trainable(ctx)}

    def message(self, ctx: NodeContext, state: State) -> Message:
        return Message("weights", dict(state["params"]))

    def average(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Message]:
        models = [state["params"]] + [e.msg.tensors for e in inbox if e.msg.kind == "weights"]
        wbar = weighted_average(models)
        return {"wbar": wbar}, Message("request", dict(wbar))

    def weights(self, ctx: NodeContext, request: dict[str, torch.Tensor]) -> Params:
        return request

    def apply(self, ctx: NodeContext, state: State, step: Any, tau: int) -> State:
        new = dict(state)
        new["next_params"] = {k: (w + step[k]) if k in step else w.clone() for k, w in state["wbar"].items()}
        new["tau"] = tau
        return new

    def commit(self, ctx: NodeContext, state: State) -> State:
        return {"params": state["next_params"]}


class DeclaredJacobians(Part):
    """The reply declares ``J`` (``n_j x C x d`` float32: counted, never built) with the
    inputs ``X_j`` as its uncounted stand-in; the requester's trace kernel and ``J^T R`` are
    computed from the pooled inputs at ``w_bar_i``."""

    def jacobians(self, ctx: NodeContext, x: torch.Tensor, weights: list[Params]) -> list[Optional[torch.Tensor]]:
        return [None] * len(weights)

    def message(self, ctx: NodeContext, state: State, x: torch.Tensor, jac: Optional[torch.Tensor]) -> Message:
        d = sum(int(state["params"][n].numel()) for n in self.alg.trainable(ctx))
        return Message("jacobian", declared={"jac": DeclaredTensor((int(x.shape[0]), ctx.num_classes, d))},
                       stand_in={"x": x})

    def kernel(self, ctx: NodeContext, state: State, parts: list[dict[str, Any]]) -> tuple[torch.Tensor, Any]:
        """The trace kernel over the pooled samples; the basis of the update is the pooled
        inputs (the stand-ins), from which ``J`` is implicit."""
        x = torch.cat([m["x"] for m in parts])
        return ntk.trace_kernel(ctx.model, state["wbar"], x), x

    def update(self, ctx: NodeContext, state: State, basis: Any, r: torch.Tensor, lr: float, n: int) -> Any:
        """``dw = -(lr/N) J^T R`` (a backward pass at ``w_bar`` over the pooled inputs)."""
        g = ntk.jt_r(ctx.model, state["wbar"], basis, r)
        return {k: -(lr / n) * g[k] for k in self.alg.trainable(ctx)}

    def linearised(self, ctx: NodeContext, state: State, basis: Any, delta: Any) -> torch.Tensor:
        """``J dw`` (one forward-mode pass)."""
        wbar = state["wbar"]
        return ntk.j_v(ctx.model, {k: wbar[k] for k in self.alg.trainable(ctx)}, basis, delta)

    def groups(self, plan: RoundPlan) -> int:
        return 1


class HardLabels(Part):
    """``Y`` is the one-hot labels; the replies carry nothing for it."""

    keys: tuple[str, ...] = ()

    def own_logits(self, ctx: NodeContext, state: State) -> Optional[torch.Tensor]:
        return None

    def extras(self, state: State) -> dict[str, torch.Tensor]:
        return {}

    def targets(self, ctx: NodeContext, y_hard: torch.Tensor, parts: list[dict[str, Any]]) -> torch.Tensor:
        return y_hard


class NoMomentum(Part):
    """The step is the update itself."""

    def init(self, ctx: NodeContext, state: State, exchange: Exchange) -> None:
        pass

    def step(self, state: State, delta: Any) -> tuple[Any, Any]:
        return delta, None

    def commit(self, state: State, new: State) -> None:
        pass


class AllData(Part):
    """Every row of the node's training data, every round."""

    def indices(self, ctx: NodeContext) -> Optional[torch.Tensor]:
        return None

    def __call__(self, ctx: NodeContext) -> tuple[torch.Tensor, torch.Tensor]:
        return ctx.data.train_x, ctx.data.train_y


class PickTau(Part):
    """The end of step 4: the update of every candidate tau, the best one by the candidate
    loss of ``tau_select`` kept; nothing more before the commit."""

    second_trip = False

    def after_evolution(self, ctx: NodeContext, state: State, pool: Pooled) -> tuple[State, Outbox]:
        hp, payload = self.hp, self.alg.ops.payload
        best: tuple[float, Any, int] | None = None
        for tau in hp.taus:
            delta = payload.update(ctx, state, pool.basis, pool.rs[tau], pool.lr, pool.n)
            if len(hp.taus) == 1:
                best = (0.0, delta, tau)
                break
            if hp.tau_select == "evolved":
                loss = ntk.cross_entropy_soft(pool.fs[tau], pool.y_hard)
            elif hp.tau_select == "linear":
                loss = ntk.cross_entropy_soft(pool.f0 + payload.linearised(ctx, state, pool.basis, delta), pool.y_hard)
            else:
                wbar = state["wbar"]
                cand = {k: (v + delta[k]) if k in delta else v for k, v in wbar.items()}
                loss = ntk.cross_entropy_soft(ntk.logits(ctx.model, cand, pool.basis), pool.y_hard)
            if best is None or loss < best[0]:
                best = (loss, delta, tau)
        assert best is not None
        _, delta, tau = best
        return self.alg.next_state(ctx, state, delta, int(tau)), Outbox()

    def steps(self, tag: str, responders: list[int], requesters: list[int], group: frozenset,
              last: bool) -> list[Step]:
        return []


def ntk_dfl_operations(alg: "KernelDFL") -> Operations:
    """NTK-DFL's parts."""
    return Operations(exchange=Weights(alg), payload=DeclaredJacobians(alg), targets=HardLabels(alg),
                      momentum=NoMomentum(alg), sample=AllData(alg), finish=PickTau(alg))


# -- the round -----------------------------------------------------------------------------------
class KernelDFL(Algorithm):
    """The kernel round (module docstring) over :attr:`ops`, the parts :meth:`operations`
    picks: share, request, reply, update, commit, in requester groups or in sequential
    order."""

    family = "peer"
    default_protocols = ("consensus", "node_global")
    default_main = "consensus/acc"
    Hyperparams = KernelDFLHP
    #: each node's per-node work stays where it lives (SPARK: its cached X P products): no visits
    visiting = False
    #: per-example payloads of the neighbour's (possibly subsampled) training data
    unaligned_kinds = {"jacobian": ("peer",), "logits": ("peer",)}
    #: set by the engine: <run folder>/scratch (None when the run writes no folder)
    scratch_root: Optional[str] = None

    def __init__(self, hp: Hyperparams) -> None:
        super().__init__(hp)
        self.ops = self.operations()

    def operations(self) -> Operations:
        """The parts of this method (NTK-DFL's here)."""
        return ntk_dfl_operations(self)

    def trainable(self, ctx: NodeContext) -> list[str]:
        return ntk.float_names(ctx.model)

    def lr_at(self, round: int) -> float:
        """``lr_r = lr * exp(-lr_decay * (r - 1))`` (1-based rounds)."""
        return self.hp.lr * math.exp(-self.hp.lr_decay * (round - 1))

    def init_node(self, ctx: NodeContext) -> State:
        st: State = {"params": ctx.init_params()}
        self.ops.exchange.init(ctx, st)
        self.ops.momentum.init(ctx, st, self.ops.exchange)
        return st

    def next_state(self, ctx: NodeContext, state: State, delta: Any, tau: int) -> State:
        """The entries step 5 commits: the momentum's step from ``delta``, applied to the average."""
        step, v = self.ops.momentum.step(state, delta)
        new = self.ops.exchange.apply(ctx, state, step, tau)
        if v is not None:
            new["next_v"] = v
        return new

    def num_groups(self, plan: RoundPlan) -> int:
        """Requester groups of a synchronous round: ``reply_groups``, else the payload's."""
        if self.hp.reply_groups:
            return max(1, min(self.hp.reply_groups, len(plan.participants)))
        return self.ops.payload.groups(plan)

    # -- SPARK's P and X P cache, when a projection is on (for tests and benchmarks) ----------
    def xp_cache(self) -> Any:
        """The run's ``X P`` cache (:mod:`~lowband.algorithms.decentralised.spark_cache`)."""
        return self.ops.caches.xp_cache()

    def _projection(self, ctx: NodeContext) -> ntk.Projection:
        """``P`` (:class:`~lowband.algorithms.decentralised.spark.Subspace`)."""
        return self.ops.payload.subspace.projection(ctx)

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
            out += self.ops.finish.steps(str(g), nodes, members, frozenset(members), last)
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
            out += self.ops.finish.steps(str(i), closed, [i], one, True)
            out.append(Step(f"commit{i}", [i], self.commit))
        return out

    # -- step 1: share ----------------------------------------------------------------
    def share(self, ctx: NodeContext, state: State, inbox: list[Envelope], *,
              to: Optional[int] = None) -> tuple[State, Outbox]:
        """Send the exchange's message to every neighbour, or only to ``to`` (sequential
        order; the requester ``to`` itself sends nothing)."""
        out = Outbox()
        dsts = ctx.neighbors if to is None else (() if ctx.node == to else (to,))
        out.broadcast(dsts, self.ops.exchange.message(ctx, state))
        new = dict(state)
        z = self.ops.targets.own_logits(ctx, state)
        if z is not None:
            new["own_z"] = z
        return new, out

    # -- step 2: average, request Jacobians at the average -----------------------------
    def request(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        new = dict(state)
        kept, msg = self.ops.exchange.average(ctx, state, inbox)
        new.update(kept)
        return new, Outbox().broadcast(ctx.neighbors, msg)

    # -- step 3: answer the requests of one group -------------------------------------
    def reply(self, ctx: NodeContext, state: State, inbox: list[Envelope], *, group: frozenset,
              first: bool, last: bool = True) -> tuple[State, Outbox]:
        if self.hp.keep_freed_heap:
            keep_freed_heap()  # once per process (a worker's too)
        ops = self.ops
        new = dict(state)
        if first:
            new["requests"] = {e.src: e.msg.tensors for e in inbox if e.msg.kind == "request"}
        reqs = [(s, t) for s, t in sorted(new["requests"].items()) if s in group]
        if last and not ops.finish.second_trip:  # no later step needs them: free the requests' weights early
            new["requests"] = {}
        me = ctx.node in group
        out = Outbox()
        if not reqs and not me:
            return new, out
        ctx.model.eval()
        x, y = ops.sample(ctx)
        weights = [ops.exchange.weights(ctx, t) for _, t in reqs]
        if me:
            weights.append(state["wbar"])
        f0s = [ntk.logits(ctx.model, w, x) for w in weights]
        jts = ops.payload.jacobians(ctx, x, weights)
        labels = y.to(_label_dtype(ctx.num_classes))
        extras = ops.targets.extras(state)
        for (src, _), f0, jt in zip(reqs, f0s, jts):
            out.send(src, Message("logits", {"f0": f0, "y": labels, **extras}))
            out.send(src, ops.payload.message(ctx, state, x, jt))
        if me:
            new["self_reply"] = {"f0": f0s[-1], "y": labels, "x": x, "jac": jts[-1], **extras}
        return new, out

    # -- step 4: kernel, evolution, update ----------------------------------------------
    def update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        hp, ops = self.hp, self.ops
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
        need = ("f0", "y", "jac") + ops.targets.keys
        members = {s: m for s, m in members.items() if all(k in m for k in need)}
        parts = [state["self_reply"]] + [members[s] for s in sorted(members)]
        f0 = torch.cat([m["f0"] for m in parts])
        yh = _onehot(torch.cat([m["y"] for m in parts]), ctx.num_classes)
        lr = self.lr_at(ctx.round)
        yt = ops.targets.targets(ctx, yh, parts)
        kern, basis = ops.payload.kernel(ctx, state, parts)
        fs = ntk.evolve_ce(kern, f0, yt, lr, max(hp.taus), hp.ode_substeps)
        rs = ntk.residuals(fs, yt, hp.taus)
        pool = Pooled(members=sorted(members), sizes=[int(m["f0"].shape[0]) for m in parts], basis=basis, f0=f0,
                      y_hard=yh, lr=lr, fs=fs, rs=rs)
        new, out = ops.finish.after_evolution(ctx, state, pool)
        # the own reply (SPARK: an n x C x k Jacobian, 8 MB at the paper's size) is used up:
        # not held until the commit while the later groups' replies are in memory
        new.pop("self_reply", None)
        return new, out

    # -- step 5: commit -----------------------------------------------------------------
    def commit(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        """Synchronous: every node at once, after every update (sequential: right after its own)."""
        new = self.ops.exchange.commit(ctx, state)
        self.ops.momentum.commit(state, new)
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

