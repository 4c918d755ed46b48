"""Learning checks: every registered algorithm learns on a small real task (DESIGN.md rule 7).

The task: the embedded ``digits`` data (scikit-learn's 1,797 real 8x8 images, 10 balanced
classes, so chance is 10%), 8 clients with Dirichlet(0.5) label skew, a 200-sample public
set carved out for the methods that need one (the same federation for every run), an MLP
with 32 hidden units, one seed. Every registered algorithm (iterating the registry, so a
new one is covered the day it is registered) must

1. raise its **main metric** (the algorithm's ``default_main``) above both chance and its
   round-0 value by the margin of its row below, within the row's rounds; and
2. where it exchanges information, **beat ``local``** (one ``local`` run on the same
   federation) on the metric pair of its row by that row's margin, or **match** it (a
   negative margin: at most that far below) where the paper itself puts it level with
   or below local, or where it does not beat local at this size (said in the row).

An algorithm without a row here FAILS (add its row: a small config and margins measured
with ``python tests/test_learning.py NAME``). Each algorithm runs once (cached) for all
its assertions, without writing a run folder; the whole tier takes about a minute.

Comparisons with ``local``: a global model (``global/acc``) or a peer's model
(``node_global/acc``) on the global test set against the local models on the same set
(``node_global/acc``): what collaboration adds beyond a client's own skewed classes.
Personalised methods are compared on their own metric (``personal/acc_weighted``, each
client's model on its own test split), where the local models are strong.

Measured with ``python tests/test_learning.py --seeds 1,2,3`` (torch 2.13 CPU, threads=1; the
tests run seed 1; values are seeds 1 / 2 / 3; "gap" = method - local on the pair named;
a margin is about the smallest gap over the seeds minus some slack, since a CI machine's
floating point may take another path):

| algorithm | main metric | round 0 | final | margin | vs local: method / local | gap | margin |
|---|---|---|---|---|---|---|---|
| `local` | personal/acc_weighted | .075 / .084 / .019 | .909 / .926 / .955 | .65 | (the baseline) | | |
| `fedavg` | personal/acc_weighted | .075 / .084 / .019 | .916 / .942 / .890 | .60 | global / node_global | +.390 / +.290 / +.437 | +.20 |
| `fedprox` | personal/acc_weighted | .075 / .084 / .019 | .916 / .942 / .890 | .60 | global / node_global | +.390 / +.290 / +.437 | +.20 |
| `fednova` | personal/acc_weighted | .075 / .084 / .019 | .925 / .942 / .890 | .60 | global / node_global | +.409 / +.290 / +.437 | +.20 |
| `fedntd` | personal/acc_weighted | .075 / .084 / .019 | .919 / .942 / .910 | .60 | global / node_global | +.409 / +.290 / +.437 | +.20 |
| `moon` | personal/acc_weighted | .075 / .084 / .019 | .916 / .942 / .887 | .60 | global / node_global | +.393 / +.290 / +.437 | +.20 |
| `scaffold` | personal/acc_weighted | .075 / .084 / .019 | .916 / .945 / .942 | .65 | global / node_global | +.407 / +.298 / +.453 | +.20 |
| `fedasync` | personal/acc_weighted | .075 / .084 / .019 | .870 / .916 / .855 | .60 | global / node_global | +.340 / +.265 / +.403 | +.20 |
| `fedbuff` | personal/acc_weighted | .075 / .084 / .019 | .867 / .913 / .868 | .60 | global / node_global | +.351 / +.268 / +.403 | +.20 |
| `fedala` | personal/acc_weighted | .075 / .084 / .019 | .958 / .942 / .965 | .65 | personal / personal | +.049 / +.016 / +.010 | -.03 |
| | | | | | global / node_global | +.343 / +.287 / +.395 | +.20 |
| `fedas` | personal/acc_weighted | .075 / .084 / .019 | .945 / .932 / .965 | .65 | personal / personal | +.036 / +.006 / +.010 | -.03 |
| | | | | | global / node_global | +.340 / +.259 / +.339 | +.20 |
| `fedcspack` | personal/acc_weighted | .075 / .084 / .019 | .942 / .932 / .971 | .65 | personal / personal | +.032 / +.006 / +.016 | -.03 |
| | | | | | global / node_global | +.404 / +.265 / +.423 | +.20 |
| `fedpac` | personal/acc_weighted | .075 / .084 / .019 | .948 / .926 / .971 | .65 | personal / personal | +.039 / +.000 / +.016 | -.03 |
| | | | | | global / node_global | +.357 / +.276 / +.295 | +.20 |
| `fedspu` | personal/acc_weighted | .075 / .084 / .019 | .942 / .945 / .965 | .65 | personal / personal | +.032 / +.019 / +.010 | -.03 |
| | | | | | global / node_global | +.398 / +.296 / +.423 | +.20 |
| `feddbe` | personal/acc_weighted | .075 / .084 / .019 | .886 / .874 / .903 | .60 | personal / personal | -.023 / -.052 / -.052 | -.08 |
| | | | | | global / node_global | +.359 / +.254 / +.331 | +.20 |
| `dfedavg` | consensus/acc | .050 / .106 / .050 | .905 / .905 / .905 | .60 | node_global / node_global | +.379 / +.285 / +.419 | +.20 |
| `dfedavgm` | consensus/acc | .050 / .106 / .050 | .947 / .950 / .953 | .65 | node_global / node_global | +.420 / +.324 / +.455 | +.25 |
| `dpsgd` | consensus/acc | .050 / .106 / .050 | .833 / .889 / .894 | .55 | node_global / node_global | +.308 / +.261 / +.377 | +.20 |
| `dfedsam` | consensus/acc | .050 / .106 / .050 | .936 / .942 / .944 | .65 | node_global / node_global | +.424 / +.320 / +.454 | +.25 |
| `dispfl` | consensus/acc | .070 / .097 / .081 | .877 / .877 / .836 | .55 | node_global / node_global | +.359 / +.257 / +.339 | +.20 |
| | | | | | personal / personal | -.016 / -.019 / -.045 | -.07 |
| `ntk_dfl` | consensus/acc | .050 / .106 / .050 | .916 / .919 / .930 | .60 | node_global / node_global | +.386 / +.292 / +.397 | +.20 |
| `spark` | consensus/acc | .050 / .106 / .050 | .869 / .833 / .847 | .55 | node_global / node_global | +.319 / +.182 / +.273 | +.10 |
| `kta` | node_global/acc | .050 / .106 / .050 | .886 / .911 / .887 | .60 | personal / personal | +.019 / +.023 / -.000 | -.03 |
| | | | | | node_global / node_global | +.379 / +.296 / +.407 | +.20 |
| `fedmd` | node_global/acc | .050 / .106 / .050 | .594 / .665 / .556 | .35 | personal / personal | +.032 / -.016 / +.013 | -.04 |
| | | | | | node_global / node_global | +.087 / +.049 / +.077 | +.02 |
| `fol` | personal/acc_weighted | .075 / .084 / .019 | .932 / .922 / .955 | .65 | personal / personal | +.023 / -.003 / +.000 | -.03 |
| `oneshot_fedavg` | personal/acc_weighted | .075 / .084 / .019 | .516 / .696 / .697 | .30 | none: the paper puts it below local | | |
| `dense` | global/acc | .050 / .106 / .050 | .588 / .596 / .699 | .40 | global / node_global | +.081 / -.019 / +.219 | -.05 |
| `coboost` | global/acc | .050 / .106 / .050 | .713 / .674 / .577 | .40 | global / node_global | +.206 / +.059 / +.097 | +.03 |

What the papers report against local, and what is asserted: every method beats local on
the global test set by the margin above (it learns from the others' classes). On the
clients' own test splits, where local models are strong (label skew), the personalised
methods, KTA, FedMD and FOL beat local in their papers but are about level at this size
(gaps of -1.6 to +4.9 points over the seeds), so their check is "at most |margin| below";
FedDBE and DisPFL are below local there at this size (FedDBE still after 100 rounds), so
their margins are wider and said as such. One-shot FedAvg is below local in the FOL paper
(45.6 vs 60.1 on CIFAR-10 client 9): no comparison. DENSE (61.7, level with local there) and
Co-Boosting (63.1, above) are compared as global models: the student on the global test set
against the local models on it; DENSE is about level (-.019 to +.219), Co-Boosting above
(+.059 to +.206), the order of the paper.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from conftest import without_round_sections
from lowband.algorithms import ALGORITHMS
from lowband.config import validate
from lowband.engine.simulator import Simulation

CHANCE = 0.10  # digits: 10 balanced classes
SEED = 1  # the tests' seed; the margins hold over seeds 1-3 (`python tests/test_learning.py --seeds 1,2,3`)

#: the one federation of every run (public set carved out for kta/fedmd, unused by the others)
FEDERATION = {"dataset": "digits", "num_clients": 8, "partition": "dirichlet", "alpha": 0.5, "min_size": 20,
              "split": [0.75, 0.0, 0.25], "public_size": 200}
MODEL = {"name": "mlp", "hidden": 32}
#: short local SGD given to every algorithm that has these knobs (local included)
SHORT_SGD = {"local_epochs": 1, "batch_size": 16, "lr": 0.05}
#: the pretraining of the one-shot methods (FOL family, DENSE, Co-Boosting)
PRETRAIN = {"pretrain_epochs": 30, "patience": 5, "lr": 0.05, "batch_size": 32}
#: DENSE / Co-Boosting on CPU: a small generator and synthesis, 50 distillation batches per
#: epoch at lr 0.05 (the MLP; the papers' 0.01 is for their CNNs), no flips (digits)
GENERATOR = {"nz": 64, "ngf": 16, "synthesis_batch": 128, "g_steps": 20, "kd_batch": 32, "kd_steps": 50,
             "kd_lr": 0.05, "flip": False}

PERSONAL, NODE_GLOBAL, GLOBAL = "personal/acc_weighted", "node_global/acc", "global/acc"

@dataclass(frozen=True)
class Check:
    """One algorithm's small-task run and what it must reach."""

    rounds: int
    #: main metric >= max(CHANCE, round-0 value) + margin
    margin: float
    #: hyperparameters on top of SHORT_SGD (those the algorithm has)
    alg: dict[str, Any] = field(default_factory=dict)
    #: (metric of the method, metric of the local run, margin): method >= local + margin
    vs_local: tuple[tuple[str, str, float], ...] = ()
    #: why there is no comparison with local (required when vs_local is empty)
    no_local: str = ""
    #: what the method's paper reports against local, for the table
    paper: str = ""
    topology: Optional[dict[str, Any]] = None
    model: Optional[dict[str, Any]] = None
    protocols: tuple[str, ...] = ()
    slow: bool = False


