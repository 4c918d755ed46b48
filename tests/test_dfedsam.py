"""DFedSAM: the adaptive-SAM perturbation acts (the update differs from plain SGD), the
step follows the formula of the spec, and the round is local training + gossip."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.train.sam import sam_train
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.models import build_model
from lowband.seeding import torch_gen
from lowband.train import get_params, sgd_train


def _setup():
    torch.manual_seed(0)
    m = build_model("mlp", num_classes=3, input_shape=(1, 4, 4), hidden=8)
    x = torch.randn(40, 1, 4, 4)
    y = torch.randint(0, 3, (40,))
    return m, get_params(m), x, y


def test_defaults_are_the_reference_code() -> None:
    hp = ALGORITHMS["dfedsam"].Hyperparams()
    assert (hp.lr, hp.lr_decay, hp.batch_size, hp.local_epochs, hp.momentum, hp.rho, hp.weight_decay, hp.adaptive) \
        == (0.01, 0.95, 32, 5, 0.99, 0.01, 5e-4, True)


def test_rho_zero_is_sgd_and_the_perturbation_changes_the_update() -> None:
    m, p, x, y = _setup()
    kw = dict(epochs=2, batch_size=8, lr=0.1, momentum=0.9, weight_decay=5e-4)
    sgd, _ = sgd_train(m, p, x, y, gen=torch_gen(1), **kw)
    flat, _ = sam_train(m, p, x, y, gen=torch_gen(1), rho=0.0, **kw)
    sam, _ = sam_train(m, p, x, y, gen=torch_gen(1), rho=0.5, **kw)
    for k in p:
        torch.testing.assert_close(flat[k], sgd[k])
    diff = sum(float((sam[k] - sgd[k]).norm()) for k in p)
    assert diff > 1e-3


def test_one_step_follows_the_adaptive_sam_formula() -> None:
    m, p, x, y = _setup()
    rho, lr = 0.05, 0.1
    got, _ = sam_train(m, p, x, y, epochs=1, batch_size=40, lr=lr, gen=torch_gen(0), rho=rho)
    # by hand: one full batch, plain SGD base
    w = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    loss = F.cross_entropy(torch.func.functional_call(m, w, (x,)), y)
    g = torch.autograd.grad(loss, list(w.values()))
    norm = torch.norm(torch.stack([(w[k].abs() * gi).norm() for k, gi in zip(w, g)]))
    e = {k: w[k].detach() ** 2 * gi * rho / (norm + 1e-12) for k, gi in zip(w, g)}
    w2 = {k: (w[k].detach() + e[k]).requires_grad_(True) for k in w}
    g2 = torch.autograd.grad(F.cross_entropy(torch.func.functional_call(m, w2, (x,)), y), list(w2.values()))
    for (k, v), gi in zip(p.items(), g2):
        torch.testing.assert_close(got[k], v - lr * gi, rtol=1e-5, atol=1e-6)


def test_round_is_sam_then_gossip(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path, "dfedsam", rounds=2)
    cfg["topology"] = {"kind": "kregular", "k": 3}
    sim = Simulation(validate(cfg))
    res = sim.run()
    assert res.metrics[-1]["consensus/acc"] > res.metrics[0]["consensus/acc"]
    assert set(sim.ledger.by_kind()) == {"weights"}
    enc, _ = sim.ledger.totals(round=1)
    assert enc == 8 * 3 * sim.ledger.totals(round=1, src=0)[0] // 3
