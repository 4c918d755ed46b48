"""The robustness grid: attacks x defences (x codecs), one run folder per cell.

Usage (the digits table of docs/results/robustness.md):
    python experiments/robustness/grid.py OUT --algorithm fedavg
    python experiments/robustness/grid.py OUT --algorithm dfedavg
The FMNIST grid of the page is experiments/robustness/fmnist.py (a budgeted list of cells).
Each finished cell appends one JSON line to OUT/results.jsonl (final metrics, the summary's
attack and aggregation, bytes, CPU seconds); a cell whose summary exists is skipped (re-run
to resume). With ``--store ROOT`` each finished run's record also goes into the results
store (``ROOT/robustness/<cell>/seed-<s>.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
from pathlib import Path
from typing import Any, Optional

from lowband.config import validate
from lowband.engine.simulator import Simulation

ATTACKS = ["none", "sign_flip", "scaling", "gaussian", "label_flip", "alie", "ipm", "model_replacement"]
DEFENCES = {"server": ["none", "median", "trimmed_mean", "multikrum", "centered_clipping"],
            "peer": ["none", "bridge", "self_clipping"]}
PEER = ("dfedavg", "dfedavgm", "dpsgd")


def rule_for(name: str, f: int) -> Optional[dict]:
    if name == "none":
        return None
    return {"rule": name, **({"f": f} if name not in ("centered_clipping", "geomed") else {})}


def tag(attack: str, params: Optional[dict]) -> str:
    """The attack's part of a cell name: its kind and the parameters set (``alie_z1``; no dots, a
    store key is a file stem)."""
    return attack + "".join(f"_{k}{v:g}".replace(".", "p") if isinstance(v, float) else f"_{k}{v}"
                            for k, v in sorted((params or {}).items()))


def cell_name(a: Any, attack: str, defence: str, codec: str, params: Optional[dict] = None) -> str:
    c = codec.replace("(", "").replace(")", "").replace(".", "")
    frac = f"-f{int(round(100 * a.fraction))}" if a.fraction and attack != "none" else ""
    return f"{a.prefix}{a.algorithm}-{tag(attack, params)}{frac}-{defence}-{c}"


def config(a: Any, attack: str, defence: str, codec: str, params: Optional[dict] = None) -> dict:
    peer = a.algorithm in PEER
    name = cell_name(a, attack, defence, codec, params)
    cfg: dict[str, Any] = {"name": name, "seed": a.seed, "rounds": a.rounds, "threads": 1,
                           "out_dir": str(Path(a.out) / name),
                           "data": {"dataset": a.dataset, "num_clients": a.clients, "split": [0.75, 0.0, 0.25]},
                           "model": {"name": a.model}, "algorithm": {"name": a.algorithm}, "engine": {"workers": 1},
                           "eval": {"every": a.eval_every, **({"protocols": a.protocols} if a.protocols else {}),
                                    **({"at_round0": False} if a.protocols else {})},
                           "comm": {"codec": codec}}
    if a.local_epochs is not None:
        cfg["algorithm"]["local_epochs"] = a.local_epochs
    if peer:
        cfg["topology"] = {"kind": "kregular", "k": a.k}
    else:
        cfg["topology"] = ({"kind": "star", "sampling": "all"} if a.per_round is None
                           else {"kind": "star", "sampling": "count", "count": a.per_round})
        if codec != "fp32":  # lossy codecs on the uplink's deltas, not on whole weights; fp32 down
            cfg["algorithm"]["upload"] = "delta"
            cfg["comm"] = {"codec": "fp32", "by_kind": {"delta": codec}}
    if a.f is not None:
        f = a.f
    elif not a.fraction:
        f = 1
    elif peer:  # attackers expected in a closed neighbourhood of k + 1, rounded up
        f = max(1, math.ceil(a.fraction * (a.k + 1) - 1e-9))
    else:  # attackers expected among the clients of a round
        f = max(1, round(a.fraction * (a.per_round or a.clients)))
    if attack != "none":
        who = {"fraction": a.fraction} if a.fraction else {"nodes": [3]}
        cfg["faults"] = {"byzantine": {"kind": attack, **who, **(params or {})}}
    rule = rule_for(defence, f)
    if rule:
        cfg["aggregation"] = rule
    return cfg


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_cell(a: Any, attack: str, defence: str, codec: str, params: Optional[dict] = None,
             store: Optional[Path] = None) -> Optional[dict]:
    """Run one cell unless its summary exists; append its row to OUT/results.jsonl and, with
    ``store``, put its record in the results store. Returns the row (None: skipped)."""
    cfg = config(a, attack, defence, codec, params)
    if (Path(cfg["out_dir"]) / "summary.json").exists():
        return None
    t0 = _cpu()
    res = Simulation(validate(cfg)).run()
    cpu = _cpu() - t0
    last = res.metrics[-1]
    row = {"cell": cfg["name"], "algorithm": a.algorithm, "attack": tag(attack, params), "defence": defence,
           "codec": codec, "fraction": a.fraction if attack != "none" else 0.0,
           "metrics": {k: v for k, v in last.items() if "acc" in k or k.startswith(("robust/", "rejected/"))},
           "bytes_total": last["bytes/total"], "bytes_up": last.get("bytes/up"), "cpu_s": round(cpu, 2),
           "summary_attack": res.summary.get("attack", "none"),
           "summary_aggregation": res.summary.get("aggregation", "none")}
    if store is not None:
        from lowband.results.record import write_record
        from lowband.results.store import Store

        write_record(cfg["out_dir"])
        Store(store, "robustness").put(cfg["name"], Path(cfg["out_dir"]))
    with open(Path(a.out) / "results.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
    return row


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="mlp")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--per-round", type=int, default=None)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--fraction", type=float, default=None, help="attackers' fraction (default: node 3 alone)")
    p.add_argument("--f", type=int, default=None, help="f of the rules (default: the attackers expected per "
                                                       "aggregation, >= 1)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--codec", action="append", default=None)
    p.add_argument("--attack", action="append", default=None)
    p.add_argument("--defence", action="append", default=None)
    p.add_argument("--param", action="append", default=None, help="attack parameter KEY=VALUE (JSON value)")
    p.add_argument("--local-epochs", type=int, default=None, help="local epochs (default: the algorithm's)")
    p.add_argument("--protocols", action="append", default=None, help="evaluation protocols (default: the "
                                                                        "algorithm's)")
    p.add_argument("--store", default=None, help="results store root (e.g. docs/results/records)")
    p.add_argument("--prefix", default="", help="prefix of the cells' names")
    return p


def main() -> None:
    a = parser().parse_args()
    peer = a.algorithm in PEER
    Path(a.out).mkdir(parents=True, exist_ok=True)
    params = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.param or [])} or None
    for codec in a.codec or ["fp32"]:
        for attack in a.attack or ATTACKS:
            for defence in a.defence or DEFENCES["peer" if peer else "server"]:
                run_cell(a, attack, defence, codec, params if attack != "none" else None,
                         Path(a.store) if a.store else None)


if __name__ == "__main__":
    main()
