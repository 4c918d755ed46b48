"""Attacks on digits (8 clients, 1 attacker, 20 rounds) with and without a defence.

Usage: python experiments/robustness/digits.py OUT_DIR [fedavg|dfedavg] [attack ...]
Writes one run folder per (algorithm, attack, defence) under OUT_DIR and appends one JSON
line per run to OUT_DIR/results.jsonl (final metrics, summary's attack, aggregation, bytes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lowband.engine.simulator import Simulation
from lowband.config import validate

ATTACKS = [None, "sign_flip", "scaling", "gaussian", "label_flip", "alie", "ipm", "model_replacement"]
DEFENCES = {"fedavg": [None, {"rule": "median", "f": 1}, {"rule": "trimmed_mean", "f": 1},
                       {"rule": "multikrum", "f": 1}, {"rule": "centered_clipping"}],
            "dfedavg": [None, {"rule": "bridge", "f": 1}, {"rule": "self_clipping", "f": 1}]}


def config(out: Path, alg: str, attack: str | None, rule: dict | None) -> dict:
    name = f"{alg}-{attack or 'clean'}-{(rule or {}).get('rule', 'none')}"
    cfg = {"name": name, "seed": 0, "rounds": 20, "threads": 1, "out_dir": str(out / name),
           "data": {"dataset": "digits", "num_clients": 8, "split": [0.75, 0.0, 0.25]},
           "model": {"name": "mlp"}, "algorithm": {"name": alg}, "engine": {"workers": 1},
           "eval": {"every": 20}}
    cfg["topology"] = {"kind": "star", "sampling": "all"} if alg == "fedavg" else {"kind": "kregular", "k": 3}
    if attack:
        cfg["faults"] = {"byzantine": {"kind": attack, "nodes": [3]}}
    if rule:
        cfg["aggregation"] = rule
    return cfg


def main() -> None:
    out = Path(sys.argv[1])
    algs = [sys.argv[2]] if len(sys.argv) > 2 else ["fedavg", "dfedavg"]
    attacks = [None if a == "clean" else a for a in sys.argv[3:]] or ATTACKS
    out.mkdir(parents=True, exist_ok=True)
    for alg in algs:
        for attack in attacks:
            for rule in DEFENCES[alg]:
                cfg = config(out, alg, attack, rule)
                if (Path(cfg["out_dir"]) / "summary.json").exists():
                    continue
                res = Simulation(validate(cfg)).run()
                last = res.metrics[-1]
                row = {"algorithm": alg, "attack": attack or "none", "defence": (rule or {}).get("rule", "none"),
                       "metrics": {k: v for k, v in last.items() if "acc" in k or k.startswith(("robust/", "rejected/"))},
                       "bytes_total": last["bytes/total"], "summary_attack": res.summary["attack"],
                       "summary_aggregation": res.summary["aggregation"]}
                with open(out / "results.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
