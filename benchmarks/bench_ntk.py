#!/usr/bin/env python
"""NTK-DFL and SPARK: one round at the paper's size, next to naive materialised code.

The paper's size: 300 nodes, a 5-regular graph, ~197 samples per node (N = 6 x 197 = 1182
pooled samples per neighbourhood), the MLP 784-100-10 (d = 79,510), C = 10, k = 1000,
tau = 100 evolution steps. A round is, per node, the *responder* work (answering its
neighbours' Jacobian requests) plus the *requester* work (kernel, evolution, update); this
script times both on real Fashion-MNIST data for one node and multiplies by 300 (all nodes
do the same work), counts the FLOPs analytically, and measures the machine's matmul rate
to show the floor. With ``--round`` it also times one real round through the engine
(messages encoded, counted and delivered; evaluation excluded).

The naive implementation materialises the per-sample Jacobian ``J`` (``n x C x d``; built
with ``torch.func.vmap(jacrev)``), forms ``(1/C) sum_c J_c J_c^T`` and ``J^T R`` from it and,
for SPARK, multiplies ``J`` by a dense ``P`` (``d x k``). It runs on a smaller neighbourhood
(``--naive-n`` samples) and its time is extrapolated to the paper's size by its FLOP count.

Usage (repository root)::

    LOWBAND_DATA=/path/to/data python benchmarks/bench_ntk.py [--threads 1] [--round] [--quick] [--quality]

With ``--threads 1`` (the default) times are the process's CPU time: what the work costs
on one idle core even when the machine is shared (up to cache and memory-bandwidth
interference); a round on two cores is about half of it (two single-threaded workers).
With more threads, wall time is measured, which is meaningful only on an idle machine.
``--quality`` measures the Gaussian and Kronecker projections' fidelity instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
#: BENCH_SRC: time another checkout's code (e.g. the commit before a change) on this script
sys.path.insert(0, os.environ.get("BENCH_SRC", str(ROOT / "src")))

from lowband.algorithms.decentralised import ntk  # noqa: E402
from lowband.models import build_model  # noqa: E402

C, D_IN, H = 10, 784, 100
D = D_IN * H + H + H * C + C  # 79,510


#: "cpu": time the process spent on CPU (what the work costs on an idle core, even when the
#: machine is shared: single-threaded runs only); "wall": elapsed time. Set by --clock.
CLOCK = "cpu"


def timeit(fn: Callable[[], object], repeats: int = 1) -> tuple[float, object]:
    clock = time.process_time if CLOCK == "cpu" else time.perf_counter
    best, out = float("inf"), None
    for _ in range(repeats):
        t = clock()
        out = fn()
        best = min(best, clock() - t)
    return best, out


def matmul_rate(n: int = 2048) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t, _ = timeit(lambda: a @ b, 5)
    return 2 * n ** 3 / t / 1e9


# --------------------------------------------------------------------------- FLOP counts


def flops_ntk_requester(n_pool: int, tau: int, substeps: int = 1) -> dict[str, float]:
    return {
        "kernel (closed form)": 2 * n_pool * H * D_IN + 2 * n_pool ** 2 * (D_IN + 1 + H + H),
        "evolution (RK4)": tau * substeps * 4 * 2 * n_pool ** 2 * C,
        "J^T R (backward)": 2 * 2 * n_pool * D,
    }


def flops_ntk_naive(n_pool: int) -> dict[str, float]:
    return {"build J (C backward passes / sample)": C * 3 * 2 * n_pool * D,
            "kernel from J": 2 * n_pool ** 2 * C * D, "J^T R from J": 2 * n_pool * C * D}


def flops_spark_responder(n: int, k: int, weights: int, groups_factor: float = 1.0) -> dict[str, float]:
    return {"X P1 (weight-independent)": groups_factor * 2 * n * D_IN * H * k,
            "J P per weight vector": weights * (2 * n * C * H * k + 2 * n * H * C * k + 2 * n * C * H * k)}


def flops_spark_requester(n_pool: int, k: int, tau: int, substeps: int = 1) -> dict[str, float]:
    return {"projected kernel": 2 * n_pool ** 2 * C * k * 5 / 8,
            "evolution (RK4)": tau * substeps * 4 * 2 * n_pool ** 2 * C, "Jt^T R": 2 * n_pool * C * k}


def flops_spark_naive(n: int, k: int) -> dict[str, float]:
    return {"build J": C * 3 * 2 * n * D, "J @ P (materialised)": 2 * n * C * D * k}


# --------------------------------------------------------------------------- workloads


def data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    from lowband.data.sources import load_dataset

    ds = load_dataset("fashion_mnist", os.environ.get("LOWBAND_DATA"))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(ds.train_y.shape[0], generator=g)[:n]
    return ds.train_x[idx], ds.train_y[idx]


def model_and_weights(count: int):
    torch.manual_seed(0)
    m = build_model("mlp", num_classes=C, input_shape=(1, 28, 28)).eval()
    base = {k: v.detach().clone() for k, v in m.named_parameters()}
    ws = [base] + [{k: v + 0.01 * torch.randn_like(v) for k, v in base.items()} for _ in range(count - 1)]
    return m, ws


def bench_ntk_requester(n_pool: int, tau: int) -> dict[str, float]:
    x, y = data(n_pool)
    m, (w,) = model_and_weights(1)
    yh = torch.nn.functional.one_hot(y, C).float()
    out = {}
    out["kernel (closed form)"], k = timeit(lambda: ntk.trace_kernel_mlp(w, x), 2)
    f0 = ntk.logits(m, w, x)
    sub = ntk.auto_substeps(k, n_pool, 0.01)
    out["evolution (RK4)"], fs = timeit(lambda: ntk.evolve_ce(k, f0, yh, 0.01, tau, sub))
    r = ntk.residuals(fs, yh, [tau])[tau]
    out["J^T R (backward)"], _ = timeit(lambda: ntk.jt_r(m, w, x, r), 3)
    out["_substeps"] = sub
    return out


def bench_ntk_naive(n: int) -> float:
    x, y = data(n)
    m, (w,) = model_and_weights(1)
    r = torch.randn(n, C)

    def naive():
        j = ntk.per_sample_jacobian(m, w, x)
        kern = torch.einsum("ncd,mcd->nm", j, j) / C
        g = ntk.jt_r_naive(j, r)
        return kern, g

    t, _ = timeit(naive, 2)  # the first call pays torch.func's tracing
    return t


def bench_spark(n: int, n_pool: int, k: int, tau: int, weights: int, kind: str) -> tuple[dict, dict, ntk.Projection]:
    x, y = data(n_pool)
    m, ws = model_and_weights(weights)
    t_p, proj = timeit(lambda: ntk.Projection.build(ws[0], k, kind, seed=0))
    resp = {"build P (once per process)": t_p}
    resp["J P for all weight vectors"], jts = timeit(lambda: proj.jacobian(m, x[:n], ws))
    jt = torch.cat([jts[0]] * (n_pool // n) + [jts[0][: n_pool - n * (n_pool // n)]])
    yh = torch.nn.functional.one_hot(y, C).float()
    req = {}
    req["projected kernel"], kern = timeit(lambda: ntk.projected_kernel(jt))
    f0 = ntk.logits(m, ws[0], x)
    sub = ntk.auto_substeps(kern, n_pool, 0.01)
    req["evolution (RK4)"], fs = timeit(lambda: ntk.evolve_ce(kern, f0, yh, 0.01, tau, sub))
    r = ntk.residuals(fs, yh, [tau])[tau]
    req["Jt^T R"], _ = timeit(lambda: torch.einsum("nck,nc->k", jt, r), 3)
    return resp, req, proj


def bench_spark_naive(n: int, proj: ntk.Projection) -> float:
    x, _ = data(n)
    m, (w,) = model_and_weights(1)
    pd = proj.dense()
    t, _ = timeit(lambda: ntk.per_sample_jacobian(m, w, x) @ pd, 2)
    return t


def projection_quality(n_pool: int, ks: tuple[int, ...], tau: int, seeds: int = 2) -> None:
    """How well does each projection preserve the kernel and the update? One real
    neighbourhood (N pooled Fashion-MNIST samples) at the shared initialisation: the
    relative Frobenius error of the projected kernel, the cosine between the projected
    update ``P dtheta`` and NTK-DFL's ``dw``, and the pooled cross-entropy after each."""
    x, y = data(n_pool, seed=1)
    m, (w,) = model_and_weights(1)
    yh = torch.nn.functional.one_hot(y, C).float()
    names = list(w)
    lr = 0.01
    kern = ntk.trace_kernel_mlp(w, x)
    f0 = ntk.logits(m, w, x)
    fs = ntk.evolve_ce(kern, f0, yh, lr, tau)
    dw = ntk.jt_r(m, w, x, ntk.residuals(fs, yh, [tau])[tau])
    dw = torch.cat([(-(lr / n_pool) * dw[k]).reshape(-1) for k in names])

    def ce(delta: torch.Tensor) -> float:
        off, cand = 0, {}
        for k in names:
            cand[k] = w[k] + delta[off:off + w[k].numel()].view_as(w[k])
            off += w[k].numel()
        return ntk.cross_entropy_soft(ntk.logits(m, cand, x), yh)

    print(f"projection quality, N = {n_pool}, tau = {tau}, at the initial weights "
          f"(CE before {ce(torch.zeros_like(dw)):.4f}, after NTK-DFL's update {ce(dw):.4f}):")
    print("  kind      terms  k     seed  |K~-K|/|K|  cos(P dtheta, dw)  CE after  time J P")
    for kind, terms in (("gaussian", 1), ("kron", 1), ("kron", 4), ("kron", 16)):
        for k in ks:
            for seed in range(seeds):
                proj = ntk.Projection.build(w, k, kind, seed=seed, terms=terms)
                t0 = time.perf_counter()
                jt = proj.jacobian(m, x, [w])[0]
                t_j = time.perf_counter() - t0
                kt = ntk.projected_kernel(jt)
                fst = ntk.evolve_ce(kt, f0, yh, lr, tau)
                dth = -(lr / n_pool) * torch.einsum("nck,nc->k", jt, ntk.residuals(fst, yh, [tau])[tau])
                lifted = proj.lift(dth)
                pd = torch.cat([lifted[k2].reshape(-1) for k2 in names])
                err = float((kt - kern).norm() / kern.norm())
                cos = float(pd @ dw / (pd.norm() * dw.norm()))
                print(f"  {kind:<8} {terms:>5} {k:>5} {seed:>6}  {err:10.4f}  {cos:17.4f}  {ce(pd):8.4f}  {t_j:7.2f} s")
                del proj, jt


