"""Vectorised cohorts: many nodes' local SGD at once, with ``torch.func``.

Local SGD on a small model is bound by per-step overhead, not FLOPs (benchmarks/README.md:
a 784-100-10 MLP step at batch 25 needs 113 us of matmul and costs ~500 us through eager
autograd). Stacking the parameters of a *cohort* of nodes and running
``vmap(grad_and_value(loss))`` over them pays that overhead once per cohort step instead
of once per node step. The result equals the per-node path (:func:`lowband.train.sgd_train`)
within float tolerance, and a node's result does not depend on which other nodes share
its cohort (tested bit for bit), so it does not depend on processing order or backend
(design rule 4).

**Two ways to run a cohort step.** lowband's ``MLP`` and ``LogReg`` (:func:`mlp_layers`)
take a hand-written forward and backward (:func:`_train_mlp`: one ``baddbmm`` / ``bmm`` per
layer and direction for all the cohort's nodes, plain SGD fused into the weight-gradient
products), about 1.8x cheaper per node-step than ``vmap`` + autograd on the 784-100-10 MLP
(186 vs 331 us at 16 nodes, one thread); any other supported model takes ``vmap`` of the
forward and eager autograd (:func:`_train_vmap`). The FMNIST CNN (``cnn_fmnist``) takes
its own step (:mod:`lowband.train.cohort_cnn`: grouped convolutions over the nodes,
channels-last, batched fully connected layers; its dropout masks drawn from per-node
generators that reproduce the per-node path's), 1.6x cheaper per node-step than the
per-node path (1.5 vs 2.4 ms at 5 nodes of FedAvg's FMNIST round, one core). All equal the
per-node path within float tolerance (tests/test_cohort.py runs each). Each node's trained weights are finished
(its ``finish`` called, its new state stored) as soon as its cohort is done, so two sets
of all nodes' weights are never held at once.

**What is the same as the per-node path.** Every node draws its own minibatch order from
its own addressed generator, the very one the per-node path would use (the job carries
it), with :func:`lowband.train.batches`, so the batches are identical. Unequal step
counts (different ``n`` or ``epochs``, ``max_steps``) and unequal last-batch sizes are
masked: each node's loss is the mean over its real samples of the step, and a node whose
schedule has ended is frozen at its last step (its parameters are read then). The update
is ``torch.optim.SGD``'s (weight decay, heavy-ball or Nesterov momentum reset every call,
``clip_grad_norm_`` per node); the reported loss, step and sample counts are
``sgd_train``'s.

**What is refused** (the node then runs the per-node path, unchanged): a model with
buffers (BatchNorm running statistics), dropout (its masks come from the global RNG the
per-node path seeds per node; the FMNIST CNN's step reproduces them, on CPUs),
normalisation layers or recurrent modules; a job with a
loss other than plain cross-entropy (FedProx's proximal term, FedNTD, MOON), a trainable
subset, extra tensors or a gradient hook (SCAFFOLD, FedSPU, FedDBE).

**When it is used** (``engine.vectorize``): ``"off"`` never; ``"on"`` for every supported
job; ``"auto"`` (default) where it was measured to pay: models whose every parameter
belongs to an ``nn.Linear`` (MLPs, logistic regression) and the FMNIST CNN on a CPU. Other
convolutional models are excluded: vmapped convolutions were slower than direct ones on
CPU (docs/user-guide.md, "Engine options").
The rule depends only on the model and the job, never on timings or on how many nodes a
backend happens to hold, so every backend takes the same path and gets the same bytes.

**The hook**: an algorithm writes its local-SGD step as a :class:`LocalSGDStep` of two
methods, ``prepare(ctx, state, inbox) -> SGDJob`` and ``finish(ctx, state, inbox, params,
stats) -> (state, outbox)`` (docs/adding-an-algorithm.md). The executor side
(:mod:`lowband.engine.cohort`) hands such a step's jobs to :func:`train_cohort` (grouped by
architecture and SGD settings, in cohorts of :func:`cohort_size`) and calls each node's
``finish``. Covered: FedAvg and its server optimisers (``client_update``), DFedAvg /
DFedAvgM (``train_send``), Local (``_train``), and any plugin written this way. Not
covered: D-PSGD (one gradient per iteration, no local SGD), DFedSAM, DisPFL, and methods
with their own client step.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from lowband.heap import heap_clone
from lowband.train.cohort_cnn import is_cohort_cnn, train_cnn
from lowband.train.params import Params
from lowband.train.sgd import LossFn, TrainStats, batches, cross_entropy, sgd_train

if TYPE_CHECKING:  # pragma: no cover
    from lowband.algorithms.base import Envelope, NodeContext, Outbox, State

MODES = ("auto", "on", "off")

#: stacked parameter bytes of one CPU cohort: 16 of the paper's 784-100-10 MLP (318 KB each);
#: measured 1.3x (8 nodes), 1.6x (16), 1.5x (32) against the per-node path (docs/user-guide.md)
CPU_COHORT_BYTES = 5 * 2**20
#: most nodes in one cohort
MAX_COHORT = 64


@dataclass
class SGDJob:
    """One node's local SGD: the arguments of :func:`lowband.train.sgd_train`."""

    params: Params
    x: torch.Tensor
    y: torch.Tensor
    epochs: int
    batch_size: int
    lr: float
    gen: torch.Generator
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    loss_fn: LossFn = cross_entropy
    grad_clip: Optional[float] = None
    max_steps: Optional[int] = None
    drop_last: bool = False
    grad_hook: Optional[Callable[[nn.Module], None]] = None

    def run(self, model: nn.Module) -> tuple[Params, TrainStats]:
        """The per-node path: ``sgd_train`` on ``model``."""
        return sgd_train(model, self.params, self.x, self.y, epochs=self.epochs, batch_size=self.batch_size,
                         lr=self.lr, gen=self.gen, momentum=self.momentum, nesterov=self.nesterov,
                         weight_decay=self.weight_decay, loss_fn=self.loss_fn, grad_clip=self.grad_clip,
                         max_steps=self.max_steps, drop_last=self.drop_last, grad_hook=self.grad_hook)


