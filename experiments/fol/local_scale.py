"""FOL's "Local" baseline against compute: pretrain some target clients at several scales.

    python experiments/fol/local_scale.py experiments/fol/cpu/cifar10_psi0.7_fol.toml \
        --nodes 0,1,2,3,4,9 --scale "width=32 epochs=150 patience=10" \
        --scale "width=32 epochs=300 patience=20" --scale "width=128 epochs=300 patience=20"

Every FOL-family number builds on the clients' pretrained models, and the "Local" row of
the paper's table 3 *is* the pretrained model on the client's own test split. This runs
exactly the config's pretraining step (the simulator's executor, the same addressed random
generators as a run) for the given clients at each scale (model width, maximum epochs,
early-stopping patience), without reading or writing any pretraining cache, and prints
each client's local test accuracy, the epochs it trained and the seconds it took. It is
the scale series of issue 15 part 6 for the stage that sets FOL's absolute level.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from lowband.algorithms.base import Step
from lowband.config import load_experiment
from lowband.engine.simulator import Simulation


def run_scale(config: str, nodes: list[int], width: int, epochs: int, patience: int,
              extra: list[str]) -> list[tuple[int, float, int, float, int]]:
    """(node, local test accuracy, epochs trained, seconds, parameters) for each node at one scale."""
    with tempfile.TemporaryDirectory() as cache:
        exp = load_experiment(config, [f"model.width={width}", f"algorithm.pretrain_epochs={epochs}",
                                       f"algorithm.patience={patience}", f"algorithm.pretrain_cache={cache}",
                                       f"algorithm.targets={nodes}", *extra])
        sim = Simulation(exp, write=False)
        plan = sim.topology.plan(0)
        sim.executor.init_states(plan)
        out = []
        for node in nodes:
            t0 = time.perf_counter()
            sim.executor.run_step(Step("pretrain", [node], sim.alg._pretrain), 1, plan, {})
            st = sim.executor.states[node]
            ctx = sim.executor.context(node, 1, plan)
            acc = sim.alg._acc(sim.executor.model_for(node), st["local0"], ctx)
            n_params = sum(int(v.numel()) for v in st["local0"].values())
            out.append((node, acc, int(st.get("pretrain_epochs") or 0), time.perf_counter() - t0, n_params))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--nodes", default="9", help="comma-separated client ids (default: 9, the paper's)")
    ap.add_argument("--scale", action="append", required=True,
                    help='"width=W epochs=E patience=P" (repeatable: one row each)')
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    nodes = [int(x) for x in args.nodes.split(",")]
    print(f"config {args.config}; clients {nodes}; local test accuracy (%) of the pretrained model")
    print("| width | parameters | max epochs | patience | " + " | ".join(f"client {n}" for n in nodes)
          + " | mean | epochs trained | seconds |")
    print("|---|---|---|---|" + "---|" * len(nodes) + "---|---|---|")
    for spec in args.scale:
        kv = dict(item.split("=") for item in spec.split())
        rows = run_scale(args.config, nodes, int(kv["width"]), int(kv["epochs"]), int(kv["patience"]),
                         args.overrides)
        accs = [100 * r[1] for r in rows]
        print(f"| {kv['width']} | {rows[0][4]:,} | {kv['epochs']} | {kv['patience']} | "
              + " | ".join(f"{a:.2f}" for a in accs) + f" | {statistics.mean(accs):.2f} | "
              + ", ".join(str(r[2]) for r in rows) + f" | {sum(r[3] for r in rows):.0f} |", flush=True)


if __name__ == "__main__":
    main()
