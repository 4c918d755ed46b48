#!/usr/bin/env python
"""How far is one round from the FLOP floor?  (DESIGN.md, "Speed habits": know the floor.)

For each workload (a baseline config from ``experiments/baselines``) this script

1. measures this machine's fp32 matmul rate once, for a large square matmul (the
   optimistic rate) and, per workload, for the FLOP-carrying ops that one training step
   really runs (the linear/conv forward and backward ops, recorded from one step with a
   dispatch mode and replayed in a tight loop at their real shapes: the honest rate for
   batch-25 / batch-32 shapes);
2. counts the FLOPs one round needs: ``torch.utils.flop_counter.FlopCounterMode`` on one
   forward+backward of a real batch, per sample, times the samples the round's
   participants train on (epochs x n_train each), cross-checked against an analytic
   count (Linear/Conv2d hooks) and against one node's whole local training run under
   the counter;
3. times round 1 through the real engine (``lowband.engine.simulator.Simulation`` built
   from the config with ``rounds=1``, a temporary ``out_dir``, ``eval.at_round0=false``,
   no checkpoint), ``--repeats`` times, reading ``round_s`` (training + messaging) and
   ``eval_s`` from ``timing.jsonl``; ``Network.send`` / ``Network.broadcast`` are wrapped
   to time the encode / count / decode work on their own;
   Process CPU time is recorded next to wall time: with ``--threads 1`` it is robust to
   other processes on the machine;
4. times a bare PyTorch training step (forward, backward, SGD step on one batch, no
   engine), profiles it, times ``sgd_train`` on one node, and runs a vectorised probe
   (``torch.func.vmap`` over the stacked parameters of groups of 8, 32 and all the round's
   nodes) to show where the time goes and what would close the gap;
5. prints the tables (and writes them as JSON with ``--json``).

Usage (from the repository root)::

    LOWBAND_DATA=/path/to/data python benchmarks/bench_rounds.py [--quick] [--repeats N]
        [--threads T] [--workloads fedavg,dfedavg] [--json out.json] [--no-probe]

``--quick`` shrinks the workloads (fewer clients, fewer epochs, a 512^3 matmul) so the
whole script runs in well under a minute; it is a smoke test, not a measurement.
Timings are only meaningful on an otherwise idle machine: the script prints the load
average before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from _common import analytic_flops, big_matmul_rate, cpu_model, loadavg, step_flops  # noqa: E402
from _common import fmt_flops as _fmt_flops  # noqa: E402
from _common import table as _table  # noqa: E402
from _common import time_loop as _time_loop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS: dict[str, dict[str, Any]] = {
    "fedavg": {
        "label": "FedAvg  cnn_fmnist  100 cl, 10/round, B32, E5",
        "quick_label": "FedAvg  cnn_fmnist  100 cl, 2/round, B32, E1 (quick)",
        "config": "experiments/baselines/fedavg_fmnist_dir03.toml",
        "quick": ["topology.count=2", "algorithm.local_epochs=1", 'eval.protocols=["global"]',
                  "eval.main=global/acc"],
    },
    "dfedavg": {
        "label": "DFedAvg mlp 784-100-10  300 nodes, 5-reg, B25, E20",
        "quick_label": "DFedAvg mlp  30 nodes, 5-reg, B25, E2 (quick)",
        "config": "experiments/baselines/dfedavg_fmnist_ntkfl_a01.toml",
        "quick": ["data.num_clients=30", "algorithm.local_epochs=2", 'eval.protocols=["consensus"]'],
    },
}


# ------------------------------------------------------------------------------------------
# machine
# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
# FLOPs: counter, analytic cross-check, and the ops of one step replayed at their shapes
# ------------------------------------------------------------------------------------------
class _OpRecorder(TorchDispatchMode):
    """Records (op, cloned args) of every op FlopCounterMode knows how to count."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func._overloadpacket in flop_registry:
            keep = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
            self.ops.append((func, tree_map(keep, args), tree_map(keep, kwargs)))
        return out


