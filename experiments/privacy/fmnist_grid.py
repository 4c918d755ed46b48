"""The privacy grid of docs/results/privacy.md: FedAvg on Fashion-MNIST (100 clients, IID, 10
a round) at epsilon {inf, 8, 4, 1} (delta 1e-5) x uplink codec {fp32, qsgd(4), ef(topk(0.01)),
sharedmask(0.1)} x {plain, SecAgg}.

- plain: Poisson client sampling (q = 0.1), central DP-FedAvg (clip S, noise z S on the sum,
  accounted with dp-accounting's PoissonSampledDpEvent, RDP);
- SecAgg: a fixed cohort of 10 (distributed DP splits its noise over a known cohort), SecAgg+
  on the complete graph, distributed DP (Skellam, ``BITS`` bits a coordinate) inside it;
- z is the smallest multiplier whose ``ROUNDS`` rounds stay within the target (the accountant's
  for central DP, a bisection on the Skellam RDP bound for distributed DP).

Each cell is one run folder under OUT_DIR with its record (lowband.results.record); a cell
whose summary exists is skipped (rerun the script to resume). Refused cells are written with
their one-line reason. ``grid.jsonl`` collects one line a cell.

    python experiments/privacy/fmnist_grid.py OUT_DIR [--rounds 100]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from lowband.config import ConfigError, validate
from lowband.engine.simulator import Simulation
from lowband.privacy.accountant import SampledGaussian, noise_for_target
from lowband.privacy.distributed import Skellam, padded, skellam_epsilon
from lowband.privacy.sparsify import support_size
from lowband.results.record import write_record

EPSILONS = (None, 8.0, 4.0, 1.0)
CODECS = ("fp32", "qsgd(4)", "ef(topk(0.01))", "sharedmask(0.1)")
CLIP = 0.5
BITS = 16
DELTA = 1e-5
N, Q, COHORT = 100, 0.1, 10
SHAPES = [(100, 784), (100,), (10, 100), (10,)]  # the mlp's float tensors on FMNIST (79,510)


def base(out: Path, rounds: int, codec: str, secure: bool) -> dict:
    return {
        "name": out.name, "seed": 0, "rounds": rounds, "threads": 1, "out_dir": str(out),
        "data": {"dataset": "fashion_mnist", "num_clients": N, "partition": "iid"},
        "model": {"name": "mlp"},
        "algorithm": {"name": "fedavg", "lr": 0.05, "batch_size": 32, "local_epochs": 1, "upload": "delta"},
        "topology": ({"kind": "star", "sampling": "count", "count": COHORT} if secure
                     else {"kind": "star", "sampling": "poisson", "fraction": Q}),
        "comm": {"by_direction": {"up": codec}},
        "eval": {"protocols": ["global"], "every": 5, "at_round0": True},
        **({"secagg": {"enabled": True}} if secure else {}),
    }


def skellam_z(eps: float, rounds: int, dims: int) -> float:
    """Smallest z (3 significant digits, rounded up) whose Skellam rounds stay within eps."""
    def e(z: float) -> float:
        return skellam_epsilon(Skellam(CLIP, z, BITS, COHORT, dims), rounds, DELTA)
    lo, hi = 0.05, 1.0
    while e(hi) > eps:
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if e(mid) > eps else (lo, mid)
        if hi / lo < 1.0005:
            break
    digits = 3 - int(math.floor(math.log10(hi))) - 1
    return math.ceil(hi * 10**digits) / 10**digits


def dp_section(eps: float, rounds: int, codec: str, secure: bool) -> dict:
    if not secure:
        z = noise_for_target(SampledGaussian(1.0, N, N * Q, "poisson"), rounds, DELTA, eps)
        return {"mechanism": "central", "clip": CLIP, "noise_multiplier": z, "target_epsilon": eps, "delta": DELTA}
    frac = 0.1 if codec.startswith("sharedmask") else None
    dims = support_size(frac, SHAPES) if frac else sum(math.prod(s) for s in SHAPES)
    z = skellam_z(eps, rounds, dims)
    return {"mechanism": "distributed", "clip": CLIP, "noise_multiplier": z, "bits": BITS,
            "target_epsilon": eps, "delta": DELTA}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--only", default="", help="comma-separated cell names (a quick look)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    lines = []
    for eps in EPSILONS:
        for codec in CODECS:
            for secure in (False, True):
                name = f"e{'inf' if eps is None else int(eps)}-{codec.replace('(', '_').replace(')', '')}-" \
                       f"{'secagg' if secure else 'plain'}"
                if only and name not in only:
                    continue
                run = args.out / name
                cfg = base(run, args.rounds, codec, secure)
                if eps is not None:
                    cfg["dp"] = dp_section(eps, args.rounds, codec, secure)
                line = {"cell": name, "epsilon_target": eps, "codec": codec, "secagg": secure,
                        "z": cfg.get("dp", {}).get("noise_multiplier")}
                t = time.process_time()
                if not (run / "summary.json").exists():
                    try:
                        Simulation(validate(cfg)).run()
                    except ConfigError as e:
                        line.update(status="refused", reason=str(e).splitlines()[0])
                        lines.append(line)
                        print(json.dumps(line), flush=True)
                        continue
                    except Exception as e:  # one broken cell must not cost the others their slot
                        line.update(status="error", reason=f"{type(e).__name__}: {e}".splitlines()[0])
                        lines.append(line)
                        print(json.dumps(line), flush=True)
                        continue
                    write_record(run)
                s = json.loads((run / "summary.json").read_text())
                mets = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
                line.update(status="ok", acc=s["final"]["global/acc"], best=max(m.get("global/acc", 0) for m in mets),
                            bytes_up=s["bytes_up"], secagg_bytes=s.get("secagg/bytes"),
                            epsilon=s.get("dp/epsilon"), cpu_s=round(time.process_time() - t, 1),
                            curve=[(m["round"], m.get("global/acc"), m.get("bytes/up"), m.get("dp/epsilon"))
                                   for m in mets if "global/acc" in m])
                lines.append(line)
                print(json.dumps({k: v for k, v in line.items() if k != "curve"}), flush=True)
        (args.out / "grid.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))  # as it goes
    (args.out / "grid.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()
