#!/usr/bin/env python
"""Seconds per round of the serial path and of the local worker pool ([engine] workers).

For one baseline config, builds the federation once, then runs the experiment for each
``--variants`` entry (``workers[:threads]``, e.g. ``1 1:1 2``: serial with torch's default
threads, serial with one thread, two workers), ``rounds`` rounds, a temporary ``out_dir``,
no evaluation at round 0, and prints per variant: the set-up time of ``Simulation`` (the
pool's process start-up included), ``round_s`` and ``eval_s`` (medians from
``timing.jsonl``), the wall time per round (checkpoints included) and whether
``metrics.jsonl`` is byte-identical to the first variant's. ``--spawn`` also times the
start-up of a pool started with the "spawn" method (workers import torch and unpickle
their shard of the data) rather than "fork". Timings mean something only on an idle
machine: the load average is printed.

Usage (repository root)::

    LOWBAND_DATA=/path/to/data python benchmarks/bench_workers.py \\
        experiments/baselines/fedavg_fmnist_dir03.toml --rounds 2 --variants 1 1:1 2 [--spawn] \\
        [--set eval.protocols='["personal","global"]']
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from lowband.config import load_experiment
from lowband.engine.simulator import Simulation, make_federation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=["1", "2"])
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value overrides")
    ap.add_argument("--spawn", action="store_true")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()}, cores {len(os.sched_getaffinity(0))}; {time.strftime('%H:%M:%S')}",
          flush=True)
    base = [f"rounds={args.rounds}", "eval.at_round0=false", *args.set]
    t = time.perf_counter()
    fed = make_federation(load_experiment(args.config, base))
    print(f"federation built in {time.perf_counter() - t:.1f} s", flush=True)
    first = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    for v in args.variants:
        w, _, th = v.partition(":")
        over = [*base, f"out_dir={tmp / v.replace(':', '-')}", f"engine.workers={w}"] + ([f"threads={th}"] if th else [])
        t0 = time.perf_counter()
        sim = Simulation(load_experiment(args.config, over), federation=fed)
        t1 = time.perf_counter()
        res = sim.run()
        t2 = time.perf_counter()
        timing = [json.loads(x) for x in (Path(res.run_dir) / "timing.jsonl").read_text().splitlines()]
        metrics = (Path(res.run_dir) / "metrics.jsonl").read_text()
        first = metrics if first is None else first
        digest = hashlib.sha256(metrics.encode()).hexdigest()[:12]
        print(f"workers={w} threads={th or 'default'} ({type(sim.executor).__name__}): setup {t1 - t0:.2f} s, "
              f"round_s {statistics.median(r['round_s'] for r in timing):.2f}, "
              f"eval_s {statistics.median(r['eval_s'] for r in timing):.2f}, "
              f"wall/round {(t2 - t1) / args.rounds:.2f} s, "
              f"metrics.jsonl sha256 {digest} (same as first: {metrics == first}), "
              f"{sim.main_metric} {res.metrics[-1].get(sim.main_metric)}", flush=True)
        if args.spawn and type(sim.executor).__name__ == "PoolExecutor":
            from lowband.engine.pool import PoolExecutor

            t3 = time.perf_counter()
            pool = PoolExecutor(sim.executor.env, num_workers=sim.executor.num_workers, start_method="spawn")
            pool.init_states(sim.topology.plan(0))
            pool.map_nodes(_node, list(range(sim.num_nodes)), 0, sim.topology.plan(0))
            print(f"  spawn-started pool of {pool.num_workers} ready in {time.perf_counter() - t3:.2f} s", flush=True)
            pool.close()
    print(f"load average {os.getloadavg()}; {time.strftime('%H:%M:%S')}")


def _node(ctx, state):  # noqa: ANN001 - a trivial per-node call: the pool answers
    return ctx.node


if __name__ == "__main__":
    main()