def engine_round(alg: str, threads: int) -> float:
    """Round 1 of the paper's config through the real engine (no evaluation)."""
    import tempfile

    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation

    cfg = ROOT / "experiments" / "spark" / f"{alg}_a0.1.toml"
    with tempfile.TemporaryDirectory() as tmp:
        extra = [f'algorithm.scratch_dir="{tmp}/scratch"', "algorithm.max_inflight_mb=500"] if alg == "spark" else []
        exp = load_experiment(cfg, [f"out_dir=\"{tmp}/r\"", "rounds=1", f"threads={threads}", "eval.at_round0=false",
                                    "eval.every=1000", "checkpoint_every=0", 'eval.protocols=["consensus"]', *extra])
        sim = Simulation(exp)
        clock = time.process_time if CLOCK == "cpu" else time.perf_counter
        t = clock()
        plan = sim.topology.plan(0)
        sim.executor.init_states(plan)
        inboxes: dict = {}
        for step in sim.alg.steps(1, plan):
            outboxes = sim.executor.run_step(step, 1, plan, inboxes)
            inboxes = sim.route(1, outboxes)
        return clock() - t


def engine_rounds(alg: str, nodes: int, rounds: int, extra: list[str]) -> list[tuple[float, float]]:
    """``rounds`` rounds of the paper's config through the engine at ``nodes`` nodes (same
    per-node data, graph degree and model; no evaluation), single-threaded. Every node does
    the same work per round, so a round at 300 nodes costs about ``300 / nodes`` times as
    much; the memory budgets (``max_inflight_mb``, ``xp_cache_mb``) are scaled by
    ``nodes / 300`` so that the requester groups and the share of nodes whose ``X P`` stays
    in RAM (the rest: memory-mapped files in the run folder's scratch/) match the paper's
    size. Returns (wall seconds, process CPU seconds) per round."""
    import tempfile

    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation

    cfg = ROOT / "experiments" / "spark" / f"{alg}_a0.1.toml"
    scale = nodes / 300
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        budget = [f"algorithm.max_inflight_mb={2000 * scale}"]
        from lowband.algorithms import ALGORITHMS

        if "xp_cache_mb" in ALGORITHMS[alg].Hyperparams.model_fields:  # absent before the cache existed
            budget.append(f"algorithm.xp_cache_mb={2000 * scale}")
        exp = load_experiment(cfg, [f"out_dir=\"{tmp}/r\"", f"rounds={rounds}", "threads=1", "eval.at_round0=false",
                                    f"data.num_clients={nodes}", "eval.every=1000", "checkpoint_every=0",
                                    'eval.protocols=["consensus"]', *budget, *extra])
        sim = Simulation(exp)
        sim.executor.init_states(sim.topology.plan(0))
        out = []
        for r in range(1, rounds + 1):
            w, c = time.perf_counter(), time.process_time()
            plan = sim.topology.plan(r - 1)
            inboxes: dict = {}
            for step in sim.alg.steps(r, plan):
                outboxes = sim.executor.run_step(step, r, plan, inboxes)
                inboxes = sim.route(r, outboxes)
            out.append((time.perf_counter() - w, time.process_time() - c))
            print(f"  {alg} round {r}: {out[-1][0]:7.1f} s wall, {out[-1][1]:7.1f} s CPU  "
                  f"(x {300 / nodes:.0f} = {out[-1][0] * 300 / nodes / 60:5.1f} min at 300 nodes)", flush=True)
        caches = getattr(getattr(sim.alg, "ops", None), "caches", None)
        cache = caches and caches._xp_cache
        if cache is not None:
            print(f"  X P cache: {cache.stats}, {cache.ram_bytes / 1e6:.0f} MB RAM, {cache.disk_bytes / 1e6:.0f} MB files")
    return out


