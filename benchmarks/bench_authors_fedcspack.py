"""lowband's FedAvg against the FedCSPACK authors' FedAvg, one core each, interleaved.

    LOWBAND_DATA=/work/shared/data python benchmarks/bench_authors_fedcspack.py \\
        --authors-git /path/to/FedCSPACK.git [--commit HEAD] [--reps 3] [--rounds 3] [--core 0]

The authors' code is https://github.com/NigeloYang/FedCSPACK (PFLlib-based). It is never
imported into lowband nor copied into this repository: the script exports the given
commit (``git archive``) into ``--workdir`` and runs it there, unmodified. What it needs
and this environment lacks is supplied *beside* it, in ``<workdir>/shim`` (put first on
its ``PYTHONPATH``):

- ``tqdm``: the round loop's progress bar (a pass-through iterator);
- ``torchinfo.summary``: imported by the model file, called only in its ``__main__``;
- ``torchvision.datasets.FashionMNIST`` / ``torchvision.transforms``: the global test set
  (used by its server's constructor and its final generalisation test, outside the timed
  rounds), read from ``$LOWBAND_DATA/fashion-mnist`` (ToTensor, Normalize(0.5, 0.5));
- the clients' data: the authors' code reads ``dataset/formatdata/fashionmnist/100/
  noniid/dir/unbalance/{train,test}_0.3/<client>.npz`` (written by their generator);
  the script writes these files from **lowband's own federation** of the workload below,
  so both train on the same clients' samples;
- the participants: the authors' ``fix`` mode takes clients 0-9 every round; the driver
  replaces the server's ``select_clients_id`` (on the instance) with lowband's round
  plans, so both train the same 10 clients each round.

The workload is the suite's ``fedavg`` (benchmarks/suite.py): FMNIST, 100 clients,
Dirichlet 0.3, 75/25 local splits, the FMNIST CNN, 10 clients a round, **batch 16, 3 local
epochs**, lr 0.05. Each side runs in its own subprocess, pinned with ``taskset -c CORE``,
``OMP_NUM_THREADS=1`` and one torch thread; the authors' code as it comes (its round: send,
evaluate the sent model on the participants' train and test splits, train, aggregate);
lowband with ``engine.workers = 1`` (the default vectorisation, so the FMNIST cohort step),
twice: ``lowband`` with ``personal`` + ``global`` every round, and ``lowband-matched`` with
``personal`` alone on ``eval.nodes`` clients, the count whose fixed seeded sample of test
splits adds up closest to the authors' evaluated samples a round (lowband has no protocol
that scores the training splits; the sample is fixed, theirs the round's participants).
The three alternate (reversed in even repetitions), and the load average is printed
before every run. Rounds 2..R are timed (round 1 pays warm-ups).

Reported per side, medians over the repetitions:

- **s per SGD step** = (round wall time - its evaluation) / the round's SGD steps, each
  side's own steps (the authors' loaders drop a last partial batch: ``E x floor(n / B)``
  per client; lowband keeps it: ``E x ceil(n / B)``);
- **s per evaluated round** = the round's wall time including its evaluation (the work
  differs: the samples each side evaluates per round are printed);

and the ratios of each lowband run / authors (below 1x lowband is faster), per
repetition, of the medians and the median of the per-repetition ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "AUTHORS_BENCH "
CONFIG = ROOT / "experiments/baselines/fedavg_fmnist_dir03.toml"
#: the suite's fedavg workload (benchmarks/suite.py), with the round count added per run
OVERRIDES = ["algorithm.batch_size=16", "algorithm.local_epochs=3", 'eval.protocols=["personal", "global"]',
             "eval.every=1", "eval.at_round0=false", "checkpoint_every=0", "threads=1", "engine.workers=1"]
#: where the authors' loader looks for client files (num_clients / niid / partition / balance / split_alpha)
DATA_SUBDIR = "dataset/formatdata/fashionmnist/100/noniid/dir/unbalance"
#: the runs of a repetition: the authors' code, lowband as configured (``personal`` on every
#: client + ``global``), lowband with its evaluation cut to the authors' sample count
SIDES = ("authors", "lowband", "lowband-matched")

SHIM_TQDM = '''"""A stand-in for tqdm: iterates without drawing a bar."""
def tqdm(iterable=None, *args, **kwargs):
    return iterable
'''
SHIM_TORCHINFO = '''"""A stand-in for torchinfo: the model file imports ``summary`` for its own __main__ only."""
def summary(*args, **kwargs):
    return None
'''
SHIM_TV_INIT = '''"""The two torchvision pieces the FedCSPACK code uses, for an environment without torchvision."""
from . import datasets, transforms  # noqa: F401
'''
SHIM_TV_TRANSFORMS = '''"""ToTensor / Normalize / Compose on 8-bit grey images (numpy arrays)."""
import torch


class Compose:
    def __init__(self, steps):
        self.steps = list(steps)

    def __call__(self, x):
        for s in self.steps:
            x = s(x)
        return x


class ToTensor:
    def __call__(self, img):
        return torch.as_tensor(img, dtype=torch.float32).div(255.0).unsqueeze(0)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = float(mean[0]), float(std[0])

    def __call__(self, x):
        return (x - self.mean) / self.std
'''
SHIM_TV_DATASETS = '''"""FashionMNIST's official test set from $LOWBAND_DATA/fashion-mnist (IDX gzip files)."""
import gzip
import os