Comparison = tuple[tuple[str, str, float], ...]


def _global(margin: float) -> Comparison:
    """The server's model on the global test set against the local models on it."""
    return ((GLOBAL, NODE_GLOBAL, margin),)


def _nodes(margin: float) -> Comparison:
    """Each node's model on the global test set against the local models on it."""
    return ((NODE_GLOBAL, NODE_GLOBAL, margin),)


def _personal(margin: float) -> Comparison:
    """Each client's model on its own test split against the local models on theirs."""
    return ((PERSONAL, PERSONAL, margin),)


PFL_LEVEL = "beats; about level at this size (personal gap per seed in the table): 'at most |margin| below'"
PFL_BELOW = "beats; at this size below local on personal accuracy (seeds 1-3): see its margin"
CONTACTS = {"kind": "contact_plan", "per_round": [7]}
#: DENSE's BatchNorm-statistics loss needs BatchNorm layers (the papers' CNNs have them)
BN_CNN = {"name": "fol_wildfire_cnn", "channels": [16, 32]}


CHECKS: dict[str, Check] = {
    "local": Check(30, 0.65, protocols=("personal", "node_global"), no_local="the baseline itself"),
    # server methods, one global model: the global model against the local models, global test set
    "fedavg": Check(30, 0.60, vs_local=_global(0.20), paper="beats"),
    "fedprox": Check(30, 0.60, vs_local=_global(0.20), paper="beats"),
    "fednova": Check(30, 0.60, vs_local=_global(0.20), paper="beats"),
    "fedntd": Check(30, 0.60, vs_local=_global(0.20), paper="beats"),
    "moon": Check(30, 0.60, vs_local=_global(0.20), paper="beats"),
    "scaffold": Check(30, 0.65, vs_local=_global(0.20), paper="beats"),
    # two gateways (nodes 6, 7) over the six other nodes (the default 5 need 10 nodes)
    "hierfavg": Check(30, 0.60, alg={"edges": 2}, vs_local=_global(0.20),
                      paper="not compared with local (the paper compares with FedAvg); beats here"),
    # asynchronous (event clock): a round is one arrival, so 240 rounds train as many client
    # epochs as FedAvg's 30 rounds of all 8 clients; the defaults (10 and 100 at once) keep
    # all 8 busy, and without [links] every arrival ties at t = 0 (served in dispatch order)
    "fedasync": Check(240, 0.60, alg={}, vs_local=_global(0.20), paper="not compared with local (the paper compares "
                      "with FedAvg and SGD); beats here"),
    "fedbuff": Check(240, 0.60, alg={}, vs_local=_global(0.20), paper="not compared with local (the paper compares "
                     "with FedAvg and FedAsync); beats here"),
    # personalised server methods: the global model they share against the local models on
    # the global test set, and their personal models against the local ones (level at this size)
    "fedala": Check(30, 0.65, vs_local=_personal(-0.03) + _global(0.20), paper=PFL_LEVEL),
    "fedas": Check(30, 0.65, vs_local=_personal(-0.03) + _global(0.20), paper=PFL_LEVEL),
    "fedcspack": Check(30, 0.65, vs_local=_personal(-0.03) + _global(0.20), paper=PFL_LEVEL),
    "fedpac": Check(30, 0.65, vs_local=_personal(-0.03) + _global(0.20), paper=PFL_LEVEL),
    "fedspu": Check(30, 0.65, vs_local=_personal(-0.03) + _global(0.20), paper=PFL_LEVEL),
    "feddbe": Check(30, 0.60, vs_local=_personal(-0.08) + _global(0.20), paper=PFL_BELOW),
    # peers: each node's model against the local models on the global test set
    "dfedavg": Check(30, 0.60, vs_local=_nodes(0.20), paper="beats"),
    "dfedavgm": Check(30, 0.65, vs_local=_nodes(0.25), paper="beats"),
    "dpsgd": Check(100, 0.55, alg={"batch_size": 16}, vs_local=_nodes(0.20), paper="beats"),
    "dfedsam": Check(30, 0.65, vs_local=_nodes(0.25), paper="beats"),
    "dispfl": Check(30, 0.55, protocols=("consensus", "node_global", "personal"),
                    vs_local=_nodes(0.20) + _personal(-0.07), paper=PFL_BELOW),
    "ntk_dfl": Check(5, 0.60, vs_local=_nodes(0.20), paper="beats"),
    "spark": Check(5, 0.55, vs_local=_nodes(0.10), paper="beats"),
    # knowledge transfer over the public set: the models' own metric, and the global test set
    "kta": Check(10, 0.60, vs_local=_personal(-0.03) + _nodes(0.20), paper=PFL_LEVEL),
    "fedmd": Check(10, 0.35, alg={"lr": 0.01}, vs_local=_personal(-0.04) + _nodes(0.02), paper=PFL_LEVEL),
    # one-shot: every client meets the 7 others once (a contact plan), then local work
    "fol": Check(1, 0.65, alg={**PRETRAIN, "Q": 2, "K": 3, "finetune_epochs": 2, "prune_epochs": 2,
                               "post_finetune_epochs": 2, "distill_epochs": 5, "ensemble_steps": 30},
                 topology=CONTACTS, protocols=("personal", "node_global"), vs_local=_personal(-0.03),
                 paper="beats (FOL 66.8 vs Local 60.1, CIFAR-10 client 9); level at this size"),
    "oneshot_fedavg": Check(1, 0.30, alg=PRETRAIN, topology=CONTACTS, protocols=("personal", "node_global"),
                            no_local="the FOL paper puts one-shot FedAvg below Local (45.6 vs 60.1, CIFAR-10 "
                                     "client 9); measured: about 0.25 below", paper="below"),
    # DENSE / Co-Boosting: the global student distilled from the 8 uploads on synthetic data,
    # against the local models on the global test set (the FOL paper compares them on a
    # client's own split, where at this label skew no global model comes near local)
    "dense": Check(20, 0.40, alg={**PRETRAIN, **GENERATOR}, protocols=("global",),
                   vs_local=_global(-0.05), paper="level (61.7 vs 60.1, CIFAR-10 client 9); level here"),
    "coboost": Check(20, 0.40, alg={**PRETRAIN, **GENERATOR}, protocols=("global",),
                     vs_local=_global(0.03), paper="beats (63.1 vs 60.1, CIFAR-10 client 9); beats here"),
}


