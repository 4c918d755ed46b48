"""The robustness grid: attacks x defences (x codecs), one run folder per cell.

Usage (the digits table of docs/results/robustness.md):
    python experiments/robustness/grid.py OUT --algorithm fedavg
    python experiments/robustness/grid.py OUT --algorithm dfedavg
The FMNIST grid (to be collected):
    python experiments/robustness/grid.py OUT --dataset fashion_mnist --clients 100 --per-round 10 \
        --fraction 0.1 --rounds 100 --codec fp32 --codec "qsgd(4)" --codec "ef(topk(0.01))"
Each finished cell appends one JSON line to OUT/results.jsonl (final metrics, the summary's
attack and aggregation, bytes); a cell whose summary exists is skipped (re-run to resume).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from lowband.engine.simulator import Simulation
from lowband.config import validate

ATTACKS = ["none", "sign_flip", "scaling", "gaussian", "label_flip", "alie", "ipm", "model_replacement"]
DEFENCES = {"server": ["none", "median", "trimmed_mean", "multikrum", "centered_clipping"],
            "peer": ["none", "bridge", "self_clipping"]}


def rule_for(name: str, f: int) -> Optional[dict]:
    if name == "none":
        return None
    return {"rule": name, **({"f": f} if name not in ("centered_clipping", "geomed") else {})}


def config(a: argparse.Namespace, attack: str, defence: str, codec: str) -> dict:
    peer = a.algorithm in ("dfedavg", "dfedavgm", "dpsgd")
    tag = codec.replace("(", "").replace(")", "").replace(".", "")
    name = f"{a.algorithm}-{attack}-{defence}-{tag}"
    cfg = {"name": name, "seed": a.seed, "rounds": a.rounds, "threads": 1, "out_dir": str(Path(a.out) / name),
           "data": {"dataset": a.dataset, "num_clients": a.clients, "split": [0.75, 0.0, 0.25]},
           "model": {"name": a.model}, "algorithm": {"name": a.algorithm}, "engine": {"workers": 1},
           "eval": {"every": a.eval_every}, "comm": {"codec": codec}}
    if a.dataset == "digits":
        cfg["data"]["split"] = [0.75, 0.0, 0.25]
    if peer:
        cfg["topology"] = {"kind": "kregular", "k": a.k}
    else:
        cfg["topology"] = ({"kind": "star", "sampling": "all"} if a.per_round is None
                           else {"kind": "star", "sampling": "count", "count": a.per_round})
        if codec != "fp32":
            cfg["algorithm"]["upload"] = "delta"  # lossy codecs on deltas, not on whole weights
    f = a.f if a.f is not None else max(1, round(a.fraction * (a.per_round or a.clients))) if a.fraction else 1
    if attack != "none":
        cfg["faults"] = {"byzantine": {"kind": attack, **({"fraction": a.fraction} if a.fraction else {"nodes": [3]})}}
    rule = rule_for(defence, f if not peer else 1)
    if rule:
        cfg["aggregation"] = rule
    return cfg


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="mlp")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--per-round", type=int, default=None)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--fraction", type=float, default=None, help="attackers' fraction (default: node 3 alone)")
    p.add_argument("--f", type=int, default=None, help="f of the rules (default: the attackers per round, >= 1)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--codec", action="append", default=None)
    p.add_argument("--attack", action="append", default=None)
    p.add_argument("--defence", action="append", default=None)
    a = p.parse_args()
    peer = a.algorithm in ("dfedavg", "dfedavgm", "dpsgd")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for codec in a.codec or ["fp32"]:
        for attack in a.attack or ATTACKS:
            for defence in a.defence or DEFENCES["peer" if peer else "server"]:
                cfg = config(a, attack, defence, codec)
                if (Path(cfg["out_dir"]) / "summary.json").exists():
                    continue
                res = Simulation(validate(cfg)).run()
                last = res.metrics[-1]
                row = {"algorithm": a.algorithm, "attack": attack, "defence": defence, "codec": codec,
                       "metrics": {k: v for k, v in last.items() if "acc" in k or k.startswith(("robust/", "rejected/"))},
                       "bytes_total": last["bytes/total"], "summary_attack": res.summary["attack"],
                       "summary_aggregation": res.summary["aggregation"]}
                with open(out / "results.jsonl", "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
