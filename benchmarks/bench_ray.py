#!/usr/bin/env python
"""What does the Ray executor cost per round, and where does it win?

For the two baseline workloads (``experiments/baselines``: FedAvg, 100 clients, 10 sampled
per round, ``cnn_fmnist``; DFedAvg, 300 nodes, 5-regular graph, MLP 784-100-10) this
script runs a few rounds through the real engine with the serial executor and with the
Ray executor (1 and ``--workers`` shard actors), and reads ``round_s`` (local training +
messaging) and ``eval_s`` from ``timing.jsonl``:

- ``--epochs 0`` (the default first pass): local training is skipped (``local_epochs =
  0``), so a round is pure engine work: per-node dispatch, encoding, counting, routing,
  decoding and averaging. Ray minus serial is the executor's **overhead**;
- the config's own epochs (``--full``, or ``--full-epochs E``): the real workload, to see
  the compute share and the speed-up of W workers on W cores.

It also records the CPU seconds of the driver and of the shard actors (robust to other
load on the machine, unlike wall time), times the checkpoint gather
(``executor.state_dict()``: every node's state to the driver), checks that serial and Ray
write the same ``metrics.jsonl`` and prints one
Markdown table (``--json PATH`` writes the raw numbers). Every run uses ``threads = 1``
per process, the same federation (built once) and ``checkpoint_every = 0``; evaluation
runs once, after the last round.

Usage (from the repository root; the data is the shared Fashion-MNIST)::

    LOWBAND_DATA=/work/shared/data nice python benchmarks/bench_ray.py [--rounds 4]
        [--workers 2] [--workloads fedavg,dfedavg] [--full] [--json out.json]

Timings mean something only next to the machine's load: the script prints the load
average before and after, and the process CPU time of the driver.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "fedavg": ROOT / "experiments/baselines/fedavg_fmnist_dir03.toml",
    "dfedavg": ROOT / "experiments/baselines/dfedavg_fmnist_ntkfl_a01.toml",
}


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def one_run(path: Path, overrides: list[str], fed: Any) -> dict[str, Any]:
    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation

    with tempfile.TemporaryDirectory() as tmp:
        exp = load_experiment(path, overrides + [f"out_dir={tmp}/run"])
        t0 = time.perf_counter()
        sim = Simulation(exp, federation=fed)
        setup = time.perf_counter() - t0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        worker_cpu = 0.0
        if hasattr(sim.executor, "worker_info"):  # CPU seconds the shard actors spent in the run
            import ray

            after = ray.get([w.info.remote() for w in sim.executor.workers])
            worker_cpu = sum(a["cpu_s"] - b["cpu_s"] for a, b in zip(after, sim.executor.worker_info))
        t0 = time.perf_counter()
        sd = sim.executor.state_dict()
        gather = time.perf_counter() - t0
        run_dir = Path(tmp) / "run"
        timing = [json.loads(x) for x in (run_dir / "timing.jsonl").read_text().splitlines()]
        metrics = (run_dir / "metrics.jsonl").read_text()
        close = getattr(sim.executor, "close", None)
        workers = getattr(sim.executor, "num_workers", 0)
        if close is not None:
            # keep the Ray runtime for the next run; stop only the actors
            sim.executor.owns_ray = False
            close()
    rounds = [t["round_s"] for t in timing]
    steady = rounds[1:] or rounds  # round 1 includes first-call costs (model build, imports)
    return {"setup_s": setup, "wall_s": wall, "driver_cpu_s": cpu, "worker_cpu_s": worker_cpu,
            "cpu_s": cpu + worker_cpu, "round_s": rounds,
            "round_median_s": statistics.median(steady), "eval_s": timing[-1]["eval_s"],
            "gather_s": gather, "states": len(sd), "workers": workers, "metrics": metrics}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workloads", default="fedavg,dfedavg")
    ap.add_argument("--full", action="store_true", help="also run the configs' own local epochs")
    ap.add_argument("--full-rounds", type=int, default=2)
    ap.add_argument("--full-epochs", type=int, default=None,
                    help="with --full: this many local epochs instead of the config's (shorter runs)")
    ap.add_argument("--no-single", action="store_true", help="skip the 1-worker Ray runs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")  # shared machine: see docs/scale.md
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    import ray

    from lowband.config import load_experiment
    from lowband.engine.simulator import make_federation

    torch.set_num_threads(1)
    print(f"load average at start: {load()} ({os.cpu_count()} CPUs)", file=sys.stderr)
    t0 = time.perf_counter()
    ray.init(num_cpus=max(args.workers, 1), include_dashboard=False, log_to_driver=False)
    ray_init = time.perf_counter() - t0
    results: dict[str, Any] = {"load_start": load(), "ray_init_s": ray_init, "runs": []}
    rows = []
    for name in args.workloads.split(","):
        path = WORKLOADS[name]
        fed = make_federation(load_experiment(path))
        full = "config" if args.full_epochs is None else str(args.full_epochs)
        passes = [("0", args.rounds)] + ([(full, args.full_rounds)] if args.full else [])
        for epochs, rounds in passes:
            base = [f"rounds={rounds}", "checkpoint_every=0", "threads=1", "eval.at_round0=false",
                    f"eval.every={rounds}"]
            if epochs != "config":
                base.append(f"algorithm.local_epochs={epochs}")
            runs = {}
            for label, extra in [("serial", []), ("ray x1", ["executor=ray", "ray_workers=1"]),
                                 (f"ray x{args.workers}", ["executor=ray", f"ray_workers={args.workers}"])]:
                if label == "ray x1" and (args.workers == 1 or args.no_single):
                    continue
                print(f"{name} epochs={epochs} {label} ... (load {load()})", file=sys.stderr)
                runs[label] = one_run(path, base + extra, fed)
            ref = runs["serial"]
            for label, r in runs.items():
                same = r["metrics"] == ref["metrics"]
                rows.append((name, epochs, label, r, r["round_median_s"] - ref["round_median_s"], same))
                results["runs"].append({"workload": name, "epochs": epochs, "executor": label,
                                        "identical_metrics": same,
                                        **{k: v for k, v in r.items() if k != "metrics"}})
    results["load_end"] = load()
    print(f"\nload average: start {results['load_start']}, end {results['load_end']}; "
          f"ray.init {ray_init:.1f} s\n")
    print("| workload | local epochs | executor | setup s | round s (median) | overhead s/round | eval s "
          "| gather s | CPU s (driver + workers) | metrics = serial |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, epochs, label, r, over, same in rows:
        print(f"| {name} | {epochs} | {label} | {r['setup_s']:.2f} | {r['round_median_s']:.3f} | "
              f"{over:+.3f} | {r['eval_s']:.2f} | {r['gather_s']:.3f} | "
              f"{r['cpu_s']:.2f} ({r['driver_cpu_s']:.2f} + {r['worker_cpu_s']:.2f}) | {'yes' if same else 'NO'} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
