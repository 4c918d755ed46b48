"""Kernel and Jacobian math of NTK-DFL and SPARK, without materialising anything big.

Notation: ``N`` pooled samples, ``C`` classes, ``d`` parameters, ``k`` projected
dimensions. ``J`` is the per-sample Jacobian of the logits, ``N x C x d``; it is never
built on the fast paths (at the paper's size it is 3.7 GB per neighbourhood).

- :func:`trace_kernel` -- the output-averaged (trace) NTK ``K = (1/C) sum_c J_c J_c^T``
  (``N x N``). For the one-hidden-layer MLP it is a closed form of Gram matrices
  (:func:`trace_kernel_mlp`); other models use ``torch.func`` Jacobians in chunks
  (:func:`trace_kernel_generic`).
- :func:`jt_r` -- ``J^T R`` as one vector-Jacobian product (a backward pass).
- :func:`evolve_ce` -- the cross-entropy evolution ``df/dt = -(1/N) K (softmax(f) - Y)``
  on the grid ``t_s = s * lr`` by fixed-step RK4 (tested against scipy's dopri5).
- :class:`Projection` -- SPARK's fixed random projection ``P`` (``d x k``), per layer,
  seeded from (seed, layer name), Gaussian ``N(0, 1/k)`` or Kronecker-structured, with
  the structured products ``J P`` for the MLP (:meth:`Projection.jacobian_mlp`) and a
  ``torch.func`` fallback (:meth:`Projection.jacobian_generic`).
- ``*_naive`` -- the materialised reference implementations, for tests and benchmarks.

Closed form of the MLP trace kernel. For ``h = relu(W1 x + b1)``, ``f = W2 h + b2`` with
``D = relu'(W1 x + b1)`` the per-sample Jacobian rows are

    df_c/dW2[c',j] = [c=c'] h_j          df_c/db2[c'] = [c=c']
    df_c/dW1[j,i]  = W2[c,j] D_j x_i     df_c/db1[j]  = W2[c,j] D_j

so with ``x~ = [x, 1]`` and ``S_j = (1/C) sum_c W2[c,j]^2``

    K_nm = (1/C) sum_c <J_nc, J_mc> = (x~_n . x~_m) sum_j D_nj S_j D_mj + h_n . h_m + 1,

i.e. ``K = (X~ X~^T) o (D S D^T) + H H^T + 1``: about ``2 N^2 (785 + 200)`` flops.

Structured projection for the MLP. With ``P1[j, i, :]`` the rows of ``P`` for ``W1[j, i]``,
``(J P)_fc1[n, c, :] = sum_j W2[c,j] D_nj Q[n, j, :]`` where ``Q[n, j, :] = sum_i x_ni
P1[j, i, :]`` does not depend on the weights: one GEMM ``X (n x 784) @ P1 (784 x 100k)``
per node (kept across rounds by the caller), then a batched ``(C x 100) @ (100 x k)`` per
sample and weight vector, instead of materialising ``J`` (``n x C x d``) and multiplying it
by ``P``. In the paper's ``sum`` layout the ``b1`` block's rows ``sum_j W2[c,j] D_nj
P_b1[j, :]`` share the factor ``W2[c,j] D_nj``, so ``P_b1`` is added to ``Q`` once and the
two products become one.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp, vjp, vmap

from lowband.models.mlp import MLP
from lowband.seeding import torch_gen

Params = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- models


def float_names(model: nn.Module) -> list[str]:
    """Names of the trainable parameters, in ``named_parameters`` order (the flat order)."""
    return [n for n, p in model.named_parameters()]


def is_plain_mlp(model: nn.Module) -> bool:
    """True for the one-hidden-layer :class:`~lowband.models.mlp.MLP` of NTK-DFL / SPARK."""
    return isinstance(model, MLP) and len(model.hidden_layers) == 0


def logits(model: nn.Module, params: Params, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """``f(x; params)`` without autograd."""
    with torch.no_grad():
        outs = [functional_call(model, params, (x[i:i + batch],)) for i in range(0, int(x.shape[0]), batch)]
    return torch.cat(outs) if outs else torch.empty(0, device=x.device)


def mlp_parts(params: Params, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the plain MLP: flattened inputs ``X``, ReLU mask ``D`` and hidden ``H``."""
    x2 = x.flatten(1)
    pre = torch.addmm(params["fc1.bias"], x2, params["fc1.weight"].t())
    return x2, (pre > 0).to(x2.dtype), torch.relu(pre)


# --------------------------------------------------------------------------- kernels


def trace_kernel_mlp(params: Params, x: torch.Tensor) -> torch.Tensor:
    """Closed-form trace NTK of the plain MLP (see the module docstring), ``N x N``."""
    x2, d, h = mlp_parts(params, x)
    s = params["head.weight"].pow(2).mean(0)  # S_j = (1/C) sum_c W2[c, j]^2
    xx = torch.addmm(torch.ones((), dtype=x2.dtype, device=x2.device), x2, x2.t())  # X~ X~^T = X X^T + 1
    dsd = (d * s) @ d.t()
    k = xx.mul_(dsd)
    k.addmm_(h, h.t())
    k.add_(1.0)
    return k


