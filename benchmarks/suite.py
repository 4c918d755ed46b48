#!/usr/bin/env python
"""The benchmark suite of issue 18 (part 7): every workload's seconds per round, in one run.

For each workload it prints the seconds per round of

- (a) **serial**: today's path: one process, the per-client loop (``engine.workers = 1``,
  ``engine.vectorize = "off"`` where the installed lowband has those keys);
- (b) **default**: the engine as a user gets it (``engine.workers = "auto"``,
  ``engine.vectorize = "auto"`` where known, plus any ``--set`` overrides);
- (c) **plain**: a hand-written single-process PyTorch loop over the same clients, the
  same model, data, participants/graph, batch size, epochs and evaluation, no lowband
  engine (``benchmarks/_plain.py``); for NTK-DFL and SPARK, one node's kernels called
  directly through ``bench_ntk.py``'s machinery, times the nodes;

each against its **FLOP floor** (the round's FLOPs over the machine's big-matmul rate
with all cores, ``_common.big_matmul_rate``), with the peak resident memory of each run
(each in its own subprocess: a clean peak; workers it starts are included), the load
average at the start and the end, and a ratios table.

Workloads:

- ``fedavg``: experiments/baselines/fedavg_fmnist_dir03.toml overridden to issue 18's
  acceptance setting: 100 clients, 10 per round, batch 16, 3 local epochs, evaluation
  ``personal`` + ``global`` every round (seconds per *evaluated* round = train + eval);
- ``dfedavg``: experiments/baselines/dfedavg_fmnist_ntkfl_a01.toml (300 nodes, 5-regular,
  MLP, batch 25, 20 epochs, ``consensus`` + ``node_global`` every round);
- ``ntk_dfl`` / ``spark``: experiments/spark/{ntk_dfl,spark}_a0.1.toml at the paper's
  per-node size (~197 samples a node, 5-regular graph, so 1,182 pooled samples a
  neighbourhood; k = 1000, tau = 100), run through the engine on ``--ntk-nodes`` nodes
  (default 30) and extrapolated to the config's 300 by node count (a node's work depends
  on its neighbourhood, not on the graph's size); the per-run memory budgets
  (``max_inflight_mb``, ``xp_cache_mb``, ``xp_cache_disk_mb`` where they exist) are scaled
  by the same factor so the engine makes the same choices (reply groups, cached share of
  X P) as at 300 nodes. Evaluation excluded; the steady-state round is the last one
  (round 1 fills SPARK's X P cache and is shown apart).

Usage (repository root)::

    LOWBAND_DATA=/work/shared/data python benchmarks/suite.py [--quick] [--workloads fedavg,dfedavg,ntk_dfl,spark]
        [--rounds R] [--ntk-nodes N] [--set KEY=VALUE ...] [--json out.json]

``--quick`` shrinks every workload (a smoke test, < 1 minute, numbers meaningless).
Timings only mean something on a quiet machine; use ``quiet python benchmarks/suite.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _common import TreeRSS, big_matmul_rate, loadavg, machine, runnable, self_peak_rss_kib, table  # noqa: E402

MODES = ("serial", "default", "plain")
#: ``--baseline-src DIR``: mode (a) run with PYTHONPATH=DIR (e.g. the commit before issue 18)
BASELINE = "baseline"
MARK = "SUITE_RESULT "

#: the keys modes (a) and (b) set where the installed lowband knows them
SERIAL_KEYS = {"engine.workers": "1", "engine.vectorize": '"off"'}
DEFAULT_KEYS = {"engine.workers": '"auto"', "engine.vectorize": '"auto"'}
#: keys shown in the availability table (eval.nodes is not set: the acceptance workloads evaluate every node)
SHOWN_KEYS = ("engine.workers", "engine.vectorize", "eval.every", "eval.nodes")

WORKLOADS: dict[str, dict[str, Any]] = {
    "fedavg": {
        "kind": "fl",
        "label": "FedAvg cnn_fmnist, 100 clients, 10/round, B16, E3, eval personal+global every round",
        "config": "experiments/baselines/fedavg_fmnist_dir03.toml",
        "overrides": ["algorithm.batch_size=16", "algorithm.local_epochs=3",
                      'eval.protocols=["personal", "global"]', "eval.every=1"],
        "quick": ["data.num_clients=20", "topology.count=2", "algorithm.local_epochs=1"],
        "rounds": 3,
    },
    "dfedavg": {
        "kind": "fl",
        "label": "DFedAvg mlp, 300 nodes, 5-regular, B25, E20, eval consensus+node_global every round",
        "config": "experiments/baselines/dfedavg_fmnist_ntkfl_a01.toml",
        "overrides": ["eval.every=1"],
        "quick": ["data.num_clients=20", "algorithm.local_epochs=1"],
        "rounds": 2,
    },
    "ntk_dfl": {
        "kind": "ntk",
        "label": "NTK-DFL mlp, 300 nodes, 5-regular, tau 100 (eval excluded)",
        "config": "experiments/spark/ntk_dfl_a0.1.toml",
        "overrides": ['eval.protocols=["consensus"]'],
        "quick": ["data.samples_per_client=50", "algorithm.taus=[20]"],
        "rounds": 2,
    },
    "spark": {
        "kind": "ntk",
        "label": "SPARK mlp, 300 nodes, 5-regular, k 1000, tau 100 (eval excluded)",
        "config": "experiments/spark/spark_a0.1.toml",
        "overrides": ['eval.protocols=["consensus"]'],
        "quick": ["data.samples_per_client=50", "algorithm.taus=[20]", "algorithm.k=200"],
        "rounds": 2,
    },
}

#: per-run memory budgets of NTK-DFL / SPARK, scaled with the node count (see the docstring)
NTK_BUDGETS = ("max_inflight_mb", "xp_cache_mb", "xp_cache_disk_mb")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# configuration
# ------------------------------------------------------------------------------------------
def key_available(dotted: str) -> bool:
    """Whether the installed lowband's config schema has ``dotted`` (e.g. ``engine.workers``)."""
    from lowband.config import Experiment

    cls: Any = Experiment
    for part in dotted.split("."):
        fields = getattr(cls, "model_fields", None)
        if not fields or part not in fields:
            return False
        cls = fields[part].annotation
    return True