def _describe(func: Any, args: tuple[Any, ...]) -> str:
    shapes = ["x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor) and a.dim() > 1]
    return f"{func._overloadpacket.__name__}({', '.join(shapes)})"


def small_shape_rate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget_s: float) -> dict[str, Any]:
    """Record the FLOP-carrying ops of one forward+backward step and time each in a tight
    loop at its real shape. Rate = step FLOPs / sum of the ops' times (no Python, no
    autograd bookkeeping, no elementwise ops: the floor for these shapes)."""
    model.train()
    model.zero_grad(set_to_none=True)
    rec = _OpRecorder()
    with rec:
        F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    per_op = max(budget_s / max(len(rec.ops), 1), 0.02)
    rows, tot_flops, tot_s = [], 0, 0.0
    with torch.no_grad():
        for func, args, kwargs in rec.ops:
            with FlopCounterMode(display=False) as fc:
                func(*args, **kwargs)
            flops = int(fc.get_total_flops())
            # per-call minimum: on a loaded machine a 2-thread parallel region can wait a whole
            # scheduler slice, so averages over blocks of calls are meaningless
            best, _, _ = _time_loop(lambda: func(*args, **kwargs), per_op, min_reps=20)
            rows.append({"op": _describe(func, args), "flops": flops, "us": best * 1e6,
                         "gflops": flops / best / 1e9})
            tot_flops += flops
            tot_s += best
    return {"ops": rows, "step_flops": tot_flops, "step_s": tot_s, "gflops": tot_flops / tot_s / 1e9}


def bare_step_time(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float,
                   budget_s: float) -> tuple[float, float]:
    """(best, median) seconds per plain PyTorch SGD step (zero_grad, forward, loss, backward,
    step) on one batch: what ``sgd_train``'s inner loop costs without the engine around it."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    best, med, _ = _time_loop(step, budget_s, min_reps=20)
    return best, med


def profile_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int,
                 top: int = 8) -> list[dict[str, Any]]:
    """The ops a plain SGD step spends its time in (torch.profiler, self CPU time per step)."""
    from torch.profiler import ProfilerActivity, profile

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    return [{"op": e.key, "us_per_step": e.self_cpu_time_total / steps, "share": e.self_cpu_time_total / total,
             "calls_per_step": e.count / steps} for e in rows[:top]]


def vmap_step_time(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor, lr: float,
                   budget_s: float) -> tuple[float, float, Optional[str]]:
    """Seconds per *vectorised* SGD step of ``xs.shape[0]`` nodes at once: the nodes'
    parameters stacked, ``vmap(grad(loss))`` over them, one fused update. A probe of what
    batching many nodes' local training would buy, not an engine implementation.
    Returns (best, median, error note or None)."""
    from torch.func import functional_call, grad, vmap

    model.train()
    n = xs.shape[0]
    params = {k: v.detach().unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in model.named_parameters()}
    buffers = {k: v for k, v in model.named_buffers()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, (p, buffers), (x,)), y)

    g = vmap(grad(loss), randomness="different")

    def step() -> None:
        gs = g(params, xs, ys)
        torch._foreach_add_(list(params.values()), list(gs.values()), alpha=-lr)

    try:
        best, med, _ = _time_loop(step, budget_s)
    except Exception as exc:  # pragma: no cover - depends on torch's vmap coverage
        return float("nan"), float("nan"), f"{type(exc).__name__}: {exc}"
    return best, med, None


def vmap_groups(model_fn: Callable[[], nn.Module], xs: torch.Tensor, ys: torch.Tensor, lr: float,
                budget_s: float, sizes: tuple[int, ...] = (8, 32)) -> list[dict[str, Any]]:
    """:func:`vmap_step_time` for groups of several sizes (up to all ``xs.shape[0]`` nodes):
    on a CPU, stacking every node's weights can fall out of cache, so smaller groups may win."""
    n = int(xs.shape[0])
    out = []
    for g in sorted({min(s, n) for s in sizes} | {n}):
        best, med, note = vmap_step_time(model_fn(), xs[:g], ys[:g], lr, budget_s)
        out.append({"group": g, "best_s": best, "median_s": med, "note": note,
                    "us_per_node_step": best / g * 1e6 if note is None else float("nan")})
    return out


