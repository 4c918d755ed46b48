"""Write the FedCSPACK reproduction configs (one TOML per table cell) and reproduce.toml.

    python experiments/fedcspack/make_configs.py

Every config shares the setting of the paper (specs/fedcspack.md): 100 clients, 10 sampled
uniformly per round, 75/25 local train/test splits, the official test split held out as the
global test set, 100 rounds, the authors' CNNs. Local settings are the same for every
method on a dataset (FMNIST: lr 0.05, batch 32, 5 epochs, as
experiments/baselines/fedavg_fmnist_dir03.toml; CIFAR-10: lr 0.05, batch 32, 3 epochs).
Method hyperparameters are each algorithm's defaults (the spec's non-degenerate values).
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

HERE = Path(__file__).resolve().parent

DATASETS = {
    "fmnist": {"dataset": "fashion_mnist", "model": "cnn_fmnist", "lr": 0.05, "batch_size": 32, "local_epochs": 5,
               "eval_every": 1},
    "cifar10": {"dataset": "cifar10", "model": "cnn_cifar", "lr": 0.05, "batch_size": 32, "local_epochs": 3,
                "eval_every": 5},
}

#: method id -> (algorithm name, extra hyperparameters)
METHODS = {
    "fedavg": ("fedavg", {}),
    "fedprox": ("fedprox", {}),
    "fednova": ("fednova", {}),
    "moon": ("moon", {}),
    "feddbe": ("feddbe", {}),
    "fedas": ("fedas", {}),
    "fedntd": ("fedntd", {}),
    "fedpac": ("fedpac", {}),
    "fedala": ("fedala", {}),
    "fedspu": ("fedspu", {}),
    "fedcspack": ("fedcspack", {"variant": "paper"}),
    "fedcspack_code": ("fedcspack", {"variant": "code"}),
}

#: paper table 1 (personal top-1 %, Dir 0.3 / 0.6 / 1.0)
TABLE1 = {
    "fmnist": {
        "fedavg": (84.39, 86.96, 87.65), "fedprox": (84.39, 86.96, 87.65), "fednova": (84.40, 87.50, 88.68),
        "moon": (85.44, 86.40, 87.90), "feddbe": (85.06, 86.28, 88.24), "fedas": (42.47, 57.27, 71.96),
        "fedntd": (84.35, 86.67, 88.01), "fedpac": (41.53, 65.73, 69.34), "fedala": (84.39, 86.96, 87.65),
        "fedspu": (85.29, 88.76, 88.25), "fedcspack": (88.13, 89.50, 90.73),
    },
    "cifar10": {
        "fedavg": (69.71, 74.71, 75.01), "fedprox": (69.58, 74.59, 74.54), "fednova": (70.93, 74.37, 75.53),
        "moon": (70.03, 74.63, 76.00), "feddbe": (69.66, 74.76, 74.80), "fedas": (43.97, 70.00, 69.46),
        "fedntd": (70.32, 74.68, 75.52), "fedpac": (57.23, 68.78, 58.60), "fedala": (69.49, 74.64, 74.96),
        "fedspu": (67.38, 74.52, 74.62), "fedcspack": (73.23, 77.15, 78.71),
    },
}
#: paper table A1 (pathological shards)
TABLEA1 = {
    "fmnist": {"fedala": 68.03, "fedas": 39.60, "fedavg": 68.03, "feddbe": 64.64, "moon": 67.60, "fedntd": 64.85,
               "fednova": 68.06, "fedpac": 46.97, "fedprox": 68.03, "fedspu": 68.18, "fedcspack": 70.28},
    "cifar10": {"fedala": 44.78, "fedas": 19.72, "fedavg": 44.78, "feddbe": 44.02, "moon": 43.77, "fedntd": 40.39,
                "fednova": 44.47, "fedpac": 21.97, "fedprox": 44.78, "fedspu": 43.21, "fedcspack": 47.65},
}
#: paper table 2 (GB over 100 rounds, Dir 0.3): FedAvg vs FedCSPACK
TABLE2 = {"fmnist": {"fedavg": 0.30, "fedcspack": 0.02, "fedspu": 0.07},
          "cifar10": {"fedavg": 2.59, "fedcspack": 0.20, "fedspu": 0.61}}
#: paper table 3 (CIFAR-10, Dir 0.5, accuracy at rounds 10/30/50/70/100)
TABLE3 = {"cosine": (0.33, 0.62, 0.65, 0.70, 0.74), "kl": (0.30, 0.57, 0.68, 0.67, 0.69),
          "double": (0.33, 0.63, 0.71, 0.74, 0.79)}
PACK_SIZES = (128, 256, 512, 1024, 2048)
CPR_COUNTS = (30, 60, 100)  # client participation ratio 0.3 / 0.6 / 1.0 (figure 4 / A3 / A4 knob)

#: the lead's FedAvg FMNIST Dir(0.3) run is the FedAvg row of that cell
REUSED = {("fmnist", "dir0.3", "fedavg"): "experiments/baselines/fedavg_fmnist_dir03.toml"}
#: the headline cells (table 1, FedAvg and FedCSPACK) run these seeds (issue 15 part 7)
HEADLINE_SEEDS = [0, 1, 2]


def config(ds: str, part: str, method: str, *, alpha: float | None = None, extra: dict | None = None,
           count: int = 10, suffix: str = "") -> tuple[str, dict]:
    d = DATASETS[ds]
    alg, hp = METHODS[method]
    cid = f"{ds}_{part}_{method}{suffix}"
    data: dict = {"dataset": d["dataset"], "num_clients": 100, "split": [0.75, 0.0, 0.25]}
    if alpha is not None:
        data.update(partition="dirichlet", alpha=alpha, min_size=20)
    else:
        data.update(partition="shards", classes_per_client=2)
    cfg = {
        "name": f"fedcspack-{cid.replace('_', '-')}",
        "seed": 0,
        "rounds": 100,
        "threads": 1,
        "data": data,
        "model": {"name": d["model"]},
        "algorithm": {"name": alg, "lr": d["lr"], "batch_size": d["batch_size"],
                      "local_epochs": d["local_epochs"], **hp, **(extra or {})},
        "topology": {"kind": "star", "sampling": "count", "count": count},
        "eval": {"protocols": ["personal", "global"], "main": "personal/acc_weighted",
                 "every": d["eval_every"]},
    }
    return cid, cfg


def main() -> None:
    configs: dict[str, dict] = {}
    runs: list[dict] = []

    def add(cid: str, cfg: dict) -> str:
        configs[cid] = cfg
        return f"experiments/fedcspack/{cid}.toml"

    for ds in DATASETS:
        for i, alpha in enumerate((0.3, 0.6, 1.0)):
            part = f"dir{alpha}"
            for method in METHODS:
                path = REUSED.get((ds, part, method)) or add(*config(ds, part, method, alpha=alpha))
                paper = TABLE1[ds].get(method)
                runs.append({"id": f"table1/{ds}/{part}/{method}", "table": "table1", "row": f"{ds} {part} {method}",
                             "config": path,
                             "metric": "personal/acc_weighted", **({"paper": paper[i]} if paper else {}),
                             **({"seeds": HEADLINE_SEEDS} if method in ("fedavg", "fedcspack") else {})})
                if alpha == 0.3 and method in ("fedavg", "fedcspack", "fedcspack_code", "fedspu"):
                    for direction in ("up", "down"):
                        runs.append({"id": f"table2/{ds}/{method}/bytes_{direction}", "table": "table2",
                                     "config": path, "metric": f"bytes/{direction}",
                                     **({"paper": TABLE2[ds][method], "paper_unit": "GB"}
                                        if direction == "up" and method in TABLE2[ds] else {})})
                    runs.append({"id": f"table2/{ds}/{method}/time", "table": "table2", "config": path,
                                 "metric": "time/elapsed_s"})
        for method in METHODS:
            path = add(*config(ds, "pat", method))
            paper = TABLEA1[ds].get(method)
            runs.append({"id": f"tableA1/{ds}/pat/{method}", "table": "tableA1", "row": f"{ds} {method}",
                         "config": path,
                         "metric": "personal/acc_weighted", **({"paper": paper} if paper else {})})
    # table 3: mask ablation, CIFAR-10 Dir(0.5)
    for mask, vals in TABLE3.items():
        cid, cfg = config("cifar10", "dir0.5", "fedcspack", alpha=0.5, extra={"mask": mask},
                          suffix=f"_mask{mask}")
        path = add(cid, cfg)
        for r, v in zip((10, 30, 50, 70, 100), vals):
            runs.append({"id": f"table3/{mask}/round{r}", "table": "table3", "config": path,
                         "metric": "personal/acc_weighted", "round": r, "paper": round(100 * v, 2)})
    # figure 5: PACK size sweep (FMNIST and CIFAR-10, Dir 0.3)
    for ds in DATASETS:
        for pack in PACK_SIZES:
            if pack == 1024:
                path = f"experiments/fedcspack/{ds}_dir0.3_fedcspack.toml"
            else:
                path = add(*config(ds, "dir0.3", "fedcspack", alpha=0.3, extra={"pack": pack},
                                   suffix=f"_pack{pack}"))
            runs.append({"id": f"fig5/{ds}/pack{pack}", "table": "fig5", "config": path,
                         "metric": "personal/acc_weighted"})
    # figure 4 / A4: client participation ratio (FMNIST Dir 0.3, FedAvg vs FedCSPACK)
    for count in CPR_COUNTS:
        for method in ("fedavg", "fedcspack"):
            path = add(*config("fmnist", "dir0.3", method, alpha=0.3, count=count, suffix=f"_cpr{count}"))
            runs.append({"id": f"fig4/fmnist/cpr{count / 100:g}/{method}", "table": "fig4", "config": path,
                         "metric": "personal/acc_weighted"})

    # the selection knob: top_k_ratio caps the packs a client sends (the paper's 4-8% uplink)
    for ratio in (0.05,):
        path = add(*config("fmnist", "dir0.3", "fedcspack", alpha=0.3, extra={"top_k_ratio": ratio},
                           suffix=f"_topk{ratio:g}"))
        for metric in ("personal/acc_weighted", "bytes/up", "bytes/down"):
            runs.append({"id": f"extra/fmnist/dir0.3/fedcspack_topk{ratio:g}/{metric}", "table": "extra",
                         "config": path, "metric": metric})

    for cid, cfg in configs.items():
        (HERE / f"{cid}.toml").write_text(
            f"# FedCSPACK reproduction: {cid} (generated by make_configs.py; edit there)\n" + tomli_w.dumps(cfg))
    header = ("# lowband reproduce fedcspack: one [[run]] per table cell; `paper` is the paper's value in %\n"
              "# (table2: GB, paper_unit). Generated by make_configs.py.\n")
    (HERE / "reproduce.toml").write_text(header + tomli_w.dumps({"paper": "fedcspack", "run": runs}))
    print(f"wrote {len(configs)} configs and {len(runs)} reproduce entries")


if __name__ == "__main__":
    main()