def mode_keys(mode: str, extra: list[str]) -> dict[str, Optional[str]]:
    """``key -> value`` a mode sets; value None: the installed lowband lacks the key."""
    wanted = dict(SERIAL_KEYS if mode == "serial" else DEFAULT_KEYS if mode == "default" else {})
    if mode == "default":
        for kv in extra:
            k, _, v = kv.partition("=")
            wanted[k.strip()] = v.strip()
    return {k: (v if key_available(k) else None) for k, v in wanted.items()}


def base_overrides(key: str, quick: bool, rounds: int) -> list[str]:
    wl = WORKLOADS[key]
    return [*wl["overrides"], *(wl["quick"] if quick else []), f"rounds={rounds}", "eval.at_round0=false",
            "checkpoint_every=0"]


def measured_rounds(rounds: int) -> list[int]:
    """The rounds whose times are reported: all but the first (warm-up, pool start, SPARK's
    X P cache fill) when there are several."""
    return list(range(2, rounds + 1)) if rounds > 1 else [1]


# ------------------------------------------------------------------------------------------
# child: one (workload, mode) in its own process
# ------------------------------------------------------------------------------------------
def child_engine(key: str, mode: str, quick: bool, rounds: int, ntk_nodes: int, extra: list[str]) -> dict[str, Any]:
    """Modes (a) and (b): the real engine, times from ``timing.jsonl``."""
    import torch

    from lowband.config import hyperparams, load_experiment
    from lowband.engine.simulator import Simulation, make_federation

    wl = WORKLOADS[key]
    cfg = ROOT / wl["config"]
    keys = mode_keys(mode, extra)
    over = base_overrides(key, quick, rounds) + [f"{k}={v}" for k, v in keys.items() if v is not None]
    scale, budgets = 1.0, []
    if wl["kind"] == "ntk":
        target = load_experiment(cfg, over).data.num_clients
        scale = target / ntk_nodes
        hp = hyperparams(load_experiment(cfg, over))
        over.append(f"data.num_clients={ntk_nodes}")
        budgets = [f"algorithm.{b}={getattr(hp, b) / scale:g}" for b in NTK_BUDGETS if hasattr(hp, b)]
        over += budgets
    notes: list[str] = [f"budgets scaled: {', '.join(budgets)}"] if wl["kind"] == "ntk" else []
    with tempfile.TemporaryDirectory(prefix=f"suite_{key}_{mode}_") as tmp:
        exp = load_experiment(cfg, [*over, f"out_dir={json.dumps(str(Path(tmp) / 'run'))}"])
        with TreeRSS() as mem:
            t0 = time.perf_counter()
            fed = make_federation(exp)
            if scale != 1.0 and keys.get("engine.workers") == '"auto"':
                # "auto" decides from the federation's size: decide as at full size
                w = _auto_workers_full_size(exp, fed, scale)
                if w is not None:
                    exp = load_experiment(cfg, [*over, f"engine.workers={w}",
                                                f"out_dir={json.dumps(str(Path(tmp) / 'run'))}"])
                    notes.append(f'engine.workers "auto" resolved as at {round(len(fed.nodes) * scale)} nodes: {w}')
            sim = Simulation(exp, federation=fed)
            setup = time.perf_counter() - t0
            res = sim.run()
            close = getattr(sim.executor, "close", None)
            if callable(close):
                close()
        timing = [json.loads(x) for x in (Path(res.run_dir) / "timing.jsonl").read_text().splitlines() if x.strip()]
    per = {int(t["round"]): (float(t["round_s"]), float(t["eval_s"])) for t in timing}
    with_eval = wl["kind"] == "fl"
    rounds_s = {r: (tr + ev if with_eval else tr) * scale for r, (tr, ev) in per.items()}
    meas = measured_rounds(rounds)
    last = res.metrics[-1] if res.metrics else {}
    main = {k: v for k, v in last.items() if k.endswith("/acc") or k.endswith("/acc_weighted")}
    return {
        "s_per_round": statistics.mean(rounds_s[r] for r in meas),
        "train_s": statistics.mean(per[r][0] for r in meas) * scale,
        "eval_s": statistics.mean(per[r][1] for r in meas) * (scale if not with_eval else 1.0),
        "round1_s": rounds_s.get(1), "rounds_s": rounds_s, "setup_s": setup, "extrapolated_x": scale,
        "nodes_run": exp.data.num_clients, "keys": keys, "threads": torch.get_num_threads(),
        "rss_tree_kib": mem.peak_kib, "pss_tree_kib": mem.peak_pss_kib, "rss_self_kib": self_peak_rss_kib(),
        "processes": 1 + mem.peak_workers,
        "metrics": main, "notes": notes,
    }