def per_sample_jacobian(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """``J`` of the logits w.r.t. all parameters, flattened: ``n x C x d`` (small n only)."""
    names = list(params)

    def f_one(p: Params, xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (xi.unsqueeze(0),)).squeeze(0)

    jac = vmap(jacrev(f_one), in_dims=(None, 0))(params, x)  # name -> (n, C, *shape)
    n, c = x.shape[0], jac[names[0]].shape[1]
    return torch.cat([jac[k].reshape(n, c, -1) for k in names], dim=2)


def trace_kernel_generic(model: nn.Module, params: Params, x: torch.Tensor, chunk: int = 32,
                         max_cache_bytes: int = 1 << 29) -> torch.Tensor:
    """Trace NTK of any model from ``torch.func`` Jacobians in chunks of ``chunk`` samples.

    Per-chunk Jacobians (``chunk x C x d``) are kept while their total stays under
    ``max_cache_bytes``; beyond that, the column chunk is recomputed for every row chunk.
    """
    n = int(x.shape[0])
    starts = list(range(0, n, chunk))
    out = torch.empty(n, n, dtype=torch.float32, device=x.device)
    d = sum(p.numel() for p in params.values())
    c = None
    cache: dict[int, torch.Tensor] = {}
    probe = logits(model, params, x[:1])
    c = int(probe.shape[1])
    keep = n * c * d * 4 <= max_cache_bytes

    def jac(a: int) -> torch.Tensor:
        if a in cache:
            return cache[a]
        j = per_sample_jacobian(model, params, x[a:a + chunk]).reshape(min(chunk, n - a), -1)
        if keep:
            cache[a] = j
        return j

    for a in starts:
        ja = jac(a)
        for b in starts:
            if b < a:
                continue
            jb = ja if b == a else jac(b)
            blk = (ja @ jb.t()) / c
            out[a:a + chunk, b:b + chunk] = blk
            out[b:b + chunk, a:a + chunk] = blk.t()
    return out


def trace_kernel(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """The trace NTK: closed form for the plain MLP, ``torch.func`` chunks otherwise."""
    if is_plain_mlp(model):
        return trace_kernel_mlp(params, x)
    return trace_kernel_generic(model, params, x)


def trace_kernel_naive(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """Materialised reference: ``(1/C) sum_c J_c J_c^T`` from the full ``J``."""
    j = per_sample_jacobian(model, params, x)
    return torch.einsum("ncd,mcd->nm", j, j) / j.shape[1]


def gram(a: torch.Tensor, blocks: int = 5) -> torch.Tensor:
    """``a @ a.T`` computing only the blocks on and above the diagonal (about
    ``(blocks + 1) / (2 blocks)`` of the flops of a plain product): one GEMM per strip of
    rows, from its diagonal block to the last column, mirrored into the lower triangle
    (one product per strip, not one per block: about 15% faster at the paper's size, the
    same bytes)."""
    n = int(a.shape[0])
    if n < 256 or blocks <= 1:
        return a @ a.t()
    out = torch.empty(n, n, dtype=a.dtype, device=a.device)
    cuts = [round(i * n / blocks) for i in range(blocks + 1)]
    for i in range(blocks):
        lo, hi = cuts[i], cuts[i + 1]
        strip = a[lo:hi] @ a[lo:].t()  # rows lo:hi, columns lo:n
        out[lo:hi, lo:] = strip
        out[hi:, lo:hi] = strip[:, hi - lo:].t()
    return out


def projected_kernel(jt: torch.Tensor) -> torch.Tensor:
    """SPARK's projected trace kernel ``(1/C) sum_c Jt_c Jt_c^T`` from ``Jt`` (``N x C x k``)."""
    n, c = jt.shape[0], jt.shape[1]
    return gram(jt.reshape(n, -1)).div_(c)


_SCRATCH = threading.local()


def cat_scratch(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(tensors)`` written into a buffer kept per thread and reused: the same
    bytes, without a fresh allocation each call (a requester's ``N x C x k`` projected
    Jacobians are 47 MB at the paper's size, above glibc's mmap threshold, so a fresh
    ``torch.cat`` pays a page fault per 4 KB: 8x the copy itself). The result is a view of
    the buffer, valid until the next call in the same thread: use it, do not keep it."""
    shape = (sum(int(t.shape[0]) for t in tensors), *tensors[0].shape[1:])
    numel = math.prod(shape)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < numel or buf.dtype != tensors[0].dtype or buf.device != tensors[0].device:
        buf = _SCRATCH.buf = torch.empty(numel, dtype=tensors[0].dtype, device=tensors[0].device)
    out = buf[:numel].view(shape)
    torch.cat(list(tensors), out=out)
    return out


# --------------------------------------------------------------------------- J^T R, J v


def jt_r(model: nn.Module, params: Params, x: torch.Tensor, r: torch.Tensor) -> Params:
    """``J^T R`` (``sum_{n,c} R[n,c] df_nc/dw``) by one backward pass at ``params``
    (written out for the plain MLP, ``torch.func.vjp`` for any other model)."""
    r = r.to(torch.float32)
    if is_plain_mlp(model):
        return jt_r_mlp(params, x, r)
    names = float_names(model)
    rest = {k: v for k, v in params.items() if k not in names}
    _, pull = vjp(lambda p: functional_call(model, {**rest, **p}, (x,)), {k: params[k] for k in names})
    (g,) = pull(r)
    return {k: v.detach() for k, v in g.items()}


def jt_r_mlp(params: Params, x: torch.Tensor, r: torch.Tensor) -> Params:
    """The backward pass of the plain MLP with cotangent ``R`` on the logits."""
    x2, d, h = mlp_parts(params, x)
    back = (r @ params["head.weight"]) * d  # dL/dpre
    return {"fc1.weight": back.t() @ x2, "fc1.bias": back.sum(0),
            "head.weight": r.t() @ h, "head.bias": r.sum(0)}


def j_v(model: nn.Module, params: Params, x: torch.Tensor, v: Params) -> torch.Tensor:
    """``J v`` (the linearised change of the logits for a weight change ``v``): one jvp
    over the parameters named in ``v``."""
    rest = {k: t for k, t in params.items() if k not in v}
    _, out = jvp(lambda p: functional_call(model, {**rest, **p}, (x,)), ({k: params[k] for k in v},), (v,))
    return out.detach()


def jt_r_naive(j: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Materialised reference ``J^T R`` (flat, ``d``)."""
    return torch.einsum("ncd,nc->d", j, r)


# --------------------------------------------------------------------------- evolution


def power_lambda_max(a: torch.Tensor, iters: int = 30) -> float:
    """Largest eigenvalue of a symmetric PSD matrix by power iteration (an estimate)."""
    n = a.shape[0]
    v = torch.ones(n, dtype=a.dtype, device=a.device) / math.sqrt(max(n, 1))
    lam = 0.0
    for _ in range(iters):
        w = a @ v
        nrm = float(w.norm())
        if nrm == 0.0:
            return 0.0
        lam, v = nrm, w / nrm
    return lam * 1.05  # a small margin for the estimate


def auto_substeps(k: torch.Tensor, n: int, lr: float, target: float = 1.4) -> int:
    """RK4 substeps per ``lr`` interval so that ``h * lambda_max(K/N) / 2 <= target``.

    ``1/2`` bounds the eigenvalues of the softmax Jacobian, so ``h lambda_max / 2`` bounds
    the stiffness the solver meets (RK4 is stable up to 2.78). On Fashion-MNIST at the
    paper's size ``h lambda / 2 = 1.3`` at ``lr = 0.01`` gives a relative error of 2e-5
    against dopri5 at rtol 1e-10 (tests/test_ntk_ode.py).
    """
    lam = power_lambda_max(k) / max(n, 1)
    return max(1, int(math.ceil(lr * lam / 2.0 / target)))


def evolve_ce(k: torch.Tensor, f0: torch.Tensor, y: torch.Tensor, lr: float, tau_max: int,
              substeps: int = 0) -> torch.Tensor:
    """Solve ``df/dt = -(1/N) K (softmax(f) - Y)`` at ``t_s = s * lr``, ``s = 0..tau_max``.

    Fixed-step classical RK4 with ``substeps`` steps per ``lr`` interval (``0``: chosen by
    :func:`auto_substeps`). Returns ``(tau_max + 1) x N x C``.
    """
    n = int(f0.shape[0])
    a = (k / n).to(torch.float32).contiguous()  # symmetric: K V = (V^T K)^T, and V^T K is faster
    yt = y.to(torch.float32).t().contiguous()
    m = substeps or auto_substeps(k, n, lr)
    h = lr / m
    f = f0.to(torch.float32).t().contiguous()  # C x N layout throughout
    out = torch.empty((tau_max + 1, *f0.shape), dtype=torch.float32, device=f0.device)
    out[0] = f.t()

    def rhs(v: torch.Tensor) -> torch.Tensor:
        return -((torch.softmax(v, dim=0) - yt) @ a)

    for s in range(tau_max):
        for _ in range(m):
            k1 = rhs(f)
            k2 = rhs(f + (0.5 * h) * k1)
            k3 = rhs(f + (0.5 * h) * k2)
            k4 = rhs(f + h * k3)
            f = f + (h / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
        out[s + 1] = f.t()
    return out


def evolve_ce_reference(k: torch.Tensor, f0: torch.Tensor, y: torch.Tensor, lr: float, tau_max: int,
                        rtol: float = 1e-9, atol: float = 1e-11) -> torch.Tensor:
    """scipy ``solve_ivp`` (RK45 = dopri5) at tight tolerance, float64: the test reference."""
    import numpy as np
    from scipy.integrate import solve_ivp

    n, c = f0.shape
    a = (k.double() / n).cpu().numpy()
    yy = y.double().cpu().numpy()

    def rhs(t: float, v: np.ndarray) -> np.ndarray:
        z = v.reshape(n, c)
        z = z - z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        return (-(a @ (p - yy))).ravel()

    ts = np.arange(tau_max + 1) * lr
    sol = solve_ivp(rhs, (0.0, ts[-1]), f0.double().cpu().numpy().ravel(), method="RK45", t_eval=ts,
                    rtol=rtol, atol=atol)
    return torch.from_numpy(sol.y.T.reshape(tau_max + 1, n, c)).float().to(f0.device)


def residuals(fs: torch.Tensor, y: torch.Tensor, taus: Sequence[int]) -> dict[int, torch.Tensor]:
    """``R_tau = sum_{s < tau} softmax(f_{t_s}) - tau * Y`` for every candidate ``tau``."""
    p = torch.softmax(fs, dim=2)
    cum = torch.cumsum(p, dim=0)
    out = {}
    for tau in taus:
        tau = int(tau)
        s = cum[tau - 1] if tau > 0 else torch.zeros_like(y)
        out[tau] = s - tau * y
    return out


# --------------------------------------------------------------------------- projection

ProjKind = Literal["gaussian", "kron"]
#: how the per-layer blocks ``P_l`` of eq. 2-3 are combined: ``sum`` stacks them into one
#: ``d x k`` matrix (``J P = sum_l J_l P_l``, k coordinates); ``tensor`` / ``module``
#: concatenate them (block-diagonal ``P``, one block of k columns per weight tensor / per
#: module, a block with at most k entries kept whole)
Layout = Literal["sum", "tensor", "module"]


def _kron_split(k: int, rows: int = 1, cols: int = 1) -> tuple[int, int]:
    """``k = k1 * k2`` with ``k1`` and ``k2`` as close as possible to ``sqrt(k)``.

    The squared norm of ``(A (x) B)^T (a (x) b)`` is the product of two chi-square-like
    factors with ``k1`` and ``k2`` degrees of freedom, so the smaller of the two sets the
    distortion: balanced factors preserve inner products best (measured in
    docs/results/spark.md; a split following the shape, 10 x 100 for fc1, was much worse).
    """
    best = (1, k)
    for a in range(1, int(math.isqrt(k)) + 1):
        if k % a == 0:
            best = (a, k // a)
    return best


@dataclass
class Projection:
    """SPARK's fixed projection ``P`` (``d x k``), one block per parameter tensor.

    ``gaussian``: every entry ``N(0, 1/k)`` (paper eq. 2). ``kron`` (beyond the paper):
    for a weight matrix ``W`` (``out x in``) the block is ``sum_r A_r (x) B_r / sqrt(R)``
    (``R = terms``) with ``A_r`` ``out x k1`` of ``N(0, 1/k1)`` and ``B_r`` ``in x k2`` of
    ``N(0, 1/k2)``, ``k1 k2 = k`` (so each entry still has variance ``1/k`` and
    ``E[P P^T] = I``); vectors stay Gaussian. Each block is drawn from
    ``torch_gen(seed, "spark-projection", kind, k, name)`` (``R > 1`` adds ``R`` to the
    address): every node builds the same ``P`` and it is never sent.

    Storage of a Gaussian weight-matrix block is ``(in, out, k)`` (so that ``X @ P1`` is one
    GEMM); the row of ``P`` for ``W[o, i]`` is ``block[i, o, :]``. The flat parameter order
    is ``names`` (``named_parameters`` order).

    ``layout`` (see :data:`Layout`): with ``sum`` every tensor's block maps into the same k
    coordinates; with ``tensor`` (``module``) each weight tensor (module: the tensors of
    one module together) gets k coordinates of its own, ``cols[name] = (start, width)``,
    and a tensor (module) of at most k entries is kept whole (an identity block, its
    entries are coordinates: projecting it would add coordinates, not remove any). The
    random blocks are the same draws in every layout. ``dim`` is the number of coordinates.
    """

    names: list[str]
    shapes: list[tuple[int, ...]]
    k: int
    kind: ProjKind = "gaussian"
    seed: int = 0
    blocks: dict[str, object] = field(default_factory=dict)
    terms: int = 1
    layout: Layout = "sum"
    cols: dict[str, tuple[int, int]] = field(default_factory=dict)
    dim: int = 0
    #: where the blocks live and where coordinates start (:meth:`to`); built on the CPU
    on: str = "cpu"

    @staticmethod
    def groups(names: Sequence[str], layout: Layout) -> list[list[str]]:
        """The tensors that share a block: all (sum), each (tensor), per module (module)."""
        if layout == "sum":
            return [list(names)]
        if layout == "tensor":
            return [[n] for n in names]
        out: list[list[str]] = []
        for n in names:
            mod = n.rsplit(".", 1)[0]
            if out and out[-1][0].rsplit(".", 1)[0] == mod:
                out[-1].append(n)
            else:
                out.append([n])
        return out

    @classmethod
    def build(cls, params: Params, k: int, kind: ProjKind = "gaussian", seed: int = 0,
              terms: int = 1, layout: Layout = "sum") -> "Projection":
        names = [n for n, v in params.items() if v.is_floating_point()]
        p = cls(names=names, shapes=[tuple(params[n].shape) for n in names], k=int(k), kind=kind, seed=seed,
                terms=int(terms), layout=layout)
        size = {n: math.prod(sh) if sh else 1 for n, sh in zip(names, p.shapes)}
        whole: set[str] = set()
        off = 0
        for grp in cls.groups(names, layout):
            if layout != "sum" and sum(size[n] for n in grp) <= k:
                for n in grp:
                    p.cols[n] = (off, size[n])
                    off += size[n]
                    whole.add(n)
            else:
                for n in grp:
                    p.cols[n] = (off, int(k))
                off += int(k)
        p.dim = off
        for n, shape in zip(names, p.shapes):
            if n in whole:
                p.blocks[n] = ("eye",)
                continue
            extra = (int(terms),) if kind == "kron" and terms > 1 else ()
            g = torch_gen(seed, "spark-projection", kind, int(k), *extra, n)
            if len(shape) >= 2:
                out, inn = shape[0], math.prod(shape[1:])
                if kind == "kron":
                    k1, k2 = _kron_split(k, out, inn)
                    a = torch.randn(terms, out, k1, generator=g) / math.sqrt(k1 * terms)
                    b = torch.randn(terms, inn, k2, generator=g) / math.sqrt(k2)
                    p.blocks[n] = ("kron", a, b)
                else:
                    flat = torch.randn(out * inn, k, generator=g).div_(math.sqrt(k))
                    p.blocks[n] = ("dense2", flat.view(out, inn, k).permute(1, 0, 2).contiguous())
                    del flat
            else:
                d = math.prod(shape) if shape else 1
                p.blocks[n] = ("dense", torch.randn(d, k, generator=g).div_(math.sqrt(k)))
        return p

    @property
    def device(self) -> torch.device:
        """Where the blocks live, and where a node's coordinates are made (also for a
        projection of identity blocks only, which holds no tensor)."""
        return torch.device(self.on)

    def to(self, device: torch.device) -> "Projection":
        """This projection with its blocks on ``device`` (drawn on the CPU from the addressed
        generator, so every device holds the same matrix); ``self`` where they already are."""
        if torch.device(device) == self.device:
            return self
        blocks = {n: (blk[0], *(t.to(device) if isinstance(t, torch.Tensor) else t for t in blk[1:]))
                  for n, blk in self.blocks.items()}
        return replace(self, blocks=blocks, cols=dict(self.cols), on=str(torch.device(device)))

    # -- P theta and P^T g ------------------------------------------------------------
    def _sl(self, n: str) -> slice:
        s, w = self.cols[n]
        return slice(s, s + w)

    def lift(self, theta: torch.Tensor) -> Params:
        """``P theta`` as a parameter dict (the weight change of subspace coordinates)."""
        theta = theta.to(torch.float32)
        out: Params = {}
        for n, shape in zip(self.names, self.shapes):
            blk = self.blocks[n]
            t = theta[self._sl(n)]
            if blk[0] == "eye":
                out[n] = t.reshape(shape).clone()
            elif blk[0] == "kron":
                _, a, b = blk
                out[n] = torch.einsum("roa,ab,rib->oi", a, t.view(a.shape[2], b.shape[2]), b).reshape(shape)
            elif blk[0] == "dense2":
                pb = blk[1]  # (in, out, k)
                inn, o = pb.shape[0], pb.shape[1]
                out[n] = (pb.view(inn * o, -1) @ t).view(inn, o).t().reshape(shape).contiguous()
            else:
                out[n] = (blk[1] @ t).reshape(shape)
        return out

    def project(self, g: Params) -> torch.Tensor:
        """``P^T g`` (``dim``) for a parameter-shaped ``g``."""
        acc = torch.zeros(self.dim, device=self.device)
        for n, shape in zip(self.names, self.shapes):
            blk = self.blocks[n]
            v = g[n].to(torch.float32)
            a_ = acc[self._sl(n)]
            if blk[0] == "eye":
                a_ += v.reshape(-1)
            elif blk[0] == "kron":
                _, a, b = blk
                a_ += torch.einsum("roa,oi,rib->ab", a, v.reshape(a.shape[1], b.shape[1]), b).reshape(-1)
            elif blk[0] == "dense2":
                pb = blk[1]
                a_ += pb.view(-1, self.k).t() @ v.reshape(pb.shape[1], pb.shape[0]).t().reshape(-1)
            else:
                a_ += blk[1].t() @ v.reshape(-1)
        return acc

    def dense(self) -> torch.Tensor:
        """The materialised ``d x dim`` matrix (tests, benchmarks, small generic models)."""
        rows = []
        for n, shape in zip(self.names, self.shapes):
            blk = self.blocks[n]
            if blk[0] == "eye":
                b = torch.eye(self.cols[n][1], device=self.device)
            elif blk[0] == "kron":
                b = sum(torch.kron(a, bb) for a, bb in zip(blk[1], blk[2]))
            elif blk[0] == "dense2":
                b = blk[1].permute(1, 0, 2).reshape(-1, self.k)
            else:
                b = blk[1]
            row = torch.zeros(b.shape[0], self.dim, device=self.device)
            row[:, self._sl(n)] = b
            rows.append(row)
        return torch.cat(rows, 0)

    @property
    def d(self) -> int:
        return sum(math.prod(s) if s else 1 for s in self.shapes)

    # -- J P ---------------------------------------------------------------------------
    def structured(self, model: nn.Module) -> bool:
        """True when :meth:`jacobian` takes the structured MLP path."""
        return is_plain_mlp(model) and set(self.names) == {"fc1.weight", "fc1.bias", "head.weight", "head.bias"}

    def jacobian(self, model: nn.Module, x: torch.Tensor, params_list: Sequence[Params],
                 chunk: int = 64, q: Any = None) -> list[torch.Tensor]:
        """``J(x; w) P`` (``n x C x k``) for each ``w`` in ``params_list``: structured for the
        plain MLP, ``torch.func`` otherwise (``q``: see :meth:`jacobian_mlp`)."""
        if self.structured(model):
            return self.jacobian_mlp(x, params_list, chunk, q=q)
        return [self.jacobian_generic(model, p, x) for p in params_list]

    def has_xp(self) -> bool:
        """True when the structured path uses the weight-independent ``X P1`` (a Gaussian
        fc1 block; a Kronecker or identity block needs no such product)."""
        b = self.blocks.get("fc1.weight")
        return b is not None and b[0] == "dense2"

    def xp(self, x: torch.Tensor, chunk: int = 256, cols: int = 25_000, bias: bool = True) -> torch.Tensor:
        """``Q = X P1`` (``n x hidden x k``, float32): the one product of both structured paths
        (:meth:`jacobian_mlp_general` calls it too), so a cached ``Q`` holds the bytes the
        uncached path computes. Computed in blocks of ``chunk`` rows by ``cols`` columns of
        ``P1``'s flat ``(in, hidden k)`` view (each entry is the same ``in``-long dot product
        in any blocking: column blocks that stay in cache run ~1.9x faster than 64-row
        strips, tested equal bytes). On the fast path (:meth:`fast_mlp`) the bias block is
        added: ``Q[n, j] = x_n^T P1[:, j] + P_b1[j]``, the weight-independent factor that
        the ``W1`` and ``b1`` rows of ``J P`` share (see :meth:`_jacobian_mlp_fast`); that is
        the product a caller keeps across rounds and passes back as ``q`` (``bias=False``:
        ``X P1`` alone, as the general path uses it)."""
        x2 = x.flatten(1).to(torch.float32)
        p1 = self.blocks["fc1.weight"][1]  # (in, hid, k)
        inn, hid = int(p1.shape[0]), int(p1.shape[1])
        width = hid * self.k
        p1f = p1.view(inn, width)
        pb1 = self.blocks["fc1.bias"][1] if bias and self.fast_mlp() else None  # (hid, k)
        out = torch.empty(int(x2.shape[0]), hid, self.k, device=x2.device)
        flat = out.view(-1, width)
        for a in range(0, int(x2.shape[0]), chunk):
            rows = x2[a:a + chunk]
            for c0 in range(0, width, cols):
                torch.mm(rows, p1f[:, c0:c0 + cols], out=flat[a:a + chunk, c0:c0 + cols])
            if pb1 is not None:
                out[a:a + chunk].add_(pb1)
        return out

    def jacobian_mlp(self, x: torch.Tensor, params_list: Sequence[Params], chunk: int = 64,
                     q: Any = None) -> list[torch.Tensor]:
        """Structured ``J P`` for the plain MLP; the weight-independent product ``X P1`` is
        computed once (in chunks of samples) and shared by every weight vector.

        ``q``: :meth:`xp` of these ``x`` (rows aligned with ``x``; on the fast path it holds
        ``P_b1`` too) precomputed by the caller, e.g. kept across rounds
        (:class:`~lowband.algorithms.decentralised.ntk_cache.XPCache`): a float32 or float16
        tensor or a ``numpy`` array / memmap, read chunk by chunk."""
        if self.fast_mlp():
            return self._jacobian_mlp_fast(x, params_list, q=q)
        return self.jacobian_mlp_general(x, params_list, chunk, q=q)

    def fast_mlp(self) -> bool:
        """True when :meth:`jacobian_mlp` takes :meth:`_jacobian_mlp_fast`: the paper's
        case, a Gaussian ``P`` with the ``sum`` layout (every block maps into the same k
        coordinates)."""
        kinds = {n: self.blocks[n][0] for n in ("fc1.weight", "fc1.bias", "head.weight", "head.bias")
                 if n in self.blocks}
        return (self.layout == "sum" and kinds == {"fc1.weight": "dense2", "fc1.bias": "dense",
                                                    "head.weight": "dense2", "head.bias": "dense"})

    def _jacobian_mlp_fast(self, x: torch.Tensor, params_list: Sequence[Params], q: Any = None,
                           chunk: int = 64) -> list[torch.Tensor]:
        """Structured ``J P`` for a Gaussian ``P`` in the ``sum`` layout, where every block
        maps into the same k coordinates, so the ``W1`` and ``b1`` rows, which share the
        factor ``G[n, c, j] = W2[c, j] D[n, j]`` (``D`` the ReLU mask), add up inside one
        product:

            (J P)[n, c] = (sum_j h[n, j] P_W2[j, c] + P_b2[c]) + sum_j G[n, c, j] Q[n, j]

        with ``Q[n, j] = x_n^T P1[:, j] + P_b1[j]`` (:meth:`xp`; it does not depend on the
        weights: computed once per node and run by a caller that keeps it). Two GEMMs per
        weight vector instead of :meth:`jacobian_mlp_general`'s three (its ``G P_b1`` product
        is folded into ``Q``), the same products up to float rounding (tested).

        The ``w`` weight vectors of a call share one buffer laid out ``(n, w, C, k)``: the
        first term is one ``addmm`` for all of them (their ``h`` stacked sample by sample),
        the last one ``baddbmm_`` per chunk of ``chunk`` samples accumulating into it in place
        (their ``G`` stacked along the class axis, so ``Q``, the big read, is read once for
        all of them); each vector's reply is then its contiguous slice."""
        FAST_PATH_CALLS["jacobian_mlp"] += 1
        x2 = x.flatten(1).to(torch.float32)
        n = int(x2.shape[0])
        if not params_list:
            return []
        k = self.k
        hid = int(self.blocks["fc1.weight"][1].shape[1])  # stored (in, hid, k)
        p2f = self.blocks["head.weight"][1].view(hid, -1)  # (hid, C k)
        pb2 = self.blocks["head.bias"][1]  # (C, k)
        c = int(pb2.shape[0])
        w = len(params_list)
        gs: list[torch.Tensor] = []
        hs: list[torch.Tensor] = []
        for params in params_list:
            _, d, h = mlp_parts(params, x2)
            gs.append(params["head.weight"].unsqueeze(0) * d.unsqueeze(1))  # G[n, c, j] = W2[c, j] D[n, j]
            hs.append(h)
        # d f_c / d W2[c', j] = [c = c'] h_j and d f_c / d b2[c'] = [c = c']; rows (sample, vector)
        hcat = torch.stack(hs, 1).view(n * w, hid) if w > 1 else hs[0]
        out = torch.addmm(pb2.view(1, c * k), hcat, p2f).view(n, w * c, k)
        if q is None:
            q = self.xp(x2)  # the bytes a cached product holds
        gcat = torch.cat(gs, 1) if w > 1 else gs[0]  # (n, w C, hid)
        for a in range(0, n, chunk):  # d f_c / d W1[j, i] = G[c, j] x_i and d f_c / d b1[j] = G[c, j]
            b = min(a + chunk, n)
            if isinstance(q, torch.Tensor):
                qa = q[a:b].to(torch.float32)
            else:  # numpy array or (copy-on-write) memmap
                qa = torch.from_numpy(q[a:b]).to(device=x2.device, dtype=torch.float32)
            out[a:b].baddbmm_(gcat[a:b], qa)
        if w == 1:
            return [out]
        per = out.view(n, w, c, k)
        return [per[:, i].contiguous() for i in range(w)]

    def jacobian_mlp_general(self, x: torch.Tensor, params_list: Sequence[Params], chunk: int = 64,
                             q: Any = None) -> list[torch.Tensor]:
        """Structured ``J P`` for every projection kind and layout (the reference for
        :meth:`_jacobian_mlp_fast`). ``q``: ``X P1`` alone, which :meth:`xp` returns only for
        a projection off the fast path."""
        if q is not None and self.fast_mlp():
            raise ValueError("q: xp() of a fast-path projection holds P_b1 as well; the general path "
                             "takes X P1 alone (pass q=None)")
        x2 = x.flatten(1).to(torch.float32)
        n = int(x2.shape[0])
        outs: list[torch.Tensor] = []
        gs: list[torch.Tensor] = []
        hs: list[torch.Tensor] = []
        for params in params_list:
            _, d, h = mlp_parts(params, x2)
            w2 = params["head.weight"]
            gs.append(w2.unsqueeze(0) * d.unsqueeze(1))  # G[n, c, j] = W2[c, j] D[n, j]
            hs.append(h)
        c, hid = int(gs[0].shape[1]) if gs else 0, int(gs[0].shape[2]) if gs else 0
        k = self.k
        b1 = self.blocks["fc1.weight"]
        b2 = self.blocks["head.weight"]
        bb1_, bb2_ = self.blocks["fc1.bias"], self.blocks["head.bias"]
        s1, s2, sb1, sb2 = (self._sl(nm) for nm in ("fc1.weight", "head.weight", "fc1.bias", "head.bias"))
        eye_c = torch.eye(c, device=x2.device)
        for g, h in zip(gs, hs):
            out = torch.zeros(n, c, self.dim, device=x2.device)
            if bb1_[0] == "eye":  # b1
                out[:, :, sb1] += g
            else:
                out[:, :, sb1] += (g.reshape(n * c, hid) @ bb1_[1]).view(n, c, k)
            out[:, :, sb2] += eye_c.unsqueeze(0) if bb2_[0] == "eye" else bb2_[1].unsqueeze(0)  # b2
            if b2[0] == "eye":  # d f_c / d W2[c', j] = [c = c'] h_j
                out[:, :, s2] += (eye_c.view(1, c, c, 1) * h.view(n, 1, 1, hid)).reshape(n, c, c * hid)
            elif b2[0] == "kron":
                for a2, bb2 in zip(b2[1], b2[2]):  # a2: (C, k1), bb2: (hid, k2)
                    v = h @ bb2
                    out[:, :, s2] += (a2.unsqueeze(0).unsqueeze(3) * v.unsqueeze(1).unsqueeze(2)).reshape(n, c, k)
            else:
                out[:, :, s2] += (h @ b2[1].view(hid, c * k)).view(n, c, k)  # W2: P2 stored (hid, C, k)
            outs.append(out)
        if b1[0] == "eye":  # d f_c / d W1[j, i] = G[c, j] x_i
            for g, out in zip(gs, outs):
                out[:, :, s1] += (g.unsqueeze(3) * x2.view(n, 1, 1, -1)).reshape(n, c, -1)
        elif b1[0] == "kron":
            for a1, bb1 in zip(b1[1], b1[2]):  # a1: (hid, k1), bb1: (in, k2)
                v = x2 @ bb1  # (n, k2)
                for g, out in zip(gs, outs):
                    u = g @ a1  # (n, C, k1)
                    out[:, :, s1] += (u.unsqueeze(3) * v.unsqueeze(1).unsqueeze(2)).reshape(n, c, k)
        else:
            # the weight vectors' G stacked along the class axis: one bmm with w C rows per
            # sample is ~3x faster than w bmms with C rows, and gives the same bytes
            gcat = torch.cat(gs, 1) if len(gs) > 1 else gs[0]
            if q is None:
                q = self.xp(x2, bias=False)  # Q[n, j, :] = x_n^T P1[:, j, :]: what a cached product holds
            for a in range(0, n, chunk):
                if isinstance(q, torch.Tensor):
                    qa = q[a:a + chunk].to(torch.float32)
                else:  # numpy array or (copy-on-write) memmap
                    qa = torch.from_numpy(q[a:a + chunk]).to(device=x2.device, dtype=torch.float32)
                prod = torch.bmm(gcat[a:a + chunk], qa)
                for i, out in enumerate(outs):
                    out[a:a + chunk, :, s1] += prod[:, i * c:(i + 1) * c]
        return outs

    def jacobian_generic(self, model: nn.Module, params: Params, x: torch.Tensor, chunk: int = 16) -> torch.Tensor:
        """``J P`` from ``torch.func`` Jacobians of ``chunk`` samples at a time."""
        pd = self.dense()
        outs = []
        for a in range(0, int(x.shape[0]), chunk):
            j = per_sample_jacobian(model, params, x[a:a + chunk])
            outs.append(j @ pd)
        return torch.cat(outs)

    def jacobian_naive(self, model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
        """Materialised reference ``J P`` (builds ``J``: small problems only)."""
        return per_sample_jacobian(model, params, x) @ self.dense()


#: how often the fast paths ran (tests check that they are taken)
FAST_PATH_CALLS: dict[str, int] = {"jacobian_mlp": 0}

_PROJ_CACHE: dict[tuple, Projection] = {}


def cached_projection(params: Params, k: int, kind: ProjKind, seed: int, terms: int = 1,
                      layout: Layout = "sum") -> Projection:
    """The projection for (architecture, k, kind, seed, terms, layout), built once per
    process: every node would build the identical matrix from the shared seed, so one copy
    serves all. It lives on the device of ``params`` (drawn on the CPU, then moved)."""
    dev = next(iter(params.values())).device if params else torch.device("cpu")
    key = (tuple((n, tuple(v.shape)) for n, v in params.items()), int(k), kind, int(seed), int(terms), layout,
           str(dev))
    p = _PROJ_CACHE.get(key)
    if p is None:
        if len(_PROJ_CACHE) >= 2:
            _PROJ_CACHE.pop(next(iter(_PROJ_CACHE)))
        p = _PROJ_CACHE[key] = Projection.build(params, k, kind, seed, terms, layout).to(dev)
    return p


# --------------------------------------------------------------------------- distillation


def distill_schedule(round: int, warmup: int, total: int, alpha_init: float, alpha_final: float,
                     temp_init: float, temp_final: float) -> tuple[float, float]:
    """``(alpha, temperature)`` of SPARK's alg. 2 for 1-based ``round`` (``p`` clipped to [0, 1])."""
    if round <= warmup:
        return 1.0, 1.0
    p = (round - warmup) / max(total - warmup, 1)
    p = min(max(p, 0.0), 1.0)
    alpha = alpha_final + 0.5 * (alpha_init - alpha_final) * (1 + math.cos(math.pi * p))
    temp = temp_init + (temp_final - temp_init) * p
    return alpha, temp


def distill_target(y_hard: torch.Tensor, z: Optional[torch.Tensor], alpha: float, temp: float) -> torch.Tensor:
    """``alpha Y_hard + (1 - alpha) softmax(z / T)`` (``Y_hard`` when ``alpha == 1``)."""
    if z is None or alpha >= 1.0:
        return y_hard
    return alpha * y_hard + (1 - alpha) * torch.softmax(z / temp, dim=1)


def cross_entropy_soft(f: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy of logits ``f`` against (soft or one-hot) targets ``y``."""
    return float(-(torch.log_softmax(f, dim=1) * y).sum(1).mean())


__all__ = [
    "Projection", "auto_substeps", "cached_projection", "cat_scratch", "cross_entropy_soft", "distill_schedule",
    "distill_target", "evolve_ce", "evolve_ce_reference", "float_names", "is_plain_mlp", "j_v", "jt_r",
    "jt_r_naive", "logits", "mlp_parts", "per_sample_jacobian", "projected_kernel", "residuals",
    "trace_kernel", "trace_kernel_generic", "trace_kernel_mlp", "trace_kernel_naive",
]
