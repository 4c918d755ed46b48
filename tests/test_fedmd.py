"""FedMD: stratified alignment subsets, the MAE digest, the labels sent once, one consensus
for everyone, diagnostics in metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from conftest import digits_config
from lowband.algorithms.knowledge.fedmd import _mae, stratified_subset
from lowband.train.distill import adam_fit
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.train import get_params


def test_stratified_subset_keeps_class_proportions() -> None:
    y = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    idx = stratified_subset(y, 40, np.random.default_rng(0))
    assert len(idx) == 40 and len(set(idx.tolist())) == 40
    assert np.bincount(y[idx].numpy()).tolist() == [20, 12, 8]
    assert stratified_subset(y, 500, np.random.default_rng(0)).tolist() == list(range(100))
    idx = stratified_subset(y, 7, np.random.default_rng(1))  # remainders go to the largest fractions
    assert len(idx) == 7 and np.bincount(y[idx].numpy(), minlength=3).tolist() == [4, 2, 1]


def test_digest_fits_logits_with_mae() -> None:
    torch.manual_seed(0)
    m = nn.Linear(5, 3)
    p0 = get_params(m)
    x = torch.randn(256, 5)
    target = torch.randn(256, 3)
    with torch.no_grad():
        before = float(_mae(m, x, target))
    p1, stats = adam_fit(m, p0, x, target, _mae, epochs=10, batch_size=64, lr=1e-2, gen=torch.Generator().manual_seed(0))
    m.load_state_dict(p1)
    with torch.no_grad():
        assert float(_mae(m, x, target)) < before and stats.steps == 10 * 4


def _fedmd_cfg(tmp_path: Path, rounds: int = 2) -> dict:
    cfg = digits_config(tmp_path, "fedmd", rounds=rounds)
    cfg["threads"] = 1
    cfg["data"]["public_size"] = 100
    cfg["model"] = {"name": "logreg"}
    cfg["topology"] = {"kind": "star", "sampling": "all"}
    cfg["algorithm"] = {"name": "fedmd", "lr": 0.01, "transfer_public_epochs": 2, "transfer_private_epochs": 2,
                        "revisit_epochs": 1, "revisit_batch": 16, "n_alignment": 60}
    return cfg


def test_fedmd_end_to_end(tmp_path: Path) -> None:
    sim = Simulation(validate(_fedmd_cfg(tmp_path)))
    res = sim.run()
    led = sim.ledger
    n, c = 8, 10
    kinds = led.by_kind()
    assert set(kinds) == {"public_labels", "align", "logits", "consensus"}
    assert kinds["public_labels"]["messages"] == n  # labels of the public set, once per client
    assert led.by_kind(round=2).get("public_labels") is None
    # one consensus (a broadcast: same bytes to everyone) per client per round, 60 x C logits
    assert kinds["consensus"]["messages"] == 2 * n and kinds["logits"]["messages"] == 2 * n
    # same payload both ways; the headers differ by the kind's name ("consensus" vs "logits")
    assert kinds["consensus"]["encoded"] - kinds["logits"]["encoded"] == 2 * n * (len("consensus") - len("logits"))
    assert kinds["logits"]["encoded"] // (2 * n) > 60 * c * 4
    last = res.metrics[-1]
    for key in ("teacher_entropy", "teacher_acc", "ref_acc_mean", "logit_mae"):
        assert f"alg/{key}" in last
    assert 0 <= last["alg/teacher_entropy"] <= np.log(c) + 1e-9
    assert last["node_global/acc"] > 0.3  # transfer learning + collaboration learn something


def test_fedmd_resume_is_identical(tmp_path: Path) -> None:
    full = Simulation(validate(_fedmd_cfg(tmp_path / "full", rounds=3))).run()
    cfg = _fedmd_cfg(tmp_path / "cut", rounds=3)

    class Kill(Exception):
        pass

    def boom(r: int, total: int, rec: dict) -> None:
        if r == 2:
            raise Kill

    try:
        Simulation(validate(cfg), progress=boom).run()
    except Kill:
        pass
    resumed = Simulation(validate(cfg), resume=True).run()
    assert (Path(full.run_dir) / "metrics.jsonl").read_text() == (Path(resumed.run_dir) / "metrics.jsonl").read_text()