def _auto_workers_full_size(exp: Any, fed: Any, scale: float) -> Optional[int]:
    """What ``engine.workers = "auto"`` picks for the federation ``scale`` times larger
    (lowband.engine.pool.resolve_workers, where the installed lowband has it)."""
    try:
        from lowband.engine.pool import resolve_workers  # type: ignore[import-not-found]
        from lowband.engine.simulator import model_options
        from lowband.models import build_model, count_params

        params = count_params(build_model(exp.model.name, num_classes=fed.num_classes,
                                          input_shape=tuple(fed.input_shape), **model_options(exp, fed)))
        samples = int(sum(int(nd.n_train) for nd in fed.nodes) * scale)
        return int(resolve_workers("auto", exp.threads, round(len(fed.nodes) * scale), params, samples))
    except Exception as exc:  # not there before h-loop's merge, or its signature changed
        log(f"  (engine.workers auto left to the engine at the run's size: {type(exc).__name__}: {exc})")
        return None


def _fl_setting(key: str, quick: bool, rounds: int) -> tuple[Any, Any, Any, list[Any]]:
    """(experiment, federation, algorithm, round plans) of an FL workload, built as lowband builds them."""
    from lowband.algorithms import ALGORITHMS
    from lowband.config import hyperparams, load_experiment
    from lowband.engine.simulator import make_federation, make_topology

    exp = load_experiment(ROOT / WORKLOADS[key]["config"], base_overrides(key, quick, rounds))
    fed = make_federation(exp)
    alg = ALGORITHMS[exp.algorithm.name](hyperparams(exp))
    topo = make_topology(exp, alg.family, len(fed.nodes), alg.default_topology)
    return exp, fed, alg, [topo.plan(r) for r in range(rounds)]


