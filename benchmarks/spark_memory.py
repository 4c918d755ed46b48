"""SPARK against its memory budgets and its first round against NTK-DFL's (issue 43 item 4).

Runs SPARK's default configuration (``experiments/spark/spark_af0.7_tf1_a0.1.toml``) and
NTK-DFL's (``ntk_dfl_a0.1.toml``) at ``--nodes`` nodes for ``--rounds`` rounds, one after the
other in this process's children (each method in a fresh process), both serial
(``engine.workers = 1``; SPARK's default is serial too) with torch's default threads, and
reports for each: the base (resident memory once the federation, the nodes' states and
SPARK's ``P`` are built, as round 1's first step starts), the peak resident memory of the
run's whole process tree (its process and any workers, sampled by :class:`_common.TreeRSS`
every 0.1 s, at least the process's own ``ru_maxrss``; this measuring parent is not counted),
every round's time, and the time per step kind (share / request / reply / update / commit); then SPARK's peak
against ``base + xp_cache_mb + max_inflight_mb`` and its first round against NTK-DFL's, with
the load average before and after.

    LOWBAND_DATA=../shared/data python benchmarks/spark_memory.py --nodes 100
    LOWBAND_DATA=../shared/data python benchmarks/spark_memory.py --nodes 300 --only spark

Extra ``key=value`` arguments after ``--`` go to every run measured (NTK-DFL refuses SPARK's
memory keys it does not read, so give those with ``--only spark``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TreeRSS, loadavg  # noqa: E402

CONFIGS = {"spark": "experiments/spark/spark_af0.7_tf1_a0.1.toml", "ntk_dfl": "experiments/spark/ntk_dfl_a0.1.toml"}


def child(config: str, overrides: list[str]) -> dict:
    """One run in this process: base, per-round and per-step times, own peak RSS."""
    import resource

    from lowband.config.loading import apply_overrides, load_toml
    from lowband.config.resolve import validate
    from lowband.engine import rounds as rounds_mod
    from lowband.engine.simulator import Simulation

    steps: dict[str, float] = {}
    per_round: dict[int, float] = {}
    original = rounds_mod.Place.step

    base: list[int] = []

    def timed(self, spec, round, plan, name, actors, *a, **k):  # type: ignore[no-untyped-def]
        if not base:  # the nodes' states (and SPARK's P) exist; round 1 has not started
            base.append(int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]))
        t = time.perf_counter()
        try:
            return original(self, spec, round, plan, name, actors, *a, **k)
        finally:
            dt = time.perf_counter() - t
            kind = f"r{round} {name.rstrip('0123456789')}"
            steps[kind] = steps.get(kind, 0.0) + dt
            per_round[round] = per_round.get(round, 0.0) + dt

    rounds_mod.Place.step = timed
    sim = Simulation(validate(apply_overrides(load_toml(ROOT / config), overrides)))
    hp = sim.alg.hp
    with TreeRSS(interval=0.1) as tree:  # this run's process and any workers it starts
        sim.run()
    return {"base_kib": base[0], "peak_self_kib": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
            "peak_tree_kib": max(tree.peak_kib, int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)),
            "round_s": per_round, "steps_s": steps, "groups": sim.alg.num_groups(sim.topology.plan(0)),
            "budgets_mb": {k: getattr(hp, k, None) for k in ("xp_cache_mb", "max_inflight_mb", "xp_cache_disk_mb")}}


def measure(method: str, nodes: int, rounds: int, extra: list[str], out: Path) -> dict:
    """``method`` in a child process (which samples its own tree's peak RSS)."""
    overrides = [f"data.num_clients={nodes}", f"rounds={rounds}", "engine.workers=1",
                 f"out_dir={out / method}", *extra]
    result = out / f"{method}.json"
    cmd = [sys.executable, __file__, "--child", CONFIGS[method], "--result", str(result), "--", *overrides]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    r = json.loads(result.read_text())
    r["wall_s"] = time.perf_counter() - t
    return r


def gib(kib: float) -> str:
    return f"{kib / 2**20:.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", choices=sorted(CONFIGS), default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    if a.child:
        Path(a.result).write_text(json.dumps(child(a.child, a.overrides)))
        return
    print("load average before:", loadavg())
    res: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="spark-memory-", dir=os.environ.get("TMPDIR")) as tmp:
        for method in ([a.only] if a.only else ["spark", "ntk_dfl"]):
            res[method] = measure(method, a.nodes, a.rounds, a.overrides, Path(tmp))
    print("load average after:", loadavg())
    for method, r in res.items():
        rounds = ", ".join(f"r{k} {v:.1f} s" for k, v in sorted(r["round_s"].items(), key=lambda kv: int(kv[0])))
        print(f"{method} at {a.nodes} nodes: base {gib(r['base_kib'])}, peak RSS of the process tree "
              f"{gib(r['peak_tree_kib'])} (own ru_maxrss {gib(r['peak_self_kib'])}); {rounds}; groups {r['groups']}")
        print("   steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["steps_s"].items()))
    s = res.get("spark")
    if s:
        b = s["budgets_mb"]
        line = s["base_kib"] * 1024 + (b["xp_cache_mb"] + b["max_inflight_mb"]) * 1e6
        print(f"spark: peak {gib(s['peak_tree_kib'])} against base + xp_cache_mb + max_inflight_mb = "
              f"{gib(line / 1024)}: {'within' if s['peak_tree_kib'] * 1024 <= line else 'OVER'}")
    if s and "ntk_dfl" in res:
        r1 = s["round_s"]["1"]
        n1 = res["ntk_dfl"]["round_s"]["1"]
        print(f"spark round 1 / ntk_dfl round 1 = {r1:.1f} / {n1:.1f} = {r1 / n1:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"nodes": a.nodes, "results": res, "load": loadavg()}, indent=1))


if __name__ == "__main__":
    main()