# -- the mark -------------------------------------------------------------------------------
#: ``prepare(self, ctx, state, inbox) -> SGDJob``: the node's local SGD, as a job
PrepareFn = Callable[[Any, "NodeContext", "State", list["Envelope"]], SGDJob]
#: ``finish(self, ctx, state, inbox, params, stats) -> (state, outbox)``: what the node does with the result
FinishFn = Callable[[Any, "NodeContext", "State", list["Envelope"], Params, TrainStats], tuple["State", "Outbox"]]


class LocalSGDStep:
    """A step method made of two methods of the class: ``prepare`` says which local SGD the
    node runs (an :class:`SGDJob`), ``finish`` turns the trained parameters and stats into
    the node's new state and outbox. Calling the step runs
    ``finish(ctx, state, inbox, *prepare(ctx, state, inbox).run(ctx.model))``; the executor
    may instead train many actors' jobs as one vectorised cohort (:func:`train_cohort`) and
    call each node's ``finish`` with its result, the same update within float tolerance.
    Use in a class body, after the two methods::

        client_update = LocalSGDStep(client_job, client_reply)

    Subclasses may override ``prepare`` / ``finish`` (looked up by name on the instance);
    overriding the step method itself drops the mark (the per-node path then runs the
    override). The mark is an attribute of the bound function (``fn.cohort``), so it
    survives every re-wrapping of a step (faults, Ray shards, the Flower client)."""

    def __init__(self, prepare: Union[PrepareFn, str], finish: Union[FinishFn, str]):
        self.prepare = prepare if isinstance(prepare, str) else prepare.__name__
        self.finish = finish if isinstance(finish, str) else finish.__name__
        names = (self.prepare, self.finish)

        def step(obj: Any, ctx: "NodeContext", state: "State", inbox: list["Envelope"]) -> tuple["State", "Outbox"]:
            job = getattr(obj, names[0])(ctx, state, inbox)
            params, stats = job.run(ctx.model)
            return getattr(obj, names[1])(ctx, state, inbox, params, stats)

        step.cohort = names  # type: ignore[attr-defined]
        step.__doc__ = (f"Local SGD: ``{names[1]}(..., *{names[0]}(...).run(model))`` "
                        f"(vectorisable, lowband.train.cohort).")
        self.fn = step

    def __set_name__(self, owner: type, name: str) -> None:
        self.fn.__name__ = name  # Ray ships a step method by name
        self.fn.__qualname__ = f"{owner.__qualname__}.{name}"

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        return self.fn if obj is None else self.fn.__get__(obj, objtype)


def local_sgd_step(prepare: Union[PrepareFn, str], finish: Union[FinishFn, str]) -> LocalSGDStep:
    """The former spelling of :class:`LocalSGDStep` (method names as strings still accepted)."""
    return LocalSGDStep(prepare, finish)