def child_plain_fl(key: str, quick: bool, rounds: int) -> dict[str, Any]:
    """Mode (c) for FedAvg / DFedAvg, then the round's FLOPs (after the timing)."""
    import torch

    import _plain
    from _common import forward_flops, step_flops
    from lowband.engine import checks
    from lowband.engine.simulator import model_options
    from lowband.models import build_model

    exp, fed, alg, plans = _fl_setting(key, quick, rounds)
    hp = alg.hp
    protocols = checks.resolve_protocols(alg, fed, exp.eval.protocols)

    def model() -> torch.nn.Module:
        return build_model(exp.model.name, num_classes=fed.num_classes, input_shape=tuple(fed.input_shape),
                           seed=exp.seed, **model_options(exp, fed))

    m = model()
    init = {k: v.detach().clone() for k, v in m.state_dict().items()}
    stamps: list[float] = []
    metrics: dict[str, float] = {}

    def on_round(r: int, met: dict[str, float]) -> None:
        stamps.append(time.perf_counter())
        metrics.update(met)

    kw = dict(epochs=int(hp.local_epochs), batch_size=int(hp.batch_size), lr=float(hp.lr),
              eval_batch_size=int(exp.eval.batch_size), protocols=protocols, on_round=on_round)
    with TreeRSS() as mem:
        t0 = time.perf_counter()
        if alg.family == "server":
            _plain.fedavg(m, init, fed, [p.participants for p in plans], **kw)  # type: ignore[arg-type]
        else:
            _plain.dfedavg(m, init, fed, [p.neighbors for p in plans], **kw)  # type: ignore[arg-type]
    rounds_s = {r + 1: t - (stamps[r - 1] if r else t0) for r, t in enumerate(stamps)}
    meas = measured_rounds(rounds)

    # FLOPs of the measured rounds: training (fwd+bwd per sample x samples trained) + evaluation
    x = fed.nodes[0].train_x[: int(hp.batch_size)]
    y = fed.nodes[0].train_y[: int(hp.batch_size)]
    per_train = step_flops(model(), x, y) / int(y.shape[0])
    per_fwd = forward_flops(model(), x) / int(y.shape[0])
    n_test = int(fed.global_test_y.shape[0])
    eval_samples = 0
    if "global" in protocols or "consensus" in protocols:
        eval_samples += n_test
    if "personal" in protocols:
        eval_samples += sum(int(nd.test_y.shape[0]) for nd in fed.nodes)
    if "node_global" in protocols:
        eval_samples += n_test * len(fed.nodes)
    train = statistics.mean(sum(int(hp.local_epochs) * int(fed.nodes[c].n_train)
                                for c in plans[r - 1].participants if c >= 0) for r in meas) * per_train
    return {
        "s_per_round": statistics.mean(rounds_s[r] for r in meas), "round1_s": rounds_s.get(1),
        "rounds_s": rounds_s, "threads": torch.get_num_threads(), "rss_tree_kib": mem.peak_kib,
        "pss_tree_kib": mem.peak_pss_kib,
        "rss_self_kib": self_peak_rss_kib(), "processes": 1 + mem.peak_workers, "metrics": metrics,
        "flops": {"train": train, "eval": eval_samples * per_fwd, "train_per_sample": per_train,
                  "eval_per_sample": per_fwd, "eval_samples": eval_samples},
    }


def child_plain_ntk(key: str, quick: bool, rounds: int) -> dict[str, Any]:
    """Mode (c) for NTK-DFL / SPARK: one node's work through bench_ntk.py's functions
    (lowband's kernels called directly: no engine, no messages), times the nodes; and the
    round's FLOPs from bench_ntk's analytic counts."""
    import torch

    from lowband.config import hyperparams, load_experiment
    from lowband.engine.simulator import make_federation

    import bench_ntk as bn

    bn.CLOCK = "wall"
    exp = load_experiment(ROOT / WORKLOADS[key]["config"], base_overrides(key, quick, rounds))
    hp = hyperparams(exp)
    fed = make_federation(exp)
    nodes = len(fed.nodes)
    n = int(statistics.median(int(nd.n_train) for nd in fed.nodes))
    n_pool = (int(exp.topology.k) + 1) * n
    tau = int(max(hp.taus))
    with TreeRSS() as mem:
        if key == "ntk_dfl":
            t = bn.bench_ntk_requester(n_pool, tau)
            sub = int(t.pop("_substeps"))
            per_node = sum(t.values())
            flops = nodes * sum(bn.flops_ntk_requester(n_pool, tau, sub).values())
            parts = {k: v * nodes for k, v in t.items()}
        else:
            k = int(hp.k)
            resp, req, _ = bn.bench_spark(n, n_pool, k, tau, 6, "gaussian")
            resp.pop("build P (once per process)", None)
            per_node = sum(resp.values()) + sum(req.values())
            # the weight-independent X P1 is left out: it can be computed once and kept
            flops = nodes * (bn.flops_spark_responder(n, k, 6)["J P per weight vector"]
                             + sum(bn.flops_spark_requester(n_pool, k, tau).values()))
            parts = {f"responder {k2}": v * nodes for k2, v in resp.items()}
            parts.update({f"requester {k2}": v * nodes for k2, v in req.items()})
    return {"s_per_round": per_node * nodes, "round1_s": None, "rounds_s": {}, "threads": torch.get_num_threads(),
            "rss_tree_kib": mem.peak_kib, "pss_tree_kib": mem.peak_pss_kib, "rss_self_kib": self_peak_rss_kib(),
        "processes": 1 + mem.peak_workers,
            "metrics": {}, "parts_s": parts, "sizes": {"nodes": nodes, "n": n, "n_pool": n_pool, "tau": tau},
            "flops": {"train": flops, "eval": 0.0}}