def config(name: str) -> dict[str, Any]:
    """The small-task config of ``name`` (its CHECKS row on the shared federation)."""
    check = CHECKS[name]
    cls = ALGORITHMS[name]
    alg = {k: v for k, v in SHORT_SGD.items() if k in cls.Hyperparams.model_fields}
    alg.update(check.alg)
    topology = check.topology or ({"kind": "kregular", "k": 3} if cls.family == "peer"
                                  else {"kind": "star", "sampling": "all"})
    protocols = list(check.protocols) or list(dict.fromkeys([*cls.default_protocols, *_local_metrics(check, 0)]))
    return without_round_sections({  # the event clock, not a topology, starts FedAsync's and FedBuff's clients
        "name": f"learn-{name}", "seed": SEED, "rounds": check.rounds, "threads": 1, "checkpoint_every": 0,
        "data": dict(FEDERATION), "model": dict(check.model or MODEL), "algorithm": {"name": name, **alg},
        "topology": topology, "eval": {"protocols": protocols, "every": check.rounds}})


def _local_metrics(check: Check, side: int) -> list[str]:
    return [c[side].split("/")[0] for c in check.vs_local]


def main_metric(name: str) -> str:
    return ALGORITHMS[name].default_main


@functools.cache
def _run(name: str, seed: int = SEED) -> tuple[dict[str, Any], dict[str, Any]]:
    """(round-0 record, final record) of ``name``'s small-task run; run once per session."""
    cfg = config(name)
    cfg["seed"] = seed
    metrics = Simulation(validate(cfg), write=False).run().metrics
    assert metrics[0]["round"] == 0 and metrics[-1]["round"] == CHECKS[name].rounds
    return metrics[0], metrics[-1]


