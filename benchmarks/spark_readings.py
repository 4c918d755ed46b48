#!/usr/bin/env python
"""SPARK's readings of eq. 3 (``projection_layout``): coordinates and bytes per round.

For each reading (``sum``: one ``d x k`` ``P``; ``tensor`` / ``module``: the per-layer blocks
concatenated per weight tensor / per module, a block of at most k entries kept whole) this
script builds the experiment (federation, round-1 graph, projection) without training and
counts the bytes of round 1 from the message shapes SPARK sends on every directed edge
j -> i (``coords`` and ``request``: the coordinates; ``logits``: ``f(X_j)``, the labels and,
with distillation, ``z_j``; ``jacobian``: ``J(X_j) P``, ``n_j x C x dim``), each encoded
with the run's own codec (``Network.encode``), so the sizes include the wire headers.

``--check NODES`` also runs one real round at NODES nodes for each reading and compares the
count with that run's ledger (they must agree to the byte).

    LOWBAND_DATA=../shared/data python benchmarks/spark_readings.py                 # paper size
    LOWBAND_DATA=../shared/data python benchmarks/spark_readings.py --check 8 --set algorithm.k=50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lowband.comm.message import Message  # noqa: E402
from lowband.config import load_experiment  # noqa: E402
from lowband.engine.simulator import Simulation  # noqa: E402

LAYOUTS = ("sum", "tensor", "module")


def simulation(config: Path, layout: str, overrides: list[str], out: str) -> Simulation:
    exp = load_experiment(config, [f'out_dir="{out}"', "rounds=1", "threads=1", "eval.at_round0=false",
                                   'eval.protocols=["consensus"]', "checkpoint_every=0",
                                   f'algorithm.projection_layout="{layout}"', *overrides])
    return Simulation(exp)


def round_bytes(sim: Simulation, round: int = 1) -> tuple[int, dict[str, int], int]:
    """(coordinates, bytes per kind, directed edges) of round ``round`` from the shapes."""
    plan = sim.topology.plan(round - 1)
    ctx = sim.executor.context(0, round, plan)
    dim = sim.alg._projection(ctx).dim
    c = sim.fed.num_classes
    distill = bool(sim.alg.hp.distill)
    cache: dict[tuple, int] = {}

    def size(kind: str, tensors: dict[str, tuple[tuple[int, ...], torch.dtype]], src: int, dst: int) -> int:
        key = (kind, tuple((k, s, d) for k, (s, d) in sorted(tensors.items())))
        if key not in cache:
            msg = Message(kind, {k: torch.zeros(s, dtype=d) for k, (s, d) in tensors.items()})
            cache[key] = len(sim.network.encode(msg, src, dst, round=round))
        return cache[key]

    total = {"coords": 0, "request": 0, "logits": 0, "jacobian": 0}
    edges = 0
    f32, lab = torch.float32, (torch.uint8 if c <= 255 else torch.int64)
    for i, nbrs in plan.neighbors.items():
        for j in nbrs:  # j answers requester i; i and j also exchange coordinates
            edges += 1
            n = int(sim.fed.nodes[j].n_train)
            total["coords"] += size("coords", {"theta": ((dim,), f32)}, j, i)
            total["request"] += size("request", {"theta": ((dim,), f32)}, i, j)
            lg = {"f0": ((n, c), f32), "y": ((n,), lab)}
            if distill:
                lg["z"] = ((n, c), f32)
            total["logits"] += size("logits", lg, j, i)
            total["jacobian"] += size("jacobian", {"jac": ((n, c, dim), f32)}, j, i)
    return dim, total, edges


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "experiments" / "spark" / "spark_a0.1.toml"))
    ap.add_argument("--set", action="append", default=[], help="a config override (repeatable)")
    ap.add_argument("--check", type=int, default=0, metavar="NODES",
                    help="also run one round at NODES nodes per reading and compare with its ledger")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("reading   coordinates  coords+request  logits     jacobian      total/round   per edge")
        for layout in LAYOUTS:
            sim = simulation(Path(args.config), layout, args.set, f"{tmp}/{layout}")
            dim, b, edges = round_bytes(sim)
            tot = sum(b.values())
            print(f"{layout:<8} {dim:>12,} {(b['coords'] + b['request']) / 1e6:>12.2f} MB {b['logits'] / 1e6:>7.2f} MB "
                  f"{b['jacobian'] / 1e9:>9.3f} GB {tot / 1e9:>10.3f} GB {tot / edges / 1e6:>8.2f} MB", flush=True)
        if args.check:
            for layout in LAYOUTS:
                sim = simulation(Path(args.config), layout, [*args.set, f"data.num_clients={args.check}"],
                                 f"{tmp}/check-{layout}")
                _, b, _ = round_bytes(sim)
                sim.run()
                led = {k: int(v["encoded"]) for k, v in sim.ledger.by_kind(round=1).items()}
                ok = led == b
                print(f"check {layout} at {args.check} nodes: computed {b} ledger {led}: {'equal' if ok else 'DIFFERENT'}")
                if not ok:
                    raise SystemExit(1)


if __name__ == "__main__":
    main()
