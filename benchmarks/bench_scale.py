"""Scale benchmark (issue 43): start-up, seconds per round, peak memory and checkpoint cost
as the population grows while the round's work stays the same.

Workloads (each size is its own subprocess, so its peak RSS is its own):

- **fedavg**: FedAvg, Fashion-MNIST **with replacement** (``partition = "iid_replace"``,
  20 samples per client, split 75/0/25: 15 train + 5 local test), ``cnn_fmnist``, 100
  clients a round, 1 local epoch of batch 16, lr 0.05; evaluation ``global`` + ``personal``
  every round, ``personal`` on ``eval.nodes = 1000`` (all clients at 1,000).
- **dfedavg**: DFedAvg, the NTK-FL recipe (alpha 0.1, ~200 samples per node), MLP
  784-100-10, 5-regular time-varying graph, **1 local epoch** (the paper's 20 would make a
  10,000-node round about 11 minutes on one core), evaluation ``consensus`` every round and
  ``node_global`` on ``eval.nodes = 100``; then a second run killed after round 2 (its
  checkpoint) and resumed to the last round: its metrics.jsonl and ledger.csv must equal
  the straight run's byte for byte.

Per run: start-up (``Simulation(...)`` plus the initial states, i.e. what precedes round 1;
the interpreter and torch import are printed apart), seconds per round (median
``round_s`` of rounds 2.., training and messaging) and ``eval_s``, peak RSS
(``ru_maxrss``), checkpoint seconds per round (time inside the checkpoint observer, median
over rounds) and bytes (checkpoint.pt + ledger.bin after the last round). The per-client /
per-node slope is fitted by least squares over the sizes. The load average is printed at
the start and end of every run.

    LOWBAND_DATA=... python benchmarks/bench_scale.py                       # the sizes below
    LOWBAND_DATA=... python benchmarks/bench_scale.py --quick               # tiny sizes, < 1 min
    LOWBAND_DATA=... python benchmarks/bench_scale.py --fedavg 1000,10000,100000 --dfedavg 1000,10000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FEDAVG = """
