"""One poisoned client against FedAvg and DFedAvg: does the federation notice, and does it
end where it would have without that client? (issue 14, "what it must show").

    python benchmarks/poisoned_clients.py --rounds 30

For each algorithm it runs, on one federation (digits, 8 clients, Dirichlet 0.5, the MLP;
FedAvg samples every client, DFedAvg gossips on a 3-regular graph):

- ``clean``: every client honest;
- ``minus``: client 0 absent every round (``faults.dropout_schedule``): the reference a
  poisoned run must match;
- ``nan``: client 0 sends NaN in every float tensor of every message;
- ``lr1e6``: client 0 trains with ``lr = 1e6`` (huge, finite weights);
- ``lr1e6, screen off``: the same with ``comm.norm_factor = 0``: what the default screen
  prevents.

Client 0 is poisoned by wrapping the algorithm's client step (``nan``) or local training
(``lr1e6``) in this process, as tests/test_validation.py does; nothing in the library
changes. Printed: the run's main metric at the last round (FedAvg ``personal/acc_weighted``,
DFedAvg ``consensus/acc``, the accuracy of the average of *all* nodes' models, client 0's
own included), the honest side's accuracy on the global test set (FedAvg's server model;
the mean of the honest nodes' own models), its difference from ``minus``, and the
rejections counted in metrics.jsonl. Exit 1 if a guarded poisoned run's honest accuracy
ends more than 2 points from ``minus``, or it rejected nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

import lowband.algorithms.decentralised.gossip as gossip
import lowband.algorithms.server.fedavg as fedavg
from lowband.comm.message import SERVER
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.train import predict_logits

POISONED = 0


def config(algorithm: str, rounds: int, out: Path, **extra: Any) -> dict:
    peer = algorithm != "fedavg"
    cfg = {"name": f"poison-{algorithm}", "seed": 1, "rounds": rounds, "threads": 1, "out_dir": str(out),
           "data": {"dataset": "digits", "num_clients": 8, "partition": "dirichlet", "alpha": 0.5, "min_size": 20,
                    "split": [0.75, 0.0, 0.25]},
           "model": {"name": "mlp", "hidden": 32},
           "algorithm": {"name": algorithm, "local_epochs": 1, "batch_size": 16, "lr": 0.05},
           "topology": {"kind": "kregular", "k": 3} if peer else {"kind": "star", "sampling": "all"},
           "eval": {"every": rounds}}
    cfg.update(extra)
    return cfg


@contextlib.contextmanager
def patched(obj: Any, name: str, new: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, new)
    try:
        yield
    finally:
        setattr(obj, name, old)


def nan_client(algorithm: str) -> contextlib.AbstractContextManager:
    cls, method = (fedavg.FedAvg, "client_update") if algorithm == "fedavg" else (gossip.GossipAlgorithm, "train_send")
    orig = getattr(cls, method)

    def poisoned(self, ctx, state, inbox):
        new, out = orig(self, ctx, state, inbox)
        if ctx.node == POISONED:
            for _, msg in out.items:
                msg.tensors = {k: torch.full_like(v, math.nan) if v.is_floating_point() else v
                               for k, v in msg.tensors.items()}
        return new, out

    return patched(cls, method, poisoned)


def huge_lr(algorithm: str) -> contextlib.AbstractContextManager:
    module = fedavg if algorithm == "fedavg" else gossip
    orig = module.local_train

    def local_train(ctx, params, *args, **kw):
        if ctx.node == POISONED:
            kw["hp"] = ctx.hp.model_copy(update={"lr": 1e6})
        return orig(ctx, params, *args, **kw)

    return patched(module, "local_train", local_train)


def honest_accuracy(sim: Simulation) -> float:
    """Global-test accuracy of what the honest side holds at the end: FedAvg's server
    model; for peers, the mean over the honest nodes of their own models (the run's
    ``consensus`` metric averages every node's model, client 0's own included)."""
    x, y = sim.fed.global_test_x, sim.fed.global_test_y
    net = sim.executor.env.model_factory(0)
    states = sim.executor.states
    holders = [SERVER] if SERVER in states and "params" in states[SERVER] else \
        [n for n in range(sim.num_nodes) if n != POISONED]
    accs = [float((predict_logits(net, states[n]["params"], x).argmax(1) == y).float().mean()) for n in holders]
    return sum(accs) / len(accs)


def run(cfg: dict) -> tuple[float, float, dict[str, int]]:
    """(the run's main metric at its last round, honest accuracy, rejections by reason)."""
    sim = Simulation(validate(cfg))
    res = sim.run()
    recs = [json.loads(line) for line in (Path(res.run_dir) / "metrics.jsonl").read_text().splitlines()]
    rej: dict[str, int] = {}
    for r in recs:
        for k, v in r.items():
            if k.startswith("rejected/"):
                rej[k.split("/", 1)[1]] = rej.get(k.split("/", 1)[1], 0) + int(v)
    value = recs[-1].get(sim.main_metric)
    return (math.nan if value is None else float(value)), honest_accuracy(sim), rej


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--algorithms", default="fedavg,dfedavg")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bad = 0
    print(f"{'algorithm':9} {'run':24} {'main':>7} {'honest':>7} {'vs minus':>9}  rejected")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for alg in args.algorithms.split(","):
            without = {"faults": {"dropout_schedule": [[r, POISONED] for r in range(1, args.rounds + 1)]}}
            rows = [("clean", *run(config(alg, args.rounds, root / f"{alg}-clean"))),
                    ("minus (client 0 absent)", *run(config(alg, args.rounds, root / f"{alg}-minus", **without)))]
            minus = rows[1][2]
            with nan_client(alg):
                rows.append(("nan", *run(config(alg, args.rounds, root / f"{alg}-nan"))))
            with huge_lr(alg):
                rows.append(("lr1e6", *run(config(alg, args.rounds, root / f"{alg}-lr"))))
                rows.append(("lr1e6, screen off", *run(config(alg, args.rounds, root / f"{alg}-lr-off",
                                                               comm={"norm_factor": 0}))))
            for name, main_value, acc, rej in rows:
                gap = acc - minus
                print(f"{alg:9} {name:24} {main_value:7.4f} {acc:7.4f} {gap:+9.4f}  {rej or '-'}")
                if name in ("nan", "lr1e6") and (not rej or not abs(gap) <= 0.02):
                    bad += 1
    print("RESULT:", "ok" if not bad else f"{bad} guarded run(s) off by more than 2 points or unnoticed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