import numpy as np
import torch


def _idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


class FashionMNIST(torch.utils.data.Dataset):
    def __init__(self, root=None, train=False, download=False, transform=None):
        d = os.path.join(os.environ["LOWBAND_DATA"], "fashion-mnist")
        p = "train" if train else "t10k"
        self.x = _idx(os.path.join(d, p + "-images-idx3-ubyte.gz"), 16).reshape(-1, 28, 28)
        self.targets = torch.as_tensor(_idx(os.path.join(d, p + "-labels-idx1-ubyte.gz"), 8).astype(np.int64))
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        x = self.x[i]
        return (self.transform(x) if self.transform else x), int(self.targets[i])
'''


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ------------------------------------------------------------------------------------------
# preparation (parent, not timed)
# ------------------------------------------------------------------------------------------
def lowband_experiment(rounds: int, out_dir: str, extra: list[str] | None = None) -> Any:
    from lowband.config import load_experiment

    return load_experiment(CONFIG, [*OVERRIDES, *(extra or []), f"rounds={rounds}", f"out_dir={json.dumps(out_dir)}"])


def matched_nodes(n_test: list[int], target: float, seed: int) -> tuple[int, int]:
    """The ``eval.nodes`` whose seeded sample's test splits add up closest to ``target``
    samples (the authors' evaluated samples a round), and that sum."""
    from lowband.engine.evaluation import sample_nodes

    best = min(((k, sum(n_test[i] for i in sample_nodes(len(n_test), k, seed))) for k in range(1, len(n_test) + 1)),
               key=lambda ks: abs(ks[1] - target))
    return best


def prepare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Export the authors' commit, write the shims, the clients' files and the round plans."""
    import numpy as np

    from lowband.algorithms import ALGORITHMS
    from lowband.config import hyperparams
    from lowband.engine.simulator import make_federation, make_topology

    code = work / "code"
    if not (code / "main.py").exists():
        code.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", f"--git-dir={args.authors_git}", "archive", args.commit],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
    shim = work / "shim"
    (shim / "torchvision").mkdir(parents=True, exist_ok=True)
    (shim / "tqdm.py").write_text(SHIM_TQDM)
    (shim / "torchinfo.py").write_text(SHIM_TORCHINFO)
    (shim / "torchvision/__init__.py").write_text(SHIM_TV_INIT)
    (shim / "torchvision/transforms.py").write_text(SHIM_TV_TRANSFORMS)
    (shim / "torchvision/datasets.py").write_text(SHIM_TV_DATASETS)

    exp = lowband_experiment(args.rounds, str(work / "unused"))
    fed = make_federation(exp)
    alg = ALGORITHMS[exp.algorithm.name](hyperparams(exp))
    topo = make_topology(exp, alg.family, len(fed.nodes), alg.default_topology)  # as the engine builds it
    plans = [[int(c) for c in topo.plan(r).participants if int(c) >= 0] for r in range(args.rounds)]
    alpha = exp.data.alpha
    for split in ("train", "test"):
        d = work / DATA_SUBDIR / f"{split}_{alpha}"
        d.mkdir(parents=True, exist_ok=True)
        for i, nd in enumerate(fed.nodes):
            x = (nd.train_x if split == "train" else nd.test_x).numpy().astype(np.float32)
            y = (nd.train_y if split == "train" else nd.test_y).numpy().astype(np.int64)
            with open(d / f"{i}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": x, "y": y})
    ns = [int(nd.n_train) for nd in fed.nodes]
    nt = [int(nd.test_y.shape[0]) for nd in fed.nodes]
    # the authors' evaluation a round: the participants' train splits (drop_last, batch 16) + test splits
    au_eval = statistics.mean(sum(16 * (ns[c] // 16) + nt[c] for c in pl) for pl in plans)
    k, k_samples = matched_nodes(nt, au_eval, int(exp.seed))
    info = {"plans": plans, "n_train": ns, "n_test": nt, "num_clients": len(fed.nodes), "alpha": alpha,
            "global_test": int(fed.global_test_y.shape[0]), "authors_eval_samples": au_eval,
            "matched_nodes": k, "matched_samples": k_samples}
    (work / "plans.json").write_text(json.dumps(info))
    return info


# ------------------------------------------------------------------------------------------
# the two children (each pinned to one core by the parent)
# ------------------------------------------------------------------------------------------
def child_authors(work: Path, rounds: int) -> dict[str, Any]:
    """The authors' FedAvg, unmodified, driven as its main.py does; times per round."""
    import contextlib
    import random

    import numpy as np
    import torch

    torch.set_num_threads(1)
    info = json.loads((work / "plans.json").read_text())
    os.chdir(work)
    sys.path[:0] = [str(work / "shim"), str(work / "code")]
    from system.model.models import CNNMNIST_BIG  # the authors' modules, from the export
    from system.servers.serveravg import FedAvg
    from system.utils.result_utils import Metrics

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    a = argparse.Namespace(
        algorithm="FedAvg", model="cnn", model_type="big", dataset="fashionmnist", num_classes=10, niid="noniid",
        partition="dir", balance="unbalance", dir_alpha=info["alpha"], global_epoch=rounds, global_bs=32, verbose=1,
        eval_every=1, num_clients=info["num_clients"], ran_client_model="fix", ran_rate=0.1, local_epoch=3,
        local_bs=16, local_learn_rate=0.05, learning_rate_decay=False, learning_rate_decay_gamma=0.99,
        client_drop_rate=0.0, train_slow=0.0, send_slow=0.0, time_select=False, time_threthold=10000,
        spars_name="sim", pack_size=1024, spars_type="cskd", device="cpu", few_shot=0)
    a.model_name = a.model
    metrics = Metrics(a)
    a.model = CNNMNIST_BIG()
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        server = FedAvg(a, metrics)
        plans = iter(info["plans"])
        server.select_clients_id = lambda: next(plans)  # lowband's participants (see the docstring)
        eval_s: list[float] = []
        inner = server.evaluate

        def timed_evaluate(epoch: int) -> None:
            t = time.perf_counter()
            inner(epoch)
            eval_s.append(time.perf_counter() - t)

        server.evaluate = timed_evaluate
        server.train()
    per: list[dict[str, Any]] = []
    for r in range(rounds):
        chosen = info["plans"][r]
        steps = sum(3 * (info["n_train"][c] // 16) for c in chosen)
        evald = sum(16 * (info["n_train"][c] // 16) + info["n_test"][c] for c in chosen)  # train loader drops
        per.append({"round": r + 1, "round_s": metrics.global_epoch_time[r], "eval_s": eval_s[r], "steps": steps,
                    "eval_samples": evald})
    return {"rounds": per, "threads": torch.get_num_threads()}


def child_lowband(work: Path, rounds: int, matched: bool = False) -> dict[str, Any]:
    """lowband's FedAvg through its engine; times from timing.jsonl. ``matched``: the
    evaluation cut to the authors' sample count (``personal`` only, on ``eval.nodes`` =
    the prepared count of seeded clients' test splits; no ``global``)."""
    import torch

    from lowband.engine.evaluation import sample_nodes
    from lowband.engine.simulator import Simulation

    info = json.loads((work / "plans.json").read_text())
    extra = ['eval.protocols=["personal"]', f"eval.nodes={info['matched_nodes']}"] if matched else []
    with tempfile.TemporaryDirectory(prefix="authors_bench_") as tmp:
        exp = lowband_experiment(rounds, str(Path(tmp) / "run"), extra)
        scored = sample_nodes(info["num_clients"], exp.eval.nodes, int(exp.seed))
        n_eval = sum(info["n_test"][c] for c in scored) + (0 if matched else info["global_test"])
        res = Simulation(exp).run()
        timing = [json.loads(x) for x in (Path(res.run_dir) / "timing.jsonl").read_text().splitlines() if x.strip()]
    per = []
    for t in timing:
        r = int(t["round"])
        chosen = info["plans"][r - 1]
        steps = sum(3 * -(-info["n_train"][c] // 16) for c in chosen)
        per.append({"round": r, "round_s": float(t["round_s"]) + float(t["eval_s"]), "eval_s": float(t["eval_s"]),
                    "steps": steps, "eval_samples": n_eval})
    return {"rounds": per, "threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------------
# parent: interleaved, pinned runs
# ------------------------------------------------------------------------------------------
def run_child(side: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p)
    cmd = ["taskset", "-c", str(args.core), sys.executable, str(Path(__file__).resolve()), "--child", side,
           "--workdir", str(work), "--rounds", str(args.rounds)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"{side} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def summarise(res: dict[str, Any]) -> dict[str, float]:
    meas = [r for r in res["rounds"] if r["round"] >= 2] or res["rounds"]
    return {"s_per_step": statistics.mean((r["round_s"] - r["eval_s"]) / r["steps"] for r in meas),
            "s_per_round": statistics.mean(r["round_s"] for r in meas),
            "eval_s": statistics.mean(r["eval_s"] for r in meas),
            "steps": statistics.mean(r["steps"] for r in meas),
            "eval_samples": statistics.mean(r["eval_samples"] for r in meas)}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--authors-git", help="git directory of a FedCSPACK clone (e.g. .../FedCSPACK/.git)")
    p.add_argument("--commit", default="HEAD")
    p.add_argument("--workdir", default=None, help="where the export, shims and client files go (outside lowband)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json", default=None)
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        work = Path(args.workdir)
        res = (child_authors(work, args.rounds) if args.child == "authors"
               else child_lowband(work, args.rounds, matched=args.child == "lowband-matched"))
        print(MARK + json.dumps(res), flush=True)
        return
    if not args.authors_git:
        p.error("--authors-git is required: the git directory of a FedCSPACK clone")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fedcspack_authors_"))
    import platform

    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs; torch "
          f"{torch.__version__}; pinned to core {args.core}, 1 thread; workdir {work}")
    info = prepare(args, work)
    print(f"workload: FedAvg FMNIST, {info['num_clients']} clients, Dirichlet {info['alpha']}, 10 a round, "
          f"batch 16, 3 local epochs; {args.rounds} rounds, rounds 2-{args.rounds} timed; {args.reps} repetitions")
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    raw: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]
        for side in order:
            before = loadavg()
            t = time.perf_counter()
            res = run_child(side, args, work)
            s = summarise(res)
            runs[side].append(s)
            raw.append({"rep": rep + 1, "side": side, "load_before": before, "load_after": loadavg(), **res})
            print(f"rep {rep + 1} {side:15s}: {s['s_per_step'] * 1e3:.3f} ms/step ({s['steps']:.0f} steps), "
                  f"{s['s_per_round']:.3f} s/evaluated round (eval {s['eval_s']:.3f} s, {s['eval_samples']:.0f} "
                  f"samples); load {before} -> {loadavg()}; {time.perf_counter() - t:.0f} s", flush=True)
    med = {side: {k: statistics.median(r[k] for r in v) for k in v[0]} for side, v in runs.items()}
    print("\n| side | ms per SGD step | SGD steps / round | s per evaluated round | of which evaluation s "
          "| samples evaluated / round | ratio per SGD step | ratio per evaluated round |")
    print("|---|---|---|---|---|---|---|---|")
    au = med["authors"]
    for side in SIDES:
        m = med[side]
        print(f"| {side} | {m['s_per_step'] * 1e3:.3f} | {m['steps']:.0f} | {m['s_per_round']:.3f} | "
              f"{m['eval_s']:.3f} | {m['eval_samples']:.0f} | {m['s_per_step'] / au['s_per_step']:.2f}x | "
              f"{m['s_per_round'] / au['s_per_round']:.2f}x |")
    print(f"\nevaluated per round: authors the 10 participants' train splits (whole batches of 16) + test splits "
          f"with the global model before training (mean {info['authors_eval_samples']:.0f}); lowband `personal` on "
          f"every client's test split + `global` ({sum(info['n_test']) + info['global_test']}); lowband-matched "
          f"`personal` only, eval.nodes = {info['matched_nodes']} (a fixed seeded sample of clients' test splits, "
          f"{info['matched_samples']} samples)")
    per_rep = {side: [(lb["s_per_step"] / a["s_per_step"], lb["s_per_round"] / a["s_per_round"])
                      for lb, a in zip(runs[side], runs["authors"])] for side in SIDES[1:]}
    for side, rr in per_rep.items():
        print(f"ratios {side} / authors per repetition (per SGD step, per evaluated round): "
              + ", ".join(f"{a:.2f}x / {b:.2f}x" for a, b in rr)
              + f"; median {statistics.median(a for a, _ in rr):.2f}x / {statistics.median(b for _, b in rr):.2f}x")
    print(f"load average now {loadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": raw, "medians": med, "per_rep": per_rep}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
