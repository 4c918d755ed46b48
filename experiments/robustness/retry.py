"""The attacks of issue 40's first paragraph re-tried as written, on digits.

Usage: python experiments/robustness/retry.py OUT fedavg|dfedavg [--store docs/results/records]

Digits, 8 clients (iid, 75/25 train/test per client), MLP, each algorithm's defaults, 20
rounds, node 3 attacking: a sign-flipping client (the update flipped, -u, Karimireddy et
al. 2021's "bit flipping"; the same at 10x, -10u, the strength that outweighs the seven
honest updates of the mean; and the whole message negated, the model for FedAvg's weights
upload, RSA's sign flip of Li et al. 2019), 20x and 50x scaling, label flipping and model
replacement, each undefended and under every rule of its family. One run folder per cell
under OUT, one line per cell in OUT/results.jsonl, records in the store with ``--store``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid import DEFENCES, run_cell  # noqa: E402  (experiments/robustness/grid.py)

ATTACKS = [("none", None), ("sign_flip", None), ("sign_flip", {"scale": 10.0}), ("sign_flip", {"on": "message"}),
           ("scaling", None), ("scaling", {"scale": 50.0}), ("label_flip", None), ("model_replacement", None)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("algorithm", choices=["fedavg", "dfedavg"])
    p.add_argument("--store", default=None)
    a = p.parse_args()
    s = SimpleNamespace(out=str(Path(a.out) / a.algorithm), algorithm=a.algorithm, dataset="digits", model="mlp",
                        clients=8, per_round=None, k=3, fraction=None, f=1, rounds=20, eval_every=20, seed=0,
                        local_epochs=None, protocols=None, prefix="digits-")
    Path(s.out).mkdir(parents=True, exist_ok=True)
    for attack, params in ATTACKS:
        for rule in DEFENCES["peer" if a.algorithm == "dfedavg" else "server"]:
            run_cell(s, attack, rule, "fp32", params, Path(a.store) if a.store else None)


if __name__ == "__main__":
    main()