def run_of(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if name not in CHECKS:
        pytest.fail(f"{name} has no small-task row in tests/test_learning.py CHECKS: every registered algorithm "
                    f"must show that it learns; add a row (measure it with `python tests/test_learning.py {name}`)")
    return _run(name)


def _params() -> list[Any]:
    out = []
    for name in sorted(ALGORITHMS):
        check = CHECKS.get(name)
        marks = []
        if check is not None and check.slow:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _params())
def test_learns_beyond_chance_and_round0(name: str) -> None:
    first, last = run_of(name)
    metric, margin = main_metric(name), CHECKS[name].margin
    assert metric in last, f"{name}: main metric {metric} was not evaluated"
    floor = max(CHANCE, first[metric]) + margin
    assert last[metric] >= floor, (f"{name}: {metric} = {last[metric]:.3f} after {CHECKS[name].rounds} rounds; "
                                   f"needs >= {floor:.3f} (round 0 {first[metric]:.3f}, chance {CHANCE})")


@pytest.mark.parametrize("name", _params())
def test_exchange_beats_or_matches_local(name: str) -> None:
    check = CHECKS.get(name)
    if check is not None and not check.vs_local:
        assert check.no_local, f"{name}: no comparison with local and no reason given"
        return
    _, last = run_of(name)
    _, local = run_of("local")
    for metric, local_metric, margin in check.vs_local:
        need = local[local_metric] + margin
        assert last[metric] >= need, (f"{name}: {metric} = {last[metric]:.3f}, local's {local_metric} = "
                                      f"{local[local_metric]:.3f}; needs >= {need:.3f} (margin {margin:+.3f})")


