"""The FMNIST robustness grid of docs/results/robustness.md, sized to a CPU budget.

Usage: python experiments/robustness/fmnist.py OUT [--budget-cpu-s 1800] [--store docs/results/records]

Cells, in the order they run (the most informative first, so a budget that runs out leaves
the least informative ones undone; a re-run skips finished cells and counts their CPU
seconds, read back from OUT/*/results.jsonl, against the budget):

1. FedAvg (fashion_mnist, 100 clients iid, 10 a round, MLP, FedAvg's defaults, 15 rounds),
   20% attackers: {clean, scaling, alie (z = 1), model_replacement} x {none, median,
   trimmed_mean, multikrum, centered_clipping} x {fp32, ef(topk(0.01)), qsgd(4)};
2. DFedAvg (50 nodes, k-regular k = 5, one local epoch a round instead of 20, 20 rounds),
   fp32, 20% attackers: {clean, scaling, alie (z = 1), model_replacement} x {none, bridge,
   self_clipping};
3. FedAvg fp32, 10% attackers: the three attacks x the five defences;
4. DFedAvg fp32, 10% attackers: the three attacks x the three peer defences;
5. FedAvg qsgd(4) and ef(topk(0.01)), 10% attackers.

A cell starts only while the CPU seconds spent (this process and the rows already in OUT)
are under the budget.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import sys

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid import run_cell  # noqa: E402  (experiments/robustness/grid.py)

ATTACKS = [("scaling", None), ("alie", {"z": 1.0}), ("model_replacement", None)]
CODECS = ["fp32", "qsgd(4)", "ef(topk(0.01))"]
SERVER_RULES = ["none", "median", "trimmed_mean", "multikrum", "centered_clipping"]
PEER_RULES = ["none", "bridge", "self_clipping"]


def setup(out: Path, algorithm: str, fraction: float) -> SimpleNamespace:
    peer = algorithm == "dfedavg"
    return SimpleNamespace(out=str(out / f"{algorithm}{int(round(100 * fraction))}"), algorithm=algorithm,
                           dataset="fashion_mnist", model="mlp", clients=50 if peer else 100,
                           per_round=None if peer else 10, k=5, fraction=fraction, f=None,
                           rounds=20 if peer else 15, eval_every=20 if peer else 15, seed=0, local_epochs=1 if peer else None,
                           protocols=["consensus"] if peer else ["global"], prefix="fmnist-")


def plan(out: Path) -> list[tuple[SimpleNamespace, str, str, str, dict | None]]:
    cells = []
    f20, d20 = setup(out, "fedavg", 0.2), setup(out, "dfedavg", 0.2)
    f10, d10 = setup(out, "fedavg", 0.1), setup(out, "dfedavg", 0.1)
    for codec in ("fp32", "ef(topk(0.01))", "qsgd(4)"):
        for attack, params in [("none", None)] + ATTACKS:
            for rule in SERVER_RULES:
                cells.append((f20, attack, rule, codec, params))
    for attack, params in [("none", None)] + ATTACKS:
        for rule in PEER_RULES:
            cells.append((d20, attack, rule, "fp32", params))
    for attack, params in ATTACKS:
        for rule in SERVER_RULES:
            cells.append((f10, attack, rule, "fp32", params))
    for attack, params in ATTACKS:
        for rule in PEER_RULES:
            cells.append((d10, attack, rule, "fp32", params))
    for codec in CODECS[1:]:
        for attack, params in ATTACKS:
            for rule in SERVER_RULES:
                cells.append((f10, attack, rule, codec, params))
    return cells


def spent(out: Path) -> float:
    total = 0.0
    for p in out.glob("*/results.jsonl"):
        total += sum(json.loads(x).get("cpu_s", 0.0) for x in p.read_text().splitlines() if x.strip())
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--budget-cpu-s", type=float, default=1800.0)
    p.add_argument("--store", default=None)
    a = p.parse_args()
    out = Path(a.out)
    cells = plan(out)
    for s, attack, rule, codec, params in cells:
        Path(s.out).mkdir(parents=True, exist_ok=True)
        used = spent(out)
        if used >= a.budget_cpu_s:
            print(f"budget spent ({used:.0f} CPU s of {a.budget_cpu_s:.0f}); stopping", flush=True)
            break
        run_cell(s, attack, rule, codec, params, Path(a.store) if a.store else None)
    print(f"done: {spent(out):.0f} CPU s", flush=True)


if __name__ == "__main__":
    main()