def cohort_methods(fn: Callable[..., Any]) -> Optional[tuple[Callable[..., Any], Callable[..., Any]]]:
    """``(prepare, finish)`` bound methods when ``fn`` is a :class:`LocalSGDStep` bound to an object."""
    names = getattr(fn, "cohort", None)
    owner = getattr(fn, "__self__", None)
    if names is None or owner is None:
        return None
    return getattr(owner, names[0]), getattr(owner, names[1])


def vectorised(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a step the cohort path can take (a bound :class:`LocalSGDStep`)."""
    return cohort_methods(fn) is not None


# -- the rule ---------------------------------------------------------------------------------
_SUPPORT: "weakref.WeakKeyDictionary[nn.Module, tuple[Optional[str], bool]]" = weakref.WeakKeyDictionary()


def _model_support(model: nn.Module) -> tuple[Optional[str], bool]:
    """(why the model cannot be vectorised or None, whether it is made of Linear layers
    only), cached per module (an executor keeps one module per architecture)."""
    if model not in _SUPPORT:
        _SUPPORT[model] = _inspect(model)
    return _SUPPORT[model]


def _inspect(model: nn.Module) -> tuple[Optional[str], bool]:
    if is_cohort_cnn(model):  # its hand-written step draws the per-node path's dropout masks
        return None, False
    if any(True for _ in model.buffers()):
        return "the model has buffers (e.g. BatchNorm running statistics)", False
    linear_only = True
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return "the model has dropout (masks from the per-node seeded global RNG)", False
        if isinstance(m, (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RNNBase)):
            return f"the model has a {type(m).__name__} layer", False
        if any(True for _ in m.parameters(recurse=False)) and not isinstance(m, nn.Linear):
            linear_only = False
    return None, linear_only


def unsupported(model: nn.Module, job: SGDJob, mode: str) -> Optional[str]:
    """Why ``job`` on ``model`` takes the per-node path under ``engine.vectorize = mode``
    (None: it may be vectorised)."""
    if mode == "off":
        return "engine.vectorize = off"
    why, linear_only = _model_support(model)
    if why:
        return why
    cnn = is_cohort_cnn(model)
    if mode == "auto" and not linear_only and not cnn:
        return "auto: only Linear-layer models and the FMNIST CNN were measured to pay"
    if cnn and (job.x.device.type != "cpu" or next(model.parameters()).device.type != "cpu"):
        return "the CNN's cohort step runs on CPUs only (it reproduces the CPU generator's dropout masks)"
    if job.loss_fn is not cross_entropy:
        return "a custom loss"
    if job.grad_hook is not None:
        return "a gradient hook"
    names = [k for k, _ in model.named_parameters()]
    if set(job.params) != set(names):
        return "the parameters do not match the model"
    return None


def cohort_size(model: nn.Module, device: torch.device) -> int:
    """Nodes per cohort: on a CPU as many as keep the stacked parameters under
    :data:`CPU_COHORT_BYTES` (cache-resident; larger cohorts were not faster), elsewhere
    (GPUs) up to :data:`MAX_COHORT`."""
    if device.type != "cpu":
        return MAX_COHORT
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(1, min(MAX_COHORT, CPU_COHORT_BYTES // max(nbytes, 1)))


# -- the cohort trainer ---------------------------------------------------------------------------
def _schedule(job: SGDJob) -> list[torch.Tensor]:
    """The node's minibatches, drawn exactly as :func:`sgd_train` draws them."""
    n = int(job.y.shape[0])
    out: list[torch.Tensor] = []
    for _ in range(job.epochs):
        for idx in batches(n, job.batch_size, job.gen, drop_last=job.drop_last):
            out.append(idx)
            if job.max_steps is not None and len(out) >= job.max_steps:
                break
        if job.max_steps is not None and len(out) >= job.max_steps:
            break
    return out


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread (the caller's count restored after). With more
    threads, BLAS and oneDNN split a batched product or a grouped convolution among the
    threads by the number of nodes stacked, so the order in which a node's sums are added,
    hence their rounding, would depend on how many nodes share its cohort (measured: two
    threads change the last bits of 36 of 36 MLP nodes and 5 of 48 CNN nodes moved from one
    cohort to another). On one thread each node's slice is computed by the same code
    whatever the stack around it (tested bit for bit), so a node's update is a function
    of that node's job alone, on every backend and for every thread setting."""
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def train_cohort(model: nn.Module, jobs: Sequence[SGDJob],
                 rngs: Optional[Sequence[torch.Generator]] = None) -> list[tuple[Params, TrainStats]]:
    """Run every job's local SGD at once over stacked parameters, on one thread
    (:func:`one_thread`: a node's result must not depend on its cohort).

    All jobs share ``batch_size``, ``lr``, ``momentum``, ``nesterov``, ``weight_decay``
    and ``grad_clip`` (the caller groups them); data sizes, epochs and ``max_steps`` may
    differ. Returns, per job, what ``job.run(model)`` returns, within float tolerance.
    ``rngs``: per job, a generator in the state the global RNG has when the per-node path
    trains (the FMNIST CNN's dropout masks are drawn from it, which advances it as the
    per-node path advances the global RNG); needed for that model only."""
    with one_thread():
        return _train_cohort(model, jobs, rngs)


def _train_cohort(model: nn.Module, jobs: Sequence[SGDJob],
                  rngs: Optional[Sequence[torch.Generator]]) -> list[tuple[Params, TrainStats]]:
    j0 = jobs[0]
    B = j0.batch_size
    sd_keys = list(model.state_dict().keys())
    names = [k for k, _ in model.named_parameters()]
    like = dict(model.named_parameters())
    results: list[Optional[tuple[Params, TrainStats]]] = [None] * len(jobs)
    live: list[int] = []
    scheds: list[list[torch.Tensor]] = []
    for g, job in enumerate(jobs):
        n = int(job.y.shape[0])
        if n == 0 or job.epochs == 0:  # as sgd_train: the parameters, no steps
            results[g] = ({k: job.params[k].detach().to(like[k].dtype).clone() for k in sd_keys},
                          TrainStats(loss=float("nan"), steps=0, samples=0))
            continue
        live.append(g)
        scheds.append(_schedule(job))
    if not live:
        return results  # type: ignore[return-value]
    layers = mlp_layers(model)
    cnn = layers is None and is_cohort_cnn(model)
    if cnn:  # longest schedules first: each step trains a prefix of the cohort (train_cnn)
        order = sorted(range(len(live)), key=lambda c: -len(scheds[c]))
        live, scheds = [live[c] for c in order], [scheds[c] for c in order]
    G = len(live)
    T = max(len(s) for s in scheds)
    x0 = jobs[live[0]].x
    dev = x0.device
    # one gather per step from the concatenated data, a padding row at the end
    xcat = torch.cat([jobs[g].x for g in live] + [torch.zeros_like(x0[:1])])
    ycat = torch.cat([jobs[g].y for g in live] + [torch.zeros_like(jobs[live[0]].y[:1])])
    pad = int(xcat.shape[0]) - 1
    index = torch.full((T, G, B), pad, dtype=torch.long, device=dev)
    mask = torch.zeros((T, G, B), dtype=like[names[0]].dtype, device=dev)
    counts = torch.zeros((T, G), dtype=torch.long)
    off = 0
    for c, (g, sched) in enumerate(zip(live, scheds)):
        sizes = torch.tensor([int(i.numel()) for i in sched], dtype=torch.long)
        flat = torch.cat(sched).to(dev)
        step_of = torch.repeat_interleave(torch.arange(len(sched)), sizes)
        starts = torch.cumsum(sizes, 0) - sizes
        pos = torch.arange(int(sizes.sum())) - starts[step_of]
        index[step_of.to(dev), c, pos.to(dev)] = flat + off
        mask[step_of.to(dev), c, pos.to(dev)] = 1
        counts[: len(sched), c] = sizes
        off += int(jobs[g].y.shape[0])
    denom = counts.clamp(min=1).to(device=dev, dtype=mask.dtype)
    last = [len(s) - 1 for s in scheds]
    ends: dict[int, list[int]] = {}
    for c, t in enumerate(last):
        ends.setdefault(t, []).append(c)

    params = {k: torch.stack([jobs[g].params[k].detach().to(like[k].dtype) for g in live]).to(dev)
              for k in names}
    gens: list[Optional[torch.Generator]] = []
    if cnn:
        if rngs is None:
            raise ValueError("train_cohort: the FMNIST CNN's cohort step needs each job's dropout generator (rngs)")
        gens = [rngs[g] for g in live]
        if G == 1:  # a lone node trains beside a zero dummy (one group takes another kernel)
            params = {k: torch.cat([v, torch.zeros_like(v)]) for k, v in params.items()}
            index = torch.cat([index, torch.full_like(index, pad)], 1)
            mask = torch.cat([mask, torch.zeros_like(mask)], 1)
            counts = torch.cat([counts, torch.zeros_like(counts)], 1)
            denom = torch.cat([denom, torch.ones_like(denom)], 1)
            gens.append(None)
    elif layers is None:
        params = {k: v.requires_grad_() for k, v in params.items()}
    ps = [params[k] for k in names]
    bufs = [torch.zeros_like(p) for p in ps] if j0.momentum else []
    model.train()
    final: list[Optional[list[torch.Tensor]]] = [None] * G

    def update(grads: list[torch.Tensor], t: int, k: Optional[int] = None) -> None:
        """torch.optim.SGD's foreach steps, per node (step ``t``); ``k``: the gradients are
        those of the first ``k`` nodes only (the others' schedules have ended)."""
        ps_, bufs_ = (ps, bufs) if k is None else ([p[:k] for p in ps], [b[:k] for b in bufs])
        with torch.no_grad():
            if j0.grad_clip is not None:  # torch.nn.utils.clip_grad_norm_, per node
                norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads], 1).norm(dim=1)
                coef = (j0.grad_clip / (norms + 1e-6)).clamp(max=1.0)
                grads = [g * coef.view(-1, *([1] * (g.dim() - 1))) for g in grads]
            if j0.weight_decay:
                grads = torch._foreach_add(grads, ps_, alpha=j0.weight_decay)
            if j0.momentum:
                torch._foreach_mul_(bufs_, j0.momentum)
                torch._foreach_add_(bufs_, grads)
                d = torch._foreach_add(grads, bufs_, alpha=j0.momentum) if j0.nesterov else bufs_
            else:
                d = grads
            torch._foreach_add_(ps_, d, alpha=-j0.lr)

    def read_ends(t: int) -> None:
        for c in ends.get(t, ()):  # nodes whose schedule ends here: read them now
            # each node's weights in reusable heap memory (lowband.heap): they become its state
            final[c] = [heap_clone(p[c].detach().contiguous()) for p in ps]

    if layers is not None:  # the hand-written forward and backward of a Linear-ReLU stack
        values = _train_mlp(layers, params, names, xcat, ycat, index, mask, denom, j0, update, read_ends)
    elif cnn:  # the FMNIST CNN's: grouped convolutions over the nodes (ps: its leaves)
        values = train_cnn(params, names, xcat, ycat, index, mask, counts, denom, gens, update, read_ends, ps)
        values = [v[:G] for v in values]
    else:
        values = _train_vmap(model, params, ps, xcat, ycat, index, mask, denom, update, read_ends)

    vals = torch.stack(values).double().cpu()  # (T, G)
    counts = counts[:, :G]  # (without a dummy)
    cnt = counts.double()
    totals = torch.where(cnt > 0, vals * cnt, torch.zeros((), dtype=torch.float64)).sum(0)
    for c, g in enumerate(live):
        seen = int(counts[:, c].sum())
        out = dict(zip(names, final[c]))  # type: ignore[arg-type]
        results[g] = ({k: out[k] for k in sd_keys},
                      TrainStats(loss=float(totals[c]) / max(seen, 1), steps=len(scheds[c]), samples=seen))
    return results  # type: ignore[return-value]


