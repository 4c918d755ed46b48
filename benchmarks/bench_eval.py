"""Seconds per evaluation of a config's protocols (the evaluator alone).

    LOWBAND_DATA=/work/shared/data python benchmarks/bench_eval.py CONFIG [REPEATS] [key=value ...]

Builds the experiment (``rounds=1``, ``threads=1``, a temporary ``out_dir``), initialises
the node states and times ``Simulation.evaluator`` ``REPEATS`` times (3 by default) at
the initial models (the cost does not depend on the weights). Prints one JSON line: wall
and CPU seconds per call, their median and the metrics. ``TRAIN=1`` runs round 1's steps
first, so the metrics are those of trained models.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

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
        times, metrics = [], {}
        for _ in range(reps):
            t, c = time.perf_counter(), time.process_time()
            metrics = sim.evaluator(1, plan)
            times.append((time.perf_counter() - t, time.process_time() - c))
    print(json.dumps({"config": os.path.basename(cfg), "overrides": extra,
                      "eval_wall_s": [round(a, 3) for a, _ in times], "eval_cpu_s": [round(b, 3) for _, b in times],
                      "median_wall_s": round(statistics.median(a for a, _ in times), 3), "metrics": metrics}))


if __name__ == "__main__":
    main(sys.argv[1:])
