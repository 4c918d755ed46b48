#!/usr/bin/env python
"""Seconds per round of pfl-research's CIFAR-10 benchmark workload (experiments/natural/pfl_cifar10.toml)
through the real engine, on one core and on two, and the projected time of its 1,500 rounds.

For each setting (threads x worker processes) the config runs ``--rounds`` rounds (default 3)
in a temporary folder, evaluating once, after the last round; ``timing.jsonl`` gives each
round's training+messaging seconds (``round_s``) and the evaluation's (``eval_s``). The
projection is ``1500 * median(round_s) + 150 * eval_s`` (pfl-research evaluates every 10
central iterations). The load average is printed before and after each setting: on a shared
machine it says how much of a core the measurement really had.

Usage (from the repository root)::

    LOWBAND_DATA=/path/to/data python benchmarks/bench_pfl_cifar10.py [--rounds N] [--settings 1x1,2x1,1x2]
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

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "natural" / "pfl_cifar10.toml"
TOTAL_ROUNDS, EVAL_EVERY = 1500, 10


def measure(threads: int, workers: int, rounds: int, fed: object) -> dict:
    from lowband.config import load_experiment
    from lowband.engine.simulator import Simulation

    with tempfile.TemporaryDirectory(prefix="bench_pfl_") as tmp:
        exp = load_experiment(CONFIG, [f"rounds={rounds}", f"out_dir={tmp}/run", "eval.at_round0=false",
                                       f"eval.every={rounds}", "checkpoint_every=0", f"threads={threads}",
                                       f"engine.workers={workers}"])
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        Simulation(exp, federation=fed).run()
        wall = time.perf_counter() - t0
        timing = [json.loads(x) for x in (Path(exp.run_dir()) / "timing.jsonl").read_text().splitlines()]
        metrics = [json.loads(x) for x in (Path(exp.run_dir()) / "metrics.jsonl").read_text().splitlines()]
    round_s = [float(t["round_s"]) for t in timing if t["round"] >= 1]
    eval_s = max(float(t.get("eval_s") or 0.0) for t in timing)
    per_round = statistics.median(round_s)
    return {
        "threads": threads, "workers": workers, "round_s": round_s, "median_round_s": per_round,
        "eval_s": eval_s, "wall_s": wall, "load_before": load0, "load_after": os.getloadavg(),
        "projected_h": (TOTAL_ROUNDS * per_round + TOTAL_ROUNDS // EVAL_EVERY * eval_s) / 3600,
        "acc_after": metrics[-1].get("global/acc"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", default="1x1,2x1,1x2", help="threads x workers, comma-separated")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from lowband.config import load_experiment
    from lowband.engine.simulator import make_federation

    fed = make_federation(load_experiment(CONFIG))
    print(f"{fed!r}; cpu {os.cpu_count()} logical; load average {os.getloadavg()}")
    for s in args.settings.split(","):
        threads, workers = (int(v) for v in s.split("x"))
        r = measure(threads, workers, args.rounds, fed)
        print(f"threads {threads} workers {workers}: rounds {', '.join(f'{v:.2f}' for v in r['round_s'])} s "
              f"(median {r['median_round_s']:.2f} s); eval {r['eval_s']:.2f} s; 1,500 rounds + 150 evals "
              f"-> {r['projected_h']:.2f} h; load average {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}; "
              f"acc after {args.rounds} rounds {r['acc_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