def child(key: str, modes: list[str], quick: bool, rounds: int, ntk_nodes: int, extra: list[str]) -> int:
    out: dict[str, Any] = {}
    for mode in modes:
        t0 = time.perf_counter()
        try:
            if mode == "plain":
                fn = child_plain_fl if WORKLOADS[key]["kind"] == "fl" else child_plain_ntk
                out[mode] = fn(key, quick, rounds)
            elif mode == BASELINE:  # mode (a), on the lowband found first on PYTHONPATH
                import lowband

                out[mode] = child_engine(key, "serial", quick, rounds, ntk_nodes, extra)
                out[mode]["notes"].append(f"lowband from {Path(lowband.__file__).parent}")
            else:
                out[mode] = child_engine(key, mode, quick, rounds, ntk_nodes, extra)
        except Exception as exc:  # reported in the table, the other modes still run
            import traceback

            traceback.print_exc()
            out[mode] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
        out[mode]["wall_s"] = time.perf_counter() - t0
        log(f"[{key}/{mode}] done in {out[mode]['wall_s']:.1f} s")
    print(MARK + json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------
def spawn(key: str, modes: list[str], args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", key, "--modes", ",".join(modes),
           "--rounds", str(args.rounds_for[key]), "--ntk-nodes", str(args.ntk_nodes)]
    cmd += ["--quick"] if args.quick else []
    for kv in args.set:
        cmd += ["--set", kv]
    env = None
    if modes == [BASELINE]:
        env = {**os.environ, "PYTHONPATH": str(Path(args.baseline_src).resolve())}
    log(f"[{key}] {', '.join(modes)}: {' '.join(cmd[1:])}" + (f" (PYTHONPATH={env['PYTHONPATH']})" if env else ""))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {m: {"error": f"timed out after {args.timeout} s"} for m in modes}
    lines = [x for x in p.stdout.splitlines() if x.startswith(MARK)]
    for x in p.stdout.splitlines():
        if not x.startswith(MARK):
            log(f"  {x}")
    if not lines:
        return {m: {"error": f"child exited {p.returncode} without a result"} for m in modes}
    return json.loads(lines[-1][len(MARK):])


def _s(v: Optional[float]) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.2f}" if v < 600 else f"{v:.0f} ({v / 60:.1f} min)"


def _gib(kib: Optional[int]) -> str:
    return "n/a" if not kib else f"{kib / 2**20:.2f}"


def _mem(r: dict[str, Any]) -> str:
    """Peak memory of one run: the process's own peak RSS, or with worker processes the
    peak summed PSS of the process tree (shared pages counted once)."""
    if "error" in r or not r.get("rss_self_kib"):
        return "n/a"
    if r.get("processes", 1) > 1 and r.get("pss_tree_kib"):
        return f"{_gib(r['pss_tree_kib'])} ({r['processes']} proc, PSS)"
    return _gib(r["rss_self_kib"])


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    if not a or not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}x"