name = "scale-fedavg"
seed = 0
rounds = {rounds}
threads = 1
checkpoint_every = 1
[data]
dataset = "fashion_mnist"
num_clients = {n}
partition = "iid_replace"
samples_per_client = 20
split = [0.75, 0.0, 0.25]
[model]
name = "cnn_fmnist"
[algorithm]
name = "fedavg"
lr = 0.05
batch_size = 16
local_epochs = 1
[topology]
kind = "star"
sampling = "count"
count = {per_round}
[engine]
workers = 1
[eval]
protocols = ["personal", "global"]
main = "global/acc"
{nodes}
"""

DFEDAVG = """
name = "scale-dfedavg"
seed = 0
rounds = {rounds}
threads = 1
checkpoint_every = {checkpoint_every}
[data]
dataset = "fashion_mnist"
num_clients = {n}
partition = "ntk_fl"
alpha = 0.1
samples_per_client = 200
[model]
name = "mlp"
[algorithm]
name = "dfedavg"
local_epochs = 1
[topology]
kind = "kregular"
k = 5
[engine]
workers = 1
[eval]
protocols = ["consensus", "node_global"]
main = "consensus/acc"
nodes = {eval_nodes}
"""


def load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def child(cfg_path: str, out_dir: str, rounds: int, stop_after: int) -> None:
    """One run in this process: prints one JSON line of its numbers."""
    t0 = time.perf_counter()
    from lowband.config import load_experiment
    from lowband.engine.observers.checkpoint import Checkpoint
    from lowband.engine.simulator import Simulation

    t_import = time.perf_counter() - t0
    ckpt_s: list[float] = []
    written: list[tuple[int, float, float]] = []  # (round, start, end) of each checkpoint written
    orig = Checkpoint.on_round_end

    def timed(self, run, rnd):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        n = len(self.rounds)
        orig(self, run, rnd)
        ckpt_s.append(time.perf_counter() - t)
        if len(self.rounds) > n:
            written.append((rnd.number, t, t + ckpt_s[-1]))
        if stop_after and rnd.number == stop_after:
            raise KeyboardInterrupt  # killed after round stop_after's checkpoint

    Checkpoint.on_round_end = timed  # type: ignore[method-assign]
    resume = stop_after < 0
    exp = load_experiment(cfg_path, [f"out_dir={out_dir}", f"rounds={rounds}", "eval.at_round0=false"])
    t1 = time.perf_counter()
    sim = Simulation(exp, resume=resume)
    t_build = time.perf_counter() - t1
    t2 = time.perf_counter()
    try:
        sim.run()
    except KeyboardInterrupt:
        pass
    t_run = time.perf_counter() - t2
    run_dir = exp.run_dir()
    timing = [json.loads(x) for x in (run_dir / "timing.jsonl").read_text().splitlines() if x.strip()]
    first = min(t["elapsed_s"] - t["round_s"] - t.get("eval_s", 0.0) for t in timing[:1]) if timing else None
    rounds_s = [t["round_s"] for t in timing[1:]] or [t["round_s"] for t in timing]
    ck_bytes = sum(p.stat().st_size for p in (run_dir / "checkpoint.pt", run_dir / "ledger.bin") if p.exists())
    print(json.dumps({
        "import_s": t_import, "build_s": t_build, "startup_s": t_build + (first or 0.0), "to_round1_s": first,
        "round_s": statistics.median(rounds_s), "rounds_s": [t["round_s"] for t in timing],
        "rounds_run": len(timing),
        "eval_s": statistics.median([t.get("eval_s", 0.0) for t in timing]), "run_s": t_run,
        "ckpt_s": statistics.median(ckpt_s) if ckpt_s else None, "ckpt_bytes": ck_bytes,
        "ckpt_run_s": statistics.fmean(ckpt_s[:-1]) if len(ckpt_s) > 1 else None,
        # every checkpoint written: its round and seconds; and each one's cost over the run's
        # time from its end to the next one's start (the share a schedule gives it)
        "ckpt_written": [(r, b - a) for r, a, b in written],
        "ckpt_share": [(b - a) / (written[k + 1][1] - b) for k, (_, a, b) in enumerate(written[:-1])],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }))


def run_child(cfg: str, out_dir: Path, rounds: int, stop_after: int = 0, timeout: int = 1800) -> dict:
    cmd = [sys.executable, __file__, "--child", cfg, str(out_dir), str(rounds), str(stop_after)]
    before = load()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ})
    if p.returncode != 0:
        raise SystemExit(f"run failed ({cfg}):\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["load"] = f"{before} -> {load()}"
    return res


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (per client / node)."""
    if len(xs) < 2:
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def table(name: str, rows: list[tuple[int, dict]], what: str) -> list[str]:
    out = [f"\n{name}", "",
           "(checkpoint s/round: the mean time in checkpoints over the rounds before the last, whose checkpoint is "
           "always written; / round: of round + eval)", "",
           f"| {what} | start-up s | round s | eval s | peak RSS GiB | checkpoint s/round | checkpoint / round | checkpoint MB | load before -> after |",
           "|---|---|---|---|---|---|---|---|---|"]
    for n, r in rows:
        frac = (r["ckpt_s"] / r["round_s"]) if r.get("ckpt_s") is not None and r["round_s"] else float("nan")
        if r.get("ckpt_run_s") is not None:  # every round's checkpoint time but the last's (always written)
            r = {**r, "ckpt_s": r["ckpt_run_s"]}
            frac = r["ckpt_s"] / (r["round_s"] + r["eval_s"])
        out.append(f"| {n:,} | {r['startup_s']:.2f} | {r['round_s']:.3f} | {r['eval_s']:.3f} | {r['peak_rss_gib']:.2f} "
                   f"| {r['ckpt_s'] or 0:.3f} | {frac:.1%} | {r['ckpt_bytes'] / 1e6:.1f} | {r['load']} |")
    xs = [n for n, _ in rows]
    fits = {k: slope(xs, [r[k] or 0.0 for _, r in rows]) for k in ("startup_s", "round_s", "peak_rss_gib", "ckpt_bytes")}
    for n, r in rows:
        if r.get("ckpt_written") and (len(r["ckpt_written"]) < r.get("rounds_run", 10**9)):
            out.append(f"{n:,} {what}s: checkpoints after rounds "
                       + ", ".join(f"{k} ({c:.2f} s)" for k, c in r["ckpt_written"])
                       + ("; each one's cost over the time to the next: "
                          + ", ".join(f"{x:.1%}" for x in r["ckpt_share"]) if r.get("ckpt_share") else ""))
    out.append("")
    out.append(f"fitted slope per {what}: start-up {fits['startup_s'] * 1e6:.1f} us, round {fits['round_s'] * 1e6:.2f} us, "
               f"peak RSS {fits['peak_rss_gib'] * 2**30 / 1e3:.1f} kB, checkpoint {fits['ckpt_bytes'] / 1e3:.2f} kB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--fedavg", default="1000,10000,100000", help="client counts ('' to skip)")
    ap.add_argument("--dfedavg", default="1000,10000", help="node counts ('' to skip)")
    ap.add_argument("--per-round", type=int, default=100, help="FedAvg clients per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dfedavg-checkpoint", default="1",
                    help='DFedAvg\'s checkpoint_every: a round count or "auto" (docs/configuration.md)')
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--no-resume", action="store_true", help="skip DFedAvg's kill-and-resume check")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--keep", help="keep the run folders under this folder")
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]))
        return
    if a.quick:
        a.fedavg, a.dfedavg, a.per_round = "100,300", "20,40", 10
    import platform

    import torch

    print(f"# bench_scale: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"one thread per run; load average at start {load()}", flush=True)
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="lowband-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    results: dict = {"fedavg": {}, "dfedavg": {}, "resume": {}}
    lines: list[str] = []
    fed_rows = []
    for n in [int(x) for x in a.fedavg.split(",") if x]:
        cfg = base / f"fedavg-{n}.toml"
        nodes = f"nodes = {min(n, 1000)}" if n > 1000 else ""
        cfg.write_text(FEDAVG.format(rounds=a.rounds, n=n, per_round=min(a.per_round, n), nodes=nodes))
        print(f"fedavg {n:,} clients ...", file=sys.stderr, flush=True)
        r = run_child(str(cfg), base / f"fedavg-{n}", a.rounds)
        results["fedavg"][n] = r
        fed_rows.append((n, r))
        print(json.dumps({"fedavg": n, **r}), file=sys.stderr, flush=True)
    if fed_rows:
        lines += table(f"FedAvg, Fashion-MNIST with replacement (iid_replace, 20 per client), cnn_fmnist, "
                       f"{a.per_round} clients a round, 1 epoch, B16; eval global + personal (eval.nodes 1000)",
                       fed_rows, "client")
        r0 = fed_rows[0][1]
        lines.append("")
        for n, r in fed_rows[1:]:
            lines.append(f"round at {n:,} / round at {fed_rows[0][0]:,}: {r['round_s'] / r0['round_s']:.2f}x "
                         f"(train + messages); with evaluation {(r['round_s'] + r['eval_s']) / (r0['round_s'] + r0['eval_s']):.2f}x")
    dfed_rows = []
    for n in [int(x) for x in a.dfedavg.split(",") if x]:
        cfg = base / f"dfedavg-{n}.toml"
        every = a.dfedavg_checkpoint if a.dfedavg_checkpoint.isdigit() else f'"{a.dfedavg_checkpoint}"'
        cfg.write_text(DFEDAVG.format(rounds=a.rounds, n=n, eval_nodes=min(n, 100), checkpoint_every=every))
        print(f"dfedavg {n:,} nodes ...", file=sys.stderr, flush=True)
        r = run_child(str(cfg), base / f"dfedavg-{n}", a.rounds)
        results["dfedavg"][n] = r
        dfed_rows.append((n, r))
        print(json.dumps({"dfedavg": n, **r}), file=sys.stderr, flush=True)
        if not a.no_resume:
            out = base / f"dfedavg-{n}-resumed"
            killed = run_child(str(cfg), out, a.rounds, stop_after=a.rounds - 1)
            rr = run_child(str(cfg), out, a.rounds, stop_after=-1)
            same = {f: (base / f"dfedavg-{n}" / f).read_bytes() == (out / f).read_bytes()
                    for f in ("metrics.jsonl", "ledger.csv")}
            written = killed.get("ckpt_written") or [[0, 0.0]]
            results["resume"][n] = {"identical": same, "resumed_run": rr, "from_round": written[-1][0]}
            print(json.dumps({"resume": n, **same}), file=sys.stderr, flush=True)
    if dfed_rows:
        lines += table("DFedAvg, NTK-FL alpha 0.1 (~200 samples per node), MLP, 5-regular, 1 local epoch; "
                       "eval consensus + node_global (eval.nodes 100)", dfed_rows, "node")
        for n, v in results["resume"].items():
            lines.append(f"resume at {n:,} nodes (killed after round {a.rounds - 1}, resumed from its last checkpoint, "
                         f"round {v['from_round']}; peak RSS {v['resumed_run']['peak_rss_gib']:.2f} GiB): "
                         + ", ".join(f"{f} {'byte-identical' if ok else 'DIFFERENT'}" for f, ok in v["identical"].items()))
    lines.append(f"\nload average at the end {load()}")
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