def test_every_row_is_used_and_every_exchanging_method_faces_local() -> None:
    assert not set(CHECKS) - set(ALGORITHMS), "rows for algorithms that are not registered"
    for name, check in CHECKS.items():
        assert check.vs_local or check.no_local, name
        if ALGORITHMS[name].family != "local":
            assert check.paper, f"{name}: say what the paper reports against local"


def test_a_missing_row_fails_and_a_method_that_does_not_learn_fails() -> None:
    """The tier's own power: no row is a failure (not a skip), and a run whose updates do
    nothing (FedAvg at lr 1e-9) falls short of the margin it would have to meet."""
    with pytest.raises(pytest.fail.Exception, match="no small-task row"):
        run_of("an_algorithm_registered_tomorrow")
    cfg = config("fedavg")
    cfg["algorithm"]["lr"] = 1e-9
    metrics = Simulation(validate(cfg), write=False).run().metrics
    metric = main_metric("fedavg")
    assert metrics[-1][metric] < max(CHANCE, metrics[0][metric]) + CHECKS["fedavg"].margin


def _table(names: list[str], seeds: list[int]) -> str:
    """The Markdown table of the module docstring, from fresh runs (values per seed)."""
    def vals(xs: list[float], signed: bool = False) -> str:
        return " / ".join(f"{x:+.3f}" if signed else f"{x:.3f}" for x in xs)

    rows = ["| algorithm | main metric | round 0 | final | margin | vs local: method / local | gap | margin "
            "| paper vs local |", "|---|---|---|---|---|---|---|---|---|"]
    local = [_run("local", sd)[1] for sd in seeds]
    for name in names:
        try:
            runs = [_run(name, sd) for sd in seeds]
        except Exception as exc:  # noqa: BLE001 - a measurement script: report and go on
            rows.append(f"| `{name}` | error: {type(exc).__name__}: {exc} | | | | | | | |")
            continue
        check, metric = CHECKS[name], main_metric(name)
        head = (f"| `{name}` | {metric} | {vals([f.get(metric, float('nan')) for f, _ in runs])} | "
                f"{vals([la[metric] for _, la in runs])} | {check.margin:.2f}")
        if not check.vs_local:
            rows.append(f"{head} | - | - | - | {check.paper or check.no_local} |")
        for i, (m, lm, margin) in enumerate(check.vs_local):
            gaps = [la[m] - lo[lm] for (_, la), lo in zip(runs, local)]
            rows.append(f"{head if i == 0 else '| | | | |'} | {m} / {lm} | {vals(gaps, True)} | {margin:+.2f} | "
                        f"{check.paper if i == 0 else ''} |")
    return "\n".join(rows)


if __name__ == "__main__":  # measure: python tests/test_learning.py [--seeds 1,2,3] [NAME ...]
    import time

    args, seeds = sys.argv[1:], [SEED]
    if args[:1] == ["--seeds"]:
        seeds, args = [int(x) for x in args[1].split(",")], args[2:]
    t0 = time.perf_counter()
    print(_table(args or list(CHECKS), seeds))
    print(f"({time.perf_counter() - t0:.0f} s)")