def fmt(s: float) -> str:
    return f"{s:8.2f} s" if s < 600 else f"{s / 60:8.1f} min"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--tau", type=int, default=100)
    ap.add_argument("--naive-n", type=int, default=48, help="samples of the naive (materialised) runs")
    ap.add_argument("--round", action="store_true", help="also time one real engine round of each (minutes)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes: a smoke test, not a measurement")
    ap.add_argument("--quality", action="store_true", help="only the Gaussian-vs-Kronecker projection quality")
    ap.add_argument("--engine", type=int, default=0, metavar="NODES",
                    help="only: rounds of NTK-DFL and SPARK through the engine at NODES nodes (e.g. 30), "
                         "extrapolated to 300 (see engine_rounds)")
    ap.add_argument("--engine-rounds", type=int, default=2, help="rounds per method with --engine")
    ap.add_argument("--engine-algs", default="ntk_dfl,spark", help="comma-separated configs with --engine")
    ap.add_argument("--set", action="append", default=[], help="a config override for --engine (repeatable)")
    ap.add_argument("--clock", choices=["cpu", "wall"], default=None,
                    help="cpu: process CPU time (default with --threads 1; meaningful on a shared machine); "
                         "wall: elapsed time (default with more threads)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = args.clock or ("cpu" if args.threads == 1 else "wall")
    nodes, n, n_pool, k, tau = 300, 197, 6 * 197, args.k, args.tau
    if args.quick:
        nodes, n, n_pool, k, tau, args.naive_n = 300, 50, 300, 200, 20, 16
    print(f"threads={args.threads}  clock={CLOCK}  load average {os.getloadavg()[0]:.2f}  torch {torch.__version__}")
    if args.quality:
        projection_quality(300 if args.quick else n_pool, (200,) if args.quick else (500, 1000), tau)
        return
    if args.engine:
        import lowband

        print(f"engine rounds at {args.engine} nodes, code from {Path(lowband.__file__).parent}")
        res = {a: engine_rounds(a, args.engine, args.engine_rounds, args.set) for a in args.engine_algs.split(",")}
        if "ntk_dfl" in res and "spark" in res:
            ref = min(c for _, c in res["ntk_dfl"])
            print("SPARK / NTK-DFL per round (CPU): " + ", ".join(f"round {r + 1}: {c / ref:.2f}x"
                                                               for r, (_, c) in enumerate(res["spark"])))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    rate = matmul_rate(1024 if args.quick else 2048)
    print(f"matmul rate (2048^3 fp32, per {CLOCK} second): {rate:.1f} GFLOP/s\n")

    # ---- NTK-DFL
    t_req = bench_ntk_requester(n_pool, tau)
    sub = t_req.pop("_substeps")
    f_req = flops_ntk_requester(n_pool, tau, sub)
    t_node = sum(t_req.values())
    print(f"NTK-DFL, one requester (N = {n_pool}, tau = {tau}, RK4 substeps = {sub}):")
    for key, t in t_req.items():
        print(f"  {key:<34} {fmt(t)}  {f_req[key] / 1e9:9.2f} GFLOP  {f_req[key] / 1e9 / max(t, 1e-9):7.1f} GFLOP/s")
    naive_t = bench_ntk_naive(args.naive_n)
    f_naive_small = sum(flops_ntk_naive(args.naive_n).values())
    f_naive = sum(flops_ntk_naive(n_pool).values())
    print(f"  round = {nodes} requesters:            {fmt(nodes * t_node)}  {nodes * sum(f_req.values()) / 1e12:7.2f} TFLOP")
    print(f"  naive materialised, N = {args.naive_n}:       {fmt(naive_t)}  {f_naive_small / 1e9:9.2f} GFLOP")
    print(f"  naive extrapolated to N = {n_pool}: {fmt(naive_t * f_naive / f_naive_small)} per requester, "
          f"{fmt(nodes * naive_t * f_naive / f_naive_small)} per round ({nodes * f_naive / 1e15:.2f} PFLOP)\n")

    # ---- SPARK
    for kind in ("gaussian", "kron"):
        resp, req, proj = bench_spark(n, n_pool, k, tau, 6, kind)
        t_build = resp.pop("build P (once per process)")
        f_resp = sum(flops_spark_responder(n, k, 6).values()) if kind == "gaussian" else \
            6 * 2 * n * C * (H + 1) * k
        f_req = flops_spark_requester(n_pool, k, tau)
        t_resp, t_rq = sum(resp.values()), sum(req.values())
        print(f"SPARK ({kind} P, k = {k}), build P once: {t_build:.2f} s")
        print(f"  responder: J P for 6 weight vectors (n = {n}) {fmt(t_resp)}  {f_resp / 1e9:9.2f} GFLOP")
        for key, t in req.items():
            print(f"  requester: {key:<24} {fmt(t)}  {f_req[key] / 1e9:9.2f} GFLOP")
        print(f"  round = {nodes} x (responder + requester): {fmt(nodes * (t_resp + t_rq))}  "
              f"{nodes * (f_resp + sum(f_req.values())) / 1e12:7.2f} TFLOP")
        if kind == "gaussian":
            for factor in (2.0, 2.5):
                print(f"    with X P1 recomputed {factor}x (requester groups bound the memory): "
                      f"{fmt(nodes * (t_rq + t_resp + (factor - 1) * t_resp * 0.9))}")
            naive_s = bench_spark_naive(args.naive_n, proj)
            f_small = sum(flops_spark_naive(args.naive_n, k).values())
            f_full = sum(flops_spark_naive(n, k).values()) * 6  # 6 weight vectors per responder
            print(f"  naive J @ P, n = {args.naive_n}, one weight vector: {fmt(naive_s)}  {f_small / 1e9:9.1f} GFLOP")
            print(f"  naive extrapolated: {fmt(naive_s * f_full / f_small)} per responder, "
                  f"{fmt(nodes * naive_s * f_full / f_small)} per round ({nodes * f_full / 1e15:.1f} PFLOP)")
        print()
    if args.round:
        for alg in ("ntk_dfl", "spark"):
            print(f"engine round 1, {alg} (paper config, {args.threads} threads, no evaluation): "
                  f"{fmt(engine_round(alg, args.threads))}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
