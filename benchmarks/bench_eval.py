"""Seconds per evaluation of a config's protocols (the evaluator alone).

    LOWBAND_DATA=/work/shared/data python benchmarks/bench_eval.py CONFIG [REPEATS] [key=value ...]

Builds the experiment (``rounds=1``, ``threads=1``, a temporary ``out_dir``), initialises
the node states and times ``Simulation.evaluator`` ``REPEATS`` times (3 by default) at
the initial models (the cost does not depend on the weights). Prints one JSON line: wall
and CPU seconds per call, their median and the metrics. ``TRAIN=1`` runs round 1's steps
first, so the metrics are those of trained models.

The floor: the evaluation's FLOPs (one more call under ``FlopCounterMode``: the forward
passes' matrix products and convolutions) over the best rate of a 2048^3 fp32 matmul on
the same one thread (``benchmarks/_common.big_matmul_rate``), taken between the calls;
``eval_over_floor`` is the median wall time over that floor.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import big_matmul_rate  # noqa: E402

from lowband.config import load_experiment
from lowband.engine.simulator import Simulation


def main(argv: list[str]) -> None:
    cfg = argv[0]
    reps = int(argv[1]) if len(argv) > 1 and "=" not in argv[1] else 3
    extra = [a for a in argv[1:] if "=" in a]
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(load_experiment(cfg, ["rounds=1", f"out_dir={tmp}/run", "threads=1", *extra]))
        plan = sim.topology.plan(0)
        sim.executor.init_states(plan)
        if os.environ.get("TRAIN") == "1":
            steps, inboxes = sim.alg.steps(1, plan), {}
            for k, step in enumerate(steps):
                inboxes = sim.route(1, sim.executor.run_step(step, 1, plan, inboxes), deliver=k < len(steps) - 1)
        torch.set_num_threads(1)
        with FlopCounterMode(display=False) as counter:
            sim.evaluator(1, plan)
        flops = counter.get_total_flops()
        times, metrics, rates = [], {}, []
        for _ in range(reps):
            rates.append(big_matmul_rate(2048, 0.5)["gflops_floor"])
            t, c = time.perf_counter(), time.process_time()
            metrics = sim.evaluator(1, plan)
            times.append((time.perf_counter() - t, time.process_time() - c))
    floor = flops / (max(rates) * 1e9)
    print(json.dumps({"config": os.path.basename(cfg), "overrides": extra,
                      "eval_wall_s": [round(a, 3) for a, _ in times], "eval_cpu_s": [round(b, 3) for _, b in times],
                      "median_wall_s": round(statistics.median(a for a, _ in times), 3), "gflop": round(flops / 1e9, 2),
                      "gflops_1thread": round(max(rates), 1), "floor_s": round(floor, 3),
                      "eval_over_floor": round(statistics.median(a for a, _ in times) / floor, 2),
                      "metrics": metrics}))


if __name__ == "__main__":
    main(sys.argv[1:])
