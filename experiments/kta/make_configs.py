"""Write the KTA v2 / FedMD reproduction configs (one TOML per run) and reproduce.toml.

    python experiments/kta/make_configs.py

Setting (specs/kta_fedmd.md, papers/kta_v2_summary.txt): CIFAR-10, SimpleCNN, Dirichlet
alpha = 0.5 over 10 clients, all clients every round, 10 rounds, a public reference set of
2000 training images that no client owns, local splits 80/20 (train/test). Every method
sees the *same* partition (same seed, same public_size: FedAvg/FedProx/local-only simply
ignore the public set). KTA's hyperparameters are the algorithm's defaults
(docs/algorithms/kta.md); local-only and FedAvg/FedProx use the same local optimiser
(SGD lr 0.01, momentum 0.9, weight decay 1e-5, batch 64) and 3 local epochs per round,
which matches KTA's private-data passes per round (E = 2 stage-1 epochs plus the private
half of stage 2: E_d x N_ref = 4000 private samples, about one more epoch).

Evaluation: ``node_global`` (each client's model on the global CIFAR-10 test set, mean
over clients; the main number) and ``personal`` (each client's model on its own local
test split); FedAvg/FedProx: ``global`` (the global model on the test set) and ``personal``.
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

HERE = Path(__file__).resolve().parent
REL = "experiments/kta"

LOCAL_OPT = {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5, "batch_size": 64}


def cifar_data(public_size: int = 2000, **extra: object) -> dict:
    return {"dataset": "cifar10", "num_clients": 10, "partition": "dirichlet", "alpha": 0.5, "min_size": 10,
            "split": [0.8, 0.0, 0.2], "public_size": public_size, **extra}


def make(name: str, algorithm: dict, *, seed: int = 0, rounds: int = 10, data: dict | None = None,
         model: dict | None = None, protocols: list[str] | None = None, main: str = "node_global/acc",
         comm: dict | None = None, note: str = "") -> tuple[str, dict, str]:
    cfg = {
        "name": f"kta-{name}",
        "seed": seed,
        "rounds": rounds,
        "threads": 1,
        "data": data or cifar_data(),
        "model": model or {"name": "simplecnn"},
        "algorithm": algorithm,
        "topology": {"kind": "star", "sampling": "all"},
        "eval": {"protocols": protocols or ["personal", "node_global"], "main": main},
    }
    if comm:
        cfg["comm"] = comm
    return name, cfg, note


def kta(**hp: object) -> dict:
    return {"name": "kta", **hp}


FEDAVG_EVAL = {"protocols": ["global", "personal"], "main": "global/acc"}

CONFIGS: list[tuple[str, dict, str]] = []


def add(*args, **kw) -> None:
    CONFIGS.append(make(*args, **kw))


# --- headline: CIFAR-10 SimpleCNN, alpha 0.5, 10 clients, 10 rounds ----------------------------
for s in (0, 1, 2):
    add(f"cifar10_simplecnn_kta_s{s}", kta(), seed=s, note="KTA v2, defaults")
    add(f"cifar10_simplecnn_local_s{s}", {"name": "local", "local_epochs": 3, **LOCAL_OPT}, seed=s,
        note="local-only, same optimiser, 3 epochs per round (KTA's private-data passes)")
    add(f"cifar10_simplecnn_kta_uniform_s{s}", kta(weighting="uniform"), seed=s,
        note="ablation (next check 1): uniform teacher weights w_ij = 1/|N(i)|")
add("cifar10_simplecnn_fedavg_s0", {"name": "fedavg", "local_epochs": 3, **LOCAL_OPT},
    protocols=FEDAVG_EVAL["protocols"], main=FEDAVG_EVAL["main"], note="FedAvg, same partition and optimiser")
add("cifar10_simplecnn_fedprox_s0", {"name": "fedprox", "mu": 0.01, "local_epochs": 3, **LOCAL_OPT},
    protocols=FEDAVG_EVAL["protocols"], main=FEDAVG_EVAL["main"], note="FedProx mu 0.01")
add("cifar10_simplecnn_kta_fp16_s0", kta(), comm={"by_kind": {"logits": "fp16", "soft_labels": "fp16"}},
    note="KTA v2 with fp16 logits and soft labels on the links")

# --- FedMD and the global-teacher ablation ---------------------------------------------------------
add("cifar10_simplecnn_fedmd_s0", {"name": "fedmd"}, note="FedMD faithful (FedMD_clean defaults)")
add("cifar10_simplecnn_kta_global_s0", kta(k=0, include_self=True, weighting="uniform"),
    note="KTA loop with the global teacher: uniform weights over all clients, self included")

# --- market ablations (seed 0) ------------------------------------------------------------------------
add("cifar10_simplecnn_kta_simonly_s0", kta(score="similarity"), note="similarity only (a = 1)")
add("cifar10_simplecnn_kta_acconly_s0", kta(score="accuracy"), note="accuracy only (S = 1)")
add("cifar10_simplecnn_kta_kall_s0", kta(k=0), note="k = all other clients")
# --- reference set (next check 2) --------------------------------------------------------------------
add("cifar10_simplecnn_kta_ref_holdout_s0", kta(), data=cifar_data(public_source="holdout"),
    note="D_ref: class-balanced held-out validation split of the training set")
add("cifar10_simplecnn_kta_ref_mismatched_s0", kta(), data=cifar_data(public_source="mismatched"),
    note="D_ref: a seeded half of the classes only (class-mismatched)")
add("cifar10_simplecnn_kta_ref500_s0", kta(), data=cifar_data(public_size=500), note="N_ref = 500")
# --- temperature and lambda (next check 3) ----------------------------------------------------------
for t in (0.1, 1.0, 10.0):
    add(f"cifar10_simplecnn_kta_T{t:g}_s0", kta(temperature=t), note=f"T = {t:g}")
for lam in (0.1, 0.9):
    add(f"cifar10_simplecnn_kta_lam{lam:g}_s0", kta(lam=lam), note=f"lambda = {lam:g}")

# --- mixed federation: SimpleCNN and the FedCSPACK CIFAR CNN, round robin ---------------------------
add("cifar10_mixed_kta_s0", kta(), model={"name": "simplecnn", "mix": ["simplecnn", "cnn_cifar"]},
    note="mixed federation: clients 0,2,4,.. SimpleCNN, 1,3,5,.. cnn_cifar (541k params)")
add("cifar10_mixed_local_s0", {"name": "local", "local_epochs": 3, **LOCAL_OPT},
    model={"name": "simplecnn", "mix": ["simplecnn", "cnn_cifar"]}, note="local-only on the mixed federation")

# --- AG News (test.csv only: 6000 train / 1600 test, stratified) -------------------------------------
AG = {"dataset": "ag_news", "options": {"train_size": 6000}, "num_clients": 10, "partition": "dirichlet",
      "alpha": 0.5, "min_size": 10, "split": [0.8, 0.0, 0.2], "public_size": 2000}
TEXT = {"name": "text_bag"}
TEXT_OPT = {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.0, "batch_size": 32}  # tuned centrally: 75% on 4000 texts
add("agnews_textbag_kta_s0", kta(**TEXT_OPT), data=AG, model=TEXT, note="KTA v2 on AG News, bag of embeddings")
add("agnews_textbag_local_s0", {"name": "local", "local_epochs": 3, **TEXT_OPT}, data=AG, model=TEXT,
    note="local-only")
add("agnews_textbag_fedavg_s0", {"name": "fedavg", "local_epochs": 3, **TEXT_OPT}, data=AG, model=TEXT,
    protocols=FEDAVG_EVAL["protocols"], main=FEDAVG_EVAL["main"], note="FedAvg")

# --- ResNet-18 on CIFAR-10, reduced for CPU (the full run: rounds=10, the Dirichlet split above) -----
R18_DATA = {"dataset": "cifar10", "num_clients": 10, "partition": "ntk_fl", "alpha": 0.5, "samples_per_client": 100,
            "split": [0.8, 0.0, 0.2], "public_size": 200}
R18_OPT = {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5, "batch_size": 32}
add("cifar10_resnet18_kta_reduced_s0", kta(local_epochs=1, distill_epochs=1, **R18_OPT), rounds=2, data=R18_DATA,
    model={"name": "resnet18"}, protocols=["personal"], main="personal/acc_weighted",
    note="REDUCED for CPU: 100 samples per client, N_ref = 200, 2 rounds, E = E_d = 1 (ResNet-18 trains at ~10 img/s here)")
add("cifar10_resnet18_fedavg_reduced_s0", {"name": "fedavg", "local_epochs": 1, **R18_OPT}, rounds=1, data=R18_DATA,
    model={"name": "resnet18"}, protocols=["personal"], main="personal/acc_weighted",
    note="REDUCED for CPU: FedAvg's ledger for ResNet-18 (bytes per round do not depend on the data)")
add("cifar10_resnet18_kta_full_s0", kta(), data=cifar_data(), model={"name": "resnet18"},
    note="the full ResNet-18 run (GPU): the headline federation with ResNet-18")


#: the headline cells (KTA v2 vs local-only) run these seeds (issue 15 part 7): seed s of a
#: config runs in runs/<name>/seed-<s>/ (the *_s1/_s2 configs are the same runs under other names)
HEADLINE = {"simplecnn/kta", "simplecnn/local"}
HEADLINE_SEEDS = [0, 1, 2]

#: reproduce.toml cells: (id, table, row, config, metric, paper, paper_unit)
CELLS = [
    ("simplecnn/kta", "cifar10_simplecnn", "KTA v2", "cifar10_simplecnn_kta_s0", "node_global/acc", 49, "%"),
    ("simplecnn/kta_bytes", "cifar10_simplecnn", "KTA v2 total traffic", "cifar10_simplecnn_kta_s0", "bytes/total",
     "< 10", "MB"),
    ("simplecnn/kta_up", "cifar10_simplecnn", "KTA v2 upload only", "cifar10_simplecnn_kta_s0", "bytes/up", None, "MB"),
    ("simplecnn/local", "cifar10_simplecnn", "local-only", "cifar10_simplecnn_local_s0", "node_global/acc", None, "%"),
    ("simplecnn/fedavg", "cifar10_simplecnn", "FedAvg", "cifar10_simplecnn_fedavg_s0", "global/acc", None, "%"),
    ("simplecnn/fedavg_bytes", "cifar10_simplecnn", "FedAvg total traffic", "cifar10_simplecnn_fedavg_s0",
     "bytes/total", None, "MB"),
    ("simplecnn/fedprox", "cifar10_simplecnn", "FedProx", "cifar10_simplecnn_fedprox_s0", "global/acc", None, "%"),
    ("fedmd/fedmd", "fedmd", "FedMD (faithful)", "cifar10_simplecnn_fedmd_s0", "node_global/acc", 38, "%"),
    ("fedmd/global_teacher", "fedmd", "KTA loop, global teacher", "cifar10_simplecnn_kta_global_s0",
     "node_global/acc", None, "%"),
    ("ablation/uniform_s0", "ablations", "uniform weights", "cifar10_simplecnn_kta_uniform_s0", "node_global/acc",
     None, "%"),
    ("ablation/ref_holdout", "ablations", "D_ref held-out", "cifar10_simplecnn_kta_ref_holdout_s0",
     "node_global/acc", None, "%"),
    ("ablation/ref_mismatched", "ablations", "D_ref mismatched", "cifar10_simplecnn_kta_ref_mismatched_s0",
     "node_global/acc", None, "%"),
    ("ablation/T0.1", "ablations", "T = 0.1", "cifar10_simplecnn_kta_T0.1_s0", "node_global/acc", None, "%"),
    ("ablation/T1", "ablations", "T = 1", "cifar10_simplecnn_kta_T1_s0", "node_global/acc", None, "%"),
    ("ablation/T10", "ablations", "T = 10", "cifar10_simplecnn_kta_T10_s0", "node_global/acc", None, "%"),
    ("ablation/lam0.1", "ablations", "lambda = 0.1", "cifar10_simplecnn_kta_lam0.1_s0", "node_global/acc", None, "%"),
    ("ablation/lam0.9", "ablations", "lambda = 0.9", "cifar10_simplecnn_kta_lam0.9_s0", "node_global/acc", None, "%"),
    ("agnews/kta", "agnews", "KTA v2", "agnews_textbag_kta_s0", "node_global/acc", 89.3, "%"),
    ("agnews/local", "agnews", "local-only", "agnews_textbag_local_s0", "node_global/acc", None, "%"),
    ("agnews/fedavg", "agnews", "FedAvg", "agnews_textbag_fedavg_s0", "global/acc", None, "%"),
    ("resnet18/kta_reduced", "resnet18", "KTA v2 (reduced run)", "cifar10_resnet18_kta_reduced_s0",
     "personal/acc_weighted", 57.7, "%"),
]


def main() -> None:
    for name, cfg, note in CONFIGS:
        head = f"# KTA v2 reproduction: {name} (generated by make_configs.py; edit there)\n"
        if note:
            head += f"# {note}\n"
        (HERE / f"{name}.toml").write_text(head + tomli_w.dumps(cfg))
    lines = ["# lowband reproduce kta: one [[run]] per cell (generated by make_configs.py).",
             "# The byte ratios under both conventions and the seed statistics are written by",
             "# python experiments/kta/write_table.py (docs/results/kta_vs_summary.md).",
             'paper = "kta"', ""]
    for cid, table, row, cfg, metric, paper, unit in CELLS:
        cell = {"id": cid, "table": table, "row": row, "config": f"{REL}/{cfg}.toml", "metric": metric}
        if paper is not None:
            cell["paper"] = paper
        if unit:
            cell["paper_unit"] = unit
        if cid in HEADLINE:
            cell["seeds"] = HEADLINE_SEEDS
        lines.append("[[run]]")
        lines.append(tomli_w.dumps(cell))
    (HERE / "reproduce.toml").write_text("\n".join(lines))
    print(f"wrote {len(CONFIGS)} configs and reproduce.toml ({len(CELLS)} cells) to {REL}/")


if __name__ == "__main__":
    main()