def mlp_layers(model: nn.Module) -> Optional[list[tuple[str, str]]]:
    """``[(weight name, bias name)]`` of the Linear layers in order when ``model`` is exactly
    lowband's :class:`~lowband.models.mlp.MLP` (flatten, Linear-ReLU per hidden layer, a
    Linear head) or :class:`~lowband.models.mlp.LogReg` (flatten, Linear), all with biases:
    the models whose cohort step :func:`_train_mlp` writes by hand. None otherwise (a
    subclass may change ``forward``): the ``vmap`` path."""
    from lowband.models.mlp import MLP, LogReg

    if type(model) is MLP:
        mods = [model.fc1, *model.hidden_layers, model.head]
        prefix = ["fc1", *[f"hidden_layers.{i}" for i in range(len(model.hidden_layers))], "head"]
    elif type(model) is LogReg:
        mods, prefix = [model.head], ["head"]
    else:
        return None
    if any(type(m) is not nn.Linear or m.bias is None for m in mods):
        return None
    return [(f"{p}.weight", f"{p}.bias") for p in prefix]


def _train_mlp(layers: list[tuple[str, str]], params: Params, names: list[str], xcat: torch.Tensor,
               ycat: torch.Tensor, index: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor, j0: SGDJob,
               update: Callable[[list[torch.Tensor], int], None],
               read_ends: Callable[[int], None]) -> list[torch.Tensor]:
    """The cohort's steps for a Linear-ReLU stack, forward and backward written with batched
    matrix products (one ``baddbmm`` / ``bmm`` per layer and direction for all nodes): the
    gradients autograd takes through ``F.cross_entropy`` of the masked mean, a few times
    fewer operations per step than ``vmap`` + autograd (benchmarks/README.md). Plain SGD
    (no momentum, weight decay or clipping) is fused into the weight-gradient products."""
    L = len(layers)
    Ws = [params[w] for w, _ in layers]
    bs = [params[b] for _, b in layers]
    fused = not (j0.momentum or j0.weight_decay or j0.grad_clip is not None)
    lr = float(j0.lr)
    x2 = xcat.reshape(xcat.shape[0], -1)
    wts = (mask / denom.unsqueeze(-1)).unsqueeze(-1)  # (T, G, B, 1): each sample's weight in its node's loss
    shape = (*index.shape[1:], 1)  # (G, B, 1)
    neg = torch.full(shape, -1.0, dtype=wts.dtype, device=wts.device)
    values: list[torch.Tensor] = []
    with torch.no_grad():
        for t in range(index.shape[0]):
            it = index[t].reshape(-1)
            yb = ycat.index_select(0, it).view(shape)  # (G, B, 1)
            acts = [x2.index_select(0, it).view(*shape[:2], -1)]  # (G, B, in): the inputs of each layer
            for l in range(L):
                z = torch.baddbmm(bs[l].unsqueeze(1), acts[l], Ws[l].transpose(1, 2))
                if l < L - 1:
                    acts.append(z.relu_())
            logp = torch.log_softmax(z, 2)
            lp = logp.gather(2, yb).squeeze(2)  # (G, B): minus the samples' cross-entropy
            values.append((lp * mask[t]).sum(1).neg_() / denom[t])
            g = logp.exp_()  # d loss / d logits = (softmax - onehot) * weight
            g.scatter_add_(2, yb, neg)
            g.mul_(wts[t])
            grads: dict[str, torch.Tensor] = {}
            for l in reversed(range(L)):
                a = acts[l]
                nxt = torch.bmm(g, Ws[l]).mul_(a > 0) if l > 0 else None  # before W moves
                gb = g.sum(1)
                if fused:  # W -= lr * g^T a, b -= lr * sum(g): SGD's step in the products
                    Ws[l].baddbmm_(g.transpose(1, 2), a, alpha=-lr)
                    bs[l].add_(gb, alpha=-lr)
                else:
                    grads[layers[l][0]] = torch.bmm(g.transpose(1, 2), a)
                    grads[layers[l][1]] = gb
                if nxt is not None:
                    g = nxt
            if not fused:
                update([grads[k] for k in names], t)
            read_ends(t)
    return values