def forward_pass_time(model: nn.Module, x: torch.Tensor, batch_size: int, reps: int = 2) -> float:
    """Best wall seconds for one eval-mode forward pass over ``x`` in batches of ``batch_size``."""
    from lowband.train import predict_logits

    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        predict_logits(model, None, x, batch_size)
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------
class _Stopwatch:
    """Wraps ``obj.name`` (an instance attribute) and sums its wall and process-CPU time."""

    def __init__(self, obj: Any, *names: str) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.calls = 0
        for name in names:
            setattr(obj, name, self._wrap(getattr(obj, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.cpu_seconds += time.process_time() - c0
                self.calls += 1

        return timed


@dataclass
class Result:
    name: str
    label: str
    threads: int
    model: str
    model_params: int
    nodes_trained: int
    batch_size: int
    local_epochs: int
    steps: int
    max_node_steps: int
    samples: int
    flops_per_sample: float
    flops_check_analytic_per_sample: float
    flops_check_one_node: dict[str, Any]
    round_flops: float
    small_shape: dict[str, Any]
    bare_step_s: float
    bare_step_best_s: float
    step_profile: list[dict[str, Any]]
    sgd_train_step_s: float
    sgd_train_step_cpu_s: float
    vmap: list[dict[str, Any]]
    eval_fwd_10k_s: dict[str, float]
    eval_flops: float = float("nan")
    train_s: list[float] = field(default_factory=list)
    train_cpu_s: list[float] = field(default_factory=list)
    comm_s: list[float] = field(default_factory=list)
    comm_calls: int = 0
    bytes_round: int = 0
    eval_s: list[float] = field(default_factory=list)
    eval_cpu_s: list[float] = field(default_factory=list)
    setup_s: list[float] = field(default_factory=list)


def _overrides(base: list[str], out_dir: str, threads: int) -> list[str]:
    return [*base, "rounds=1", f"out_dir={out_dir}", "eval.at_round0=false", "checkpoint_every=0",
            f"threads={threads}"]


def bench_workload(key: str, *, quick: bool, repeats: int, threads: int, probe: bool,
                   budget: float, log: Callable[[str], None]) -> Result:
    """Static analysis (FLOPs, rates, probes), then ``repeats`` timed engine rounds."""
    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation, make_federation

    wl = WORKLOADS[key]
    base = list(wl["quick"]) if quick else []
    cfg = ROOT / wl["config"]
    res: Optional[Result] = None
    with tempfile.TemporaryDirectory(prefix=f"bench_{key}_") as tmp:
        exp0 = load_experiment(cfg, _overrides(base, str(Path(tmp) / "probe"), threads))
        t0 = time.perf_counter()
        fed = make_federation(exp0)
        log(f"[{key}] federation built in {time.perf_counter() - t0:.1f}s: {fed!r}")

        for rep in range(repeats):
            exp = load_experiment(cfg, _overrides(base, str(Path(tmp) / f"rep{rep}"), threads))
            t0 = time.perf_counter()
            sim = Simulation(exp, federation=fed)
            setup = time.perf_counter() - t0
            if res is None:  # before the first timed round, so it also warms the kernels up
                res = static_analysis(key, quick, sim, probe, budget, log)
            comm = _Stopwatch(sim.network, "send", "broadcast")
            steps_sw = _Stopwatch(sim.executor, "run_step")
            eval_sw = _Stopwatch(sim, "_evaluate")
            sim.run()
            timing = [json.loads(line) for line in (Path(exp.run_dir()) / "timing.jsonl").read_text().splitlines()]
            rnd = [t for t in timing if t["round"] == 1][0]
            if rep == 0:
                res.comm_calls = comm.calls
                res.bytes_round = int(sim.byte_record(1)["bytes/total"])
            res.train_s.append(float(rnd["round_s"]))
            res.eval_s.append(float(rnd["eval_s"]))
            res.comm_s.append(comm.seconds)
            res.setup_s.append(setup)
            res.train_cpu_s.append(steps_sw.cpu_seconds + comm.cpu_seconds)
            res.eval_cpu_s.append(eval_sw.cpu_seconds)
            log(f"[{key}] repeat {rep + 1}/{repeats}: train+comm {rnd['round_s']:.2f}s "
                f"(cpu {res.train_cpu_s[-1]:.2f}s; send/bcast {comm.seconds:.3f}s, {comm.calls} calls)  "
                f"eval {rnd['eval_s']:.2f}s (cpu {eval_sw.cpu_seconds:.2f}s)  setup {setup:.2f}s  "
                f"load {loadavg()}")

        # evaluation FLOPs: one more evaluation of the last run's state, under the counter
        with FlopCounterMode(display=False) as fc:
            sim.evaluator(1, sim.topology.plan(0))
        assert res is not None
        res.eval_flops = float(fc.get_total_flops())
    assert res is not None
    return res


def static_analysis(key: str, quick: bool, sim: Any, probe: bool, budget: float,
                    log: Callable[[str], None]) -> Result:
    """FLOP counts, small-shape rate, bare step, profile, sgd_train, vmap and eval probes."""
    from lowband.engine.simulator import model_options
    from lowband.models import build_model, count_params
    from lowband.train import sgd_train

    wl, fed, exp = WORKLOADS[key], sim.fed, sim.exp
    hp = sim.alg.hp
    bs, epochs, lr = int(hp.batch_size), int(hp.local_epochs), float(hp.lr)
    plan = sim.topology.plan(0)  # round 1's plan (topology rounds are 0-based)
    nodes = [n for n in plan.participants if n >= 0]
    n_train = {n: int(fed.nodes[n].n_train) for n in nodes}
    node_steps = {n: epochs * math.ceil(n_train[n] / bs) for n in nodes}
    samples = sum(epochs * n_train[n] for n in nodes)
    opts = model_options(exp, fed)

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return build_model(exp.model.name, num_classes=fed.num_classes, input_shape=tuple(fed.input_shape), **opts)

    model = fresh()
    donor = max(nodes, key=lambda n: n_train[n])
    nd = fed.nodes[donor]
    x, y = nd.train_x[:bs], nd.train_y[:bs]
    b = int(y.shape[0])
    per_sample = step_flops(model, x, y) / b
    analytic = analytic_flops(model, x) / b

    # one node's whole local training: under the counter (vs the prediction), then timed
    m1 = fresh()
    p1 = {k: v.detach().clone() for k, v in m1.state_dict().items()}

    def one_node() -> None:
        sgd_train(m1, p1, nd.train_x, nd.train_y, epochs=epochs, batch_size=bs, lr=lr,
                  gen=torch.Generator().manual_seed(0))

    with FlopCounterMode(display=False) as fc:
        one_node()
    check = {"node": donor, "n_train": n_train[donor], "counted": int(fc.get_total_flops()),
             "predicted": int(round(per_sample * epochs * n_train[donor]))}
    log(f"[{key}] FLOPs/sample fwd+bwd: counter {per_sample:,.0f}, analytic {analytic:,.0f}; one node "
        f"({n_train[donor]} samples x {epochs} ep): counted {check['counted']:.4g} vs predicted "
        f"{check['predicted']:.4g}")
    t0, c0 = time.perf_counter(), time.process_time()
    one_node()
    sgd_wall, sgd_cpu = time.perf_counter() - t0, time.process_time() - c0

    small = small_shape_rate(fresh(), x, y, budget)
    bare_best, bare = bare_step_time(fresh(), x, y, lr, budget)
    prof = profile_step(fresh(), x, y, lr, steps=10 if quick else 50)
    log(f"[{key}] small-shape rate {small['gflops']:.1f} GFLOP/s; bare step best {bare_best * 1e6:.0f} us, "
        f"median {bare * 1e6:.0f} us; sgd_train {sgd_wall / node_steps[donor] * 1e6:.0f} us/step")

    vm: list[dict[str, Any]] = []
    if probe:
        ok = [n for n in nodes if n_train[n] >= bs]
        xs = torch.stack([fed.nodes[n].train_x[:bs] for n in ok])
        ys = torch.stack([fed.nodes[n].train_y[:bs] for n in ok])
        log(f"[{key}] vmap probe over groups of up to {xs.shape[0]} nodes, batch {bs}")
        vm = vmap_groups(fresh, xs, ys, lr, budget)

    tx = fed.global_test_x[: 4000 if quick else 10000]
    scale = 10000 / max(int(tx.shape[0]), 1)
    m = fresh()
    fwd = {str(eb): forward_pass_time(m, tx, eb) * scale for eb in (exp.eval.batch_size, 256)}

    return Result(
        name=key, label=wl["quick_label"] if quick else wl["label"], threads=torch.get_num_threads(),
        model=exp.model.name, model_params=count_params(model), nodes_trained=len(nodes), batch_size=bs,
        local_epochs=epochs, steps=sum(node_steps.values()), max_node_steps=max(node_steps.values()),
        samples=samples, flops_per_sample=per_sample, flops_check_analytic_per_sample=analytic,
        flops_check_one_node=check, round_flops=per_sample * samples, small_shape=small, bare_step_s=bare,
        bare_step_best_s=bare_best, step_profile=prof, sgd_train_step_s=sgd_wall / node_steps[donor],
        sgd_train_step_cpu_s=sgd_cpu / node_steps[donor], vmap=vm, eval_fwd_10k_s=fwd,
    )


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------
def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _best_vmap(r: Result) -> Optional[dict[str, Any]]:
    ok = [v for v in r.vmap if v["note"] is None]
    return min(ok, key=lambda v: v["us_per_node_step"]) if ok else None


def report(results: list[Result], big: dict[str, float], meta: dict[str, Any]) -> str:
    """The tables and the per-workload details, as Markdown."""
    rate_big = big["gflops_floor"] * 1e9
    out = [f"big matmul {big['n']}^3 fp32, {meta['threads']} threads: wall best {big['gflops_best']:.1f} GFLOP/s, "
           f"median {big['gflops_median']:.1f}; from CPU time {big['gflops_cpu']:.1f}; floor rate used "
           f"{big['gflops_floor']:.1f} GFLOP/s"]
    for r in results:
        out.append(f"small-shape rate, {r.name}: the FLOP ops of one B={r.batch_size} forward+backward, "
                   f"replayed at their shapes (best per call): {r.small_shape['gflops']:.1f} GFLOP/s")
    out.append("")
    rows = []
    for r in results:
        tr, ev = _med(r.train_s), _med(r.eval_s)
        fb = r.round_flops / rate_big
        fs = r.round_flops / (r.small_shape["gflops"] * 1e9)
        rows.append([r.label, _fmt_flops(r.round_flops), f"{fb:.2f}", f"{fs:.2f}", f"{tr:.2f}",
                     f"{_med(r.train_cpu_s):.2f}", f"{_med(r.comm_s):.3f}", f"{ev:.2f}",
                     f"{tr / fb:.1f}x", f"{tr / fs:.1f}x", f"{_med(r.train_cpu_s) / fb:.1f}x"])
    out.append(_table(["workload", "FLOPs/round (train)", "floor s @big matmul", "floor s @small shapes",
                       "measured train s", "train CPU s", "send/bcast s", "eval s", "measured / floor@big",
                       "measured / floor@small", "train CPU / floor@big"], rows))
    out.append("")
    rows = []
    for r in results:
        tr, cm = _med(r.train_s), _med(r.comm_s)
        v = _best_vmap(r)
        rows.append([r.name, f"{r.steps}", f"{r.small_shape['step_s'] * 1e6:.0f}",
                     f"{r.bare_step_best_s * 1e6:.0f} / {r.bare_step_s * 1e6:.0f}",
                     f"{r.sgd_train_step_s * 1e6:.0f} / {r.sgd_train_step_cpu_s * 1e6:.0f}",
                     f"{(tr - cm) / r.steps * 1e6:.0f} / {_med(r.train_cpu_s) / r.steps * 1e6:.0f}",
                     f"{v['us_per_node_step']:.0f} (group {v['group']})" if v else "n/a",
                     f"{v['us_per_node_step'] * 1e-6 * r.nodes_trained * r.max_node_steps:.2f}" if v else "n/a"])
    out.append(_table(["workload", "SGD steps/round", "op floor us/step", "bare PyTorch us/step (best / median)",
                       "sgd_train us/step (wall / CPU)", "engine us/step (wall / CPU)", "vmap us per node-step (best group)",
                       "vmap round s (est.)"], rows))
    out.append("")
    rows = []
    for r in results:
        ev = _med(r.eval_s)
        ef = r.eval_flops / rate_big
        fwd = "; ".join(f"bs {k}: {v:.2f}" for k, v in r.eval_fwd_10k_s.items())
        rows.append([r.name, _fmt_flops(r.eval_flops), f"{ef:.2f}", f"{ev:.2f}", f"{_med(r.eval_cpu_s):.2f}",
                     f"{ev / ef:.1f}x" if ef > 0 else "n/a", fwd])
    out.append(_table(["workload", "eval FLOPs", "eval floor s @big", "eval s", "eval CPU s", "eval / floor",
                       "forward s per 10k samples"], rows))
    out.append("")
    rows = []
    for r in results:
        rows.append([r.name, f"{r.comm_calls}", f"{r.bytes_round / 1e6:.1f} MB", f"{_med(r.comm_s):.3f}",
                     f"{_med(r.comm_s) / max(_med(r.train_s), 1e-9) * 100:.1f}%",
                     f"{r.bytes_round / 1e6 / max(_med(r.comm_s), 1e-9):.0f} MB/s"])
    out.append(_table(["workload", "send/bcast calls", "bytes/round (ledger)", "send/bcast s",
                       "share of train s", "encode+decode throughput"], rows))
    out.append("")
    for r in results:
        c = r.flops_check_one_node
        out.append(f"{r.name}: {r.model} ({r.model_params:,} params), {r.nodes_trained} nodes train, "
                   f"{r.samples:,} sample-passes; FLOPs/sample fwd+bwd {r.flops_per_sample:,.0f} "
                   f"(analytic {r.flops_check_analytic_per_sample:,.0f}); one node's local training counted "
                   f"{c['counted']:,} vs predicted {c['predicted']:,}")
        out.append(f"  repeats: train {['%.2f' % t for t in r.train_s]}  send/bcast "
                   f"{['%.3f' % t for t in r.comm_s]}  eval {['%.2f' % t for t in r.eval_s]}")
        out.append("  FLOP ops of one step (best us, GFLOP/s): " + "; ".join(
            f"{o['op']} {o['us']:.0f}us {o['gflops']:.1f}" for o in r.small_shape["ops"]))
        out.append("  bare step, top ops by self CPU (us/step, share): " + "; ".join(
            f"{o['op']} {o['us_per_step']:.0f} {o['share'] * 100:.0f}%" for o in r.step_profile))
        if r.vmap:
            out.append("  vmap groups (us per node-step): " + "; ".join(
                f"{v['group']}: {v['us_per_node_step']:.0f}" if v["note"] is None else f"{v['group']}: {v['note']}"
                for v in r.vmap))
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test, < 1 minute)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="engine rounds per workload, median reported (default 3; 1 with --quick)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--workloads", default="fedavg,dfedavg", help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--matmul-n", type=int, default=None, help="size of the big square matmul (default 2048; 512 quick)")
    ap.add_argument("--no-probe", action="store_true", help="skip the vmap probe")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")
    keys = [k.strip() for k in args.workloads.split(",") if k.strip()]
    bad = [k for k in keys if k not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; available: {', '.join(WORKLOADS)}")

    torch.set_num_threads(args.threads)
    budget = 0.3 if args.quick else 2.0
    n = args.matmul_n or (512 if args.quick else 2048)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    load0 = loadavg()
    meta = {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "quick": args.quick,
            "repeats": args.repeats, "loadavg_start": load0}
    print(f"machine: {meta['cpu']}, {meta['logical_cpus']} logical CPUs; torch {meta['torch']}, "
          f"python {meta['python']}; torch threads = {meta['threads']}")
    print(f"load average at start (1/5/15 min): {load0}")
    if load0 is not None and load0[0] > (os.cpu_count() or 1) * 0.75:
        print(f"WARNING: the machine is busy (load {load0[0]} on {os.cpu_count()} CPUs): wall times are inflated"
              + (", and with --threads > 1 OpenMP barriers wait for descheduled threads (expect 10-100x slowdowns);"
                 " prefer --threads 1 and read the CPU-time columns" if args.threads > 1 else
                 "; read the CPU-time columns") + ". Re-take the numbers on a quiet machine.")
    t_start = time.perf_counter()
    big = big_matmul_rate(n, budget)
    log(f"big matmul {n}^3: {big['gflops_best']:.1f} GFLOP/s best wall, {big['gflops_cpu']:.1f} from CPU time")
    results = [bench_workload(k, quick=args.quick, repeats=args.repeats, threads=args.threads,
                              probe=not args.no_probe, budget=budget, log=log) for k in keys]
    meta["loadavg_end"] = loadavg()
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(report(results, big, meta))
    print(f"\nload average at end: {meta['loadavg_end']}; benchmark wall time {meta['wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "big_matmul": big,
                                               "results": [asdict(r) for r in results]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
