"""Fill a FOL-family config's pretraining cache for some clients, e.g. in two processes at once:

    python experiments/fol/prefill_pretrain.py experiments/fol/cpu/cifar10_psi0.7_fol.toml --nodes 0:35
    python experiments/fol/prefill_pretrain.py experiments/fol/cpu/cifar10_psi0.7_fol.toml --nodes 35:70

It runs exactly the first step of round 1 ("pretrain") of the config's algorithm (fol,
oneshot_fedavg, dense, coboost) on the
given clients, through the simulator's executor (same contexts, same addressed random
generators), so the cached models are the ones the run itself would train; the run then
loads them from ``algorithm.pretrain_cache`` instead of training again. Needs a config
whose algorithm has ``pretrain_cache`` set. Writes nothing else.
"""

from __future__ import annotations

import argparse
import time

from lowband.algorithms.base import Step
from lowband.config import load_experiment
from lowband.engine.simulator import Simulation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--nodes", default=None, help="a:b range of client ids (default all)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    exp = load_experiment(args.config, args.overrides)
    if not exp.algorithm.options().get("pretrain_cache"):
        raise SystemExit("prefill: the config's algorithm has no pretrain_cache")
    sim = Simulation(exp, write=False)
    from lowband.data.sources import clear_cache

    clear_cache()  # the federation holds copies of what it needs; free the full dataset
    plan = sim.topology.plan(0)
    sim.executor.init_states(plan)
    n = sim.num_nodes
    a, b = (0, n) if not args.nodes else (int(x) for x in args.nodes.split(":"))
    for node in range(a, min(b, n)):
        t0 = time.perf_counter()
        # FOL / one-shot FedAvg: the "pretrain" step; DENSE / Co-Boosting: the client step
        # (its upload is not routed here: only the cache is filled)
        fn = getattr(sim.alg, "_pretrain", None) or sim.alg.client_upload
        sim.executor.run_step(Step("pretrain", [node], fn), 1, plan, {})
        st = sim.executor.states[node]
        print(f"node {node}: {st.get('pretrain_epochs')} epochs, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
