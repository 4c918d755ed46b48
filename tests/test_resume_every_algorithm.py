"""Every algorithm resumes to the byte: a run killed after round 2's metrics and before its
checkpoint, then resumed, writes the metrics.jsonl an uninterrupted run writes. Long
reproduction runs are resumed as a matter of course (a session ends, a machine is lent
for 30 minutes), so state a checkpoint forgot (a momentum buffer, MOON's previous model,
DisPFL's masks, a codec's residual, SPARK's schedule position) would silently change the
numbers of every resumed run. Algorithms that cannot run on the tiny digits setting with
their defaults get the few keys they ask for (a public set, a topology they exchange on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.config import validate
from lowband.engine.simulator import Simulation


class _Kill(Exception):
    pass


#: the one-shot methods' pretraining, pruning and distillation cut to a few epochs and
#: DENSE / Co-Boosting's synthesis to a few steps (their defaults are the papers': minutes
#: per run here); only the keys an algorithm has are passed
LIGHT = {"pretrain_epochs": 4, "patience": 2, "targets": [0, 3], "Q": 2, "K": 2, "finetune_epochs": 1,
         "prune_epochs": 1, "post_finetune_epochs": 1, "distill_epochs": 2, "ensemble_steps": 10,
         "nz": 16, "ngf": 8, "synthesis_batch": 32, "g_steps": 3, "kd_batch": 16, "kd_steps": 5, "kd_epochs": 2,
         "epochs": 2, "flip": False}


def _config(root: Path, name: str) -> dict:
    cfg = digits_config(root, name, rounds=4)
    family = ALGORITHMS[name].family
    if family == "oneshot" or name in ("dense", "coboost"):
        fields = ALGORITHMS[name].Hyperparams.model_fields
        cfg["algorithm"].update({k: v for k, v in LIGHT.items() if k in fields})
    if family == "peer":
        cfg["topology"] = {"kind": "kregular", "k": 3}
    elif family == "oneshot":  # they meet peers over a contact plan
        cfg["topology"] = {"kind": "contact_plan", "per_round": [2, 2, 1, 1]}
    elif name in ("dense", "coboost"):  # one upload from every client in round 1
        cfg["topology"] = {"kind": "star", "sampling": "all"}
    if name in ("kta", "fedmd"):
        cfg["data"]["public_size"] = 100
    if getattr(ALGORITHMS[name], "event_clock", False):  # the event clock starts clients, not a topology
        cfg.pop("topology", None)
        cfg["links"] = {"preset": "nbiot"}
    cfg["checkpoint_every"] = 1
    return cfg


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_resumes_byte_identically(tmp_path: Path, name: str) -> None:
    exp = validate(_config(tmp_path / "full", name))
    Simulation(exp).run()
    want = (Path(exp.run_dir()) / "metrics.jsonl").read_text()
    assert len(want.splitlines()) >= 2

    cut = validate(_config(tmp_path / "cut", name))

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 2:  # round 2's metrics are written, its checkpoint is not: a torn state
            raise _Kill

    with pytest.raises(_Kill):
        Simulation(cut, progress=boom).run()
    Simulation(cut, resume=True).run()
    got = (Path(cut.run_dir()) / "metrics.jsonl").read_text()
    assert got == want, f"{name}: the resumed run's metrics differ from the uninterrupted run's"
