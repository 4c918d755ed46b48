#!/usr/bin/env python
"""A Flower round against a `lowband run` round, and where the difference goes.

For each workload the script runs the same config three ways and reads the per-round
``round_s`` (training + messaging) and ``eval_s`` (evaluation) from each run folder's
``timing.jsonl`` (one driver writes it on every path):

1. ``lowband``: ``lowband run`` (:class:`lowband.engine.simulator.Simulation`);
   ``alone``: the same with ``engine.vectorize = "off"`` (each client trains alone, as a
   ClientApp does: the part of the gap that is lowband's cohort training, which a
   deployment of one client per SuperNode cannot use);
2. ``adapter``: the Flower adapter's ServerApp loop (:class:`lowband.flower.FlowerRun`)
   driving its ClientApp through an in-process Grid (every message is a real Flower
   ``Message`` handled by the real ``ClientApp``, without Flower's runtime): lowband's
   own cost of speaking Flower (encoding, per-message client setup, evaluation messages);
3. ``flower``: Flower's simulation runtime (``flwr.simulation.run_simulation``, Ray
   backend, one virtual-client actor on one CPU): what a user of the adapter waits for.
   ``flower - adapter`` is Flower's plumbing (its message store, Ray actors, serialisation).

All must write the same metrics.jsonl as ``lowband`` (the script checks it and says so;
``alone`` trains otherwise and may differ). The figures are means over rounds 1..R
(timing.jsonl has no line for round 0's evaluation; ``wall_s``, the whole call, includes
start-up and the ClientApp cold start). ``cpu_s`` is this process's CPU seconds per round
(Flower's Ray actors are not in it). ``--profile`` writes a cProfile of the ``adapter`` path
per workload and prints its top functions by cumulative time.

Usage (from the repository root, ``LOWBAND_DATA`` set)::

    python benchmarks/bench_flower.py [--workloads fmnist,digits100,digits500] [--rounds R]
        [--paths lowband,adapter,flower] [--profile DIR] [--json out.json]

Timings are only meaningful on an otherwise quiet machine: the load average is printed
before and after; compare ratios taken within one run of the script.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from _common import loadavg, machine

WORKLOADS: dict[str, dict[str, Any]] = {
    # experiments/baselines/fedavg_fmnist_dir03.toml (100 clients, 10 a round, CNN), 1 local epoch
    "fmnist": {"base": "experiments/baselines/fedavg_fmnist_dir03.toml",
               "over": {"algorithm": {"local_epochs": 1}}},
    # the digits MLP of tests/test_flower.py at 100 and 500 clients, 10 a round
    "digits100": {"clients": 100},
    "digits500": {"clients": 500},
}


def config(name: str, rounds: int, out: Path) -> dict[str, Any]:
    """The workload's lowband config (a dict), ``rounds`` rounds, one thread, no target."""
    from lowband.config.loading import load_toml

    w = WORKLOADS[name]
    if "base" in w:
        cfg = load_toml(Path(w["base"]))
        for k, v in w["over"].items():
            cfg.setdefault(k, {}).update(v)
        cfg.setdefault("eval", {}).pop("target", None)
    else:
        cfg = {"seed": 3,
               "data": {"dataset": "digits", "num_clients": w["clients"], "partition": "iid", "split": [0.75, 0.0, 0.25]},
               "model": {"name": "mlp", "hidden": 32},
               "algorithm": {"name": "fedavg", "local_epochs": 1, "batch_size": 16, "lr": 0.05},
               "topology": {"kind": "star", "sampling": "count", "count": 10},
               "eval": {"protocols": ["global", "personal"]}}
    cfg.update(name=f"bench-flower-{name}", rounds=rounds, threads=1, out_dir=str(out))
    cfg["checkpoint_every"] = 0  # the Flower paths keep no checkpoint: neither does lowband here
    return cfg


class InProcessGrid:
    """A Flower ``Grid`` that hands each message to the ClientApp in this process, one
    ``Context`` per SuperNode (the ClientApp's state persists in it, as on a SuperNode).
    Counts the messages it carries, by message type."""

    def __init__(self, app: Any, num_nodes: int):
        from flwr.app import Context, RecordDict

        self.app = app
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i, state=RecordDict(), run_config={},
                                          node_config={"partition-id": i, "num-partitions": num_nodes})
                         for i in range(num_nodes)}
        self.sent: dict[str, int] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: Any = None) -> list[Any]:
        out = []
        for m in messages:
            t = m.metadata.message_type
            self.sent[t] = self.sent.get(t, 0) + 1
            out.append(self.app(m, self.contexts[m.metadata.dst_node_id]))
        return out