def _train_vmap(model: nn.Module, params: Params, ps: list[torch.Tensor], xcat: torch.Tensor, ycat: torch.Tensor,
                index: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor,
                update: Callable[[list[torch.Tensor], int], None],
                read_ends: Callable[[int], None]) -> list[torch.Tensor]:
    """The cohort's steps for any supported model: ``vmap`` of the forward, eager autograd."""
    from torch.func import functional_call, vmap

    def loss(p: Params, xb: torch.Tensor, yb: torch.Tensor, mb: torch.Tensor, db: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(functional_call(model, p, (xb,)), yb, reduction="none")
        return (ce * mb).sum() / db

    # vmap the forward only; eager autograd takes the backward of the sum of the nodes'
    # losses (each node's parameters reach only its own loss, so each gets its own
    # gradient). Measured cheaper than vmap(grad(...)), most of all for small cohorts.
    losses_fn = vmap(loss)
    values: list[torch.Tensor] = []
    for t in range(index.shape[0]):
        it = index[t]
        val = losses_fn(params, xcat[it], ycat[it], mask[t], denom[t])
        grads = list(torch.autograd.grad(val.sum(), ps))
        values.append(val.detach())
        update(grads, t)
        read_ends(t)
    return values


__all__ = ["MODES", "LocalSGDStep", "SGDJob", "cohort_methods", "cohort_size", "local_sgd_step", "mlp_layers",
           "one_thread", "train_cohort", "unsupported", "vectorised"]