def report(results: dict[str, dict[str, Any]], rate: dict[str, float], args: argparse.Namespace) -> str:
    out = []
    # the keys each engine mode set
    keys: dict[str, dict[str, str]] = {}
    for res in results.values():
        for mode in ("serial", "default"):
            for k, v in res.get(mode, {}).get("keys", {}).items():
                keys.setdefault(k, {})[mode] = v if v is not None else "n/a (key not available)"
    rows = []
    for k in sorted(set(keys) | set(SHOWN_KEYS)):
        avail = "yes" if key_available(k) else "no"
        note = "" if k in keys else ("not set (every node is evaluated)" if k == "eval.nodes" else
                                     "1 (fedavg, dfedavg)" if k == "eval.every" else "not set")
        if avail == "no":
            note = "n/a (key not available)"
        rows.append([k, avail, keys.get(k, {}).get("serial", note), keys.get(k, {}).get("default", note)])
    out.append(table(["config key", "known to the installed lowband", "(a) serial", "(b) default"], rows))
    out.append("")

    floor_rate = rate["gflops_floor"] * 1e9
    base = any(BASELINE in res for res in results.values())
    shown = ((BASELINE,) if base else ()) + MODES
    rows, ratios, details = [], [], []
    for key, res in results.items():
        wl = WORKLOADS[key]
        fl = res.get("plain", {}).get("flops")
        floor = (fl["train"] + fl["eval"]) / floor_rate if fl else None
        cells = []
        for mode in shown:
            r = res.get(mode, {})
            cells.append("error: " + r["error"] if "error" in r else _s(r.get("s_per_round")))
        mem = []
        for mode in shown:
            r = res.get(mode, {})
            mem.append(_mem(r))
        rows.append([wl["label"] + (" (quick)" if args.quick else ""), *cells, _s(floor), *mem])
        s = {m: res.get(m, {}).get("s_per_round") for m in shown}
        ratios.append([key, *([_ratio(s["default"], s[BASELINE])] if base else []),
                       _ratio(s["default"], s["serial"]), _ratio(s["default"], s["plain"]),
                       _ratio(s["serial"], floor), _ratio(s["default"], floor), _ratio(s["plain"], floor)])
        for mode in shown:
            r = res.get(mode, {})
            if "error" in r:
                details.append(f"{key}/{mode}: ERROR {r['error']}")
                continue
            bits = [f"{key}/{mode}: {_s(r.get('s_per_round'))} s/round"]
            if r.get("train_s") is not None:
                bits.append(f"train {_s(r['train_s'])} + eval {_s(r['eval_s'])}")
                if fl and fl["eval"] and wl["kind"] == "fl":  # the evaluation against its own floor
                    bits.append(f"eval / eval floor {_ratio(r['eval_s'], fl['eval'] / floor_rate)}")
            if r.get("round1_s") is not None:
                bits.append(f"round 1 {_s(r['round1_s'])}")
            if r.get("extrapolated_x", 1.0) != 1.0:
                bits.append(f"engine run on {r['nodes_run']} nodes, x{r['extrapolated_x']:.1f}")
            if r.get("setup_s") is not None:
                bits.append(f"setup {r['setup_s']:.1f} s")
            bits.append(f"torch threads {r.get('threads')}; peak memory GiB: main process "
                        f"{_gib(r.get('rss_self_kib'))}, "
                        f"{r.get('processes', 1)} process(es) RSS sum {_gib(r.get('rss_tree_kib'))}"
                        + (f", PSS sum {_gib(r.get('pss_tree_kib'))}" if r.get("pss_tree_kib") else ""))
            if r.get("metrics"):
                bits.append("metrics " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(r["metrics"].items())))
            if r.get("notes"):
                bits += r["notes"]
            if r.get("parts_s"):
                bits.append("parts " + ", ".join(f"{k} {v:.1f}" for k, v in r["parts_s"].items()))
            details.append("; ".join(bits))
        if fl:
            details.append(f"{key}/floor: {fl['train'] / 1e9:.1f} GFLOP train + {fl['eval'] / 1e9:.1f} GFLOP eval "
                           f"per round at {rate['gflops_floor']:.1f} GFLOP/s = {_s(floor)} s")
    a0 = [f"(a0) serial at {args.baseline_src} s/round"] if base else []
    out.append(table(["workload", *a0, "(a) serial s/round", "(b) default s/round", "(c) plain PyTorch s/round",
                      "FLOP floor s/round", *(["peak RSS GiB (a0)"] if base else []), "peak RSS GiB (a)",
                      "peak RSS GiB (b)", "peak RSS GiB (c)"], rows))
    out.append("")
    out.append(table(["workload", *(["default / serial at baseline"] if base else []), "default / serial",
                      "default / plain", "serial / floor", "default / floor", "plain / floor"], ratios))
    out.append("(ratios of seconds per round: below 1x the first is faster; issue 18's \"2x faster\" is <= 0.50x, "
               "\"within 3x of the floor\" is <= 3x)")
    out.append("")
    out.extend(details)
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny workloads: a smoke test (< 1 min), not a measurement")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds per run; all but the first are timed (default: fedavg 3, others 2)")
    ap.add_argument("--ntk-nodes", type=int, default=30,
                    help="nodes of the NTK-DFL / SPARK engine runs, extrapolated to the config's (default 30; even)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra override of the default mode (b), e.g. eval.nodes=30; skipped where unknown")
    ap.add_argument("--isolate", choices=["mode", "workload"], default=None,
                    help="one subprocess per workload and mode (clean peak RSS; default) or per workload "
                         "(default with --quick: fewer start-ups)")
    ap.add_argument("--matmul-n", type=int, default=None, help="big matmul size (default 2048; 512 with --quick)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per subprocess (default 3600)")
    ap.add_argument("--json", default=None, help="also write every number to this JSON file")
    ap.add_argument("--baseline-src", default=None, metavar="DIR",
                    help="also run mode (a) with PYTHONPATH=DIR (a column \"(a0) serial at DIR\"), e.g. the "
                         "src/ of a worktree at the commit before issue 18")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    keys = [k.strip() for k in args.workloads.split(",") if k.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [k for k in keys if k not in WORKLOADS] + [m for m in modes if m not in MODES
                                                      and not (args.child and m == BASELINE)]
    if bad:
        ap.error(f"unknown workload(s) or mode(s) {bad}; workloads: {', '.join(WORKLOADS)}; modes: {', '.join(MODES)}")
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.ntk_nodes < 6 or args.ntk_nodes % 2:
        ap.error("--ntk-nodes must be even and >= 6 (a 5-regular graph)")
    for kv in args.set:
        if "=" not in kv:
            ap.error(f"--set {kv!r}: expected KEY=VALUE")
    args.rounds_for = {k: args.rounds or (2 if args.quick else WORKLOADS[k]["rounds"]) for k in WORKLOADS}
    if args.baseline_src:
        if not (Path(args.baseline_src) / "lowband" / "__init__.py").is_file():
            ap.error(f"--baseline-src {args.baseline_src}: no lowband/__init__.py there; give a src/ directory")
        if not args.child:
            modes = [BASELINE, *modes]

    if args.child:
        return child(args.child, modes, args.quick, args.rounds_for[args.child], args.ntk_nodes, args.set)

    import torch

    load0 = loadavg()
    t_start = time.perf_counter()
    mach = machine()
    print(f"machine: {mach['cpu']}, {mach['logical_cpus']} logical CPUs; torch {mach['torch']} "
          f"(default threads {mach['torch_threads']}, OMP_NUM_THREADS={mach['omp_num_threads']}), "
          f"python {mach['python']}")
    print(f"load average at start (1/5/15 min): {load0}; runnable now: {runnable()} (the load average lags a "
          f"paused job by a minute)")
    threads0 = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    rate = big_matmul_rate(args.matmul_n or (512 if args.quick else 2048), 0.3 if args.quick else 2.0)
    torch.set_num_threads(threads0)
    # the floor's rate: the best wall-clock rate (on the quiet machine this suite is meant for;
    # bench_rounds.py's CPU-time rate over-reads short calls when threads idle)
    rate["gflops_floor"] = rate["gflops_best"]
    print(f"big matmul {rate['n']}^3 fp32, {rate['threads']} threads (all cores): best {rate['gflops_best']:.1f} "
          f"GFLOP/s, median {rate['gflops_median']:.1f} (the floor uses the best)\n", flush=True)

    isolate = args.isolate or ("workload" if args.quick else "mode")
    results: dict[str, dict[str, Any]] = {}
    for key in keys:
        if isolate == "workload":
            results[key] = spawn(key, [m for m in modes if m != BASELINE], args)
            if BASELINE in modes:
                results[key].update(spawn(key, [BASELINE], args))
        else:
            results[key] = {}
            for mode in modes:
                results[key].update(spawn(key, [mode], args))
    load1 = loadavg()
    print(report(results, rate, args))
    print(f"\nload average at end (1/5/15 min): {load1}; runnable now: {runnable()}; "
          f"suite wall time {time.perf_counter() - t_start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": mach, "loadavg_start": load0, "loadavg_end": load1,
                                               "big_matmul": rate, "quick": args.quick, "results": results},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