def _task_identity() -> None:
    """What Flower's runtime sets in a ServerApp process before Messages can be created."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 0  # type: ignore[attr-defined]


def run_path(path: str, cfg: dict[str, Any], profile: Path | None = None) -> dict[str, Any]:
    """Run ``cfg`` on ``path``; its timing lines, metrics text and wall seconds."""
    from lowband.config import validate

    exp = validate(cfg)
    n = int(cfg["data"]["num_clients"])
    extra: dict[str, Any] = {}
    t0 = time.perf_counter()
    if path in ("lowband", "alone"):
        from lowband.engine.simulator import Simulation

        if path == "alone":
            exp = validate({**cfg, "engine": {**cfg.get("engine", {}), "vectorize": "off"}})
        Simulation(exp).run()
    elif path == "adapter":
        from lowband.flower import FlowerRun, client_app

        _task_identity()
        grid = InProcessGrid(client_app(exp), n)
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        FlowerRun(exp, grid).run()
        if prof:
            prof.disable()
            prof.dump_stats(str(profile))
        extra["messages"] = dict(grid.sent)
    elif path == "flower":
        from flwr.simulation import run_simulation

        from lowband.flower import client_app, server_app

        run_simulation(server_app=server_app(exp), client_app=client_app(exp), num_supernodes=n,
                       backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 1}})
    else:
        raise SystemExit(f"--paths: unknown path {path!r} (lowband, alone, adapter, flower)")
    wall = time.perf_counter() - t0
    d = exp.run_dir()
    timing = [json.loads(x) for x in (d / "timing.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "timing": timing, "metrics": (d / "metrics.jsonl").read_text(), **extra}


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """The mean round (1..R): seconds training and messaging, evaluating, in all; CPU seconds."""
    t = res["timing"]
    later = [x for x in t if x["round"] > 0]
    out = {"wall_s": round(res["wall_s"], 2),
           "round_s": sum(x["round_s"] for x in later) / max(len(later), 1),
           "eval_s": sum(x["eval_s"] for x in later) / max(len(later), 1)}
    out["total_s"] = out["round_s"] + out["eval_s"]
    if later and all("cpu_s" in x for x in later):  # this process's CPU seconds (not Ray's actors)
        out["cpu_s"] = sum(x["cpu_s"] for x in later) / len(later)
    if "messages" in res:
        out["messages"] = res["messages"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="fmnist,digits100,digits500")
    ap.add_argument("--paths", default="lowband,alone,adapter,flower")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", type=Path, default=None, help="folder for the adapter path's cProfile files")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    import torch

    torch.set_num_threads(1)
    report: dict[str, Any] = {"machine": machine(), "load_before": loadavg(), "rounds": args.rounds, "workloads": {}}
    print(f"load average before: {report['load_before']}", flush=True)
    paths = args.paths.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        for w in args.workloads.split(","):
            rows: dict[str, Any] = {}
            metrics: dict[str, str] = {}
            for p in paths:
                prof = None
                if args.profile is not None and p == "adapter":
                    args.profile.mkdir(parents=True, exist_ok=True)
                    prof = args.profile / f"{w}-adapter.prof"
                res = run_path(p, config(w, args.rounds, Path(tmp) / f"{w}-{p}"), prof)
                rows[p] = summarize(res)
                metrics[p] = res["metrics"]
                print(f"{w:10s} {p:8s} " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                     for k, v in rows[p].items()), flush=True)
                if prof is not None:
                    s = io.StringIO()
                    pstats.Stats(str(prof), stream=s).sort_stats("cumulative").print_stats(25)
                    print(s.getvalue(), flush=True)
            ref = metrics.get("lowband")
            rows["same_metrics"] = {p: metrics[p] == ref for p in metrics if ref is not None and p != "lowband"}
            if "lowband" in rows:
                base = rows["lowband"]["total_s"]
                rows["ratio"] = {p: round(rows[p]["total_s"] / base, 2) for p in paths if p != "lowband"}
            print(f"{w:10s} ratio to lowband (mean round 1..R): {rows.get('ratio')}; "
                  f"metrics.jsonl identical: {rows['same_metrics']}", flush=True)
            report["workloads"][w] = rows
    report["load_after"] = loadavg()
    print(f"load average after: {report['load_after']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
