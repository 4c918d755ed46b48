"""Central DP with SCAFFOLD through the aggregation hook: the model delta and the
control-variate delta are two releases a round, each clipped to S and noised (independent
noise), and the accountant composes both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import digits_config
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.privacy.accountant import SampledGaussian, final_epsilon
from lowband.privacy.central import DPFedAvg
from lowband.privacy.central_steps import _Releases
from lowband.seeding import torch_gen

pytest.importorskip("dp_accounting")

CENTRAL = {"mechanism": "central", "clip": 0.5, "noise_multiplier": 1.0}


class _Inp:
    def __init__(self, updates: torch.Tensor) -> None:
        self.updates, self.weights, self.round = updates, torch.ones(len(updates)), 1


def test_each_release_has_its_own_noise_and_clip() -> None:
    rules = (DPFedAvg(0.5, 1.0, expected_cohort=4), DPFedAvg(0.5, 1.0, expected_cohort=4))
    rel = _Releases(rules)
    upd = torch.zeros(3, 50)
    upd[0, 0] = 10.0  # clipped to 0.5
    gen = lambda: torch_gen(7, "aggregate")  # noqa: E731  (the hook hands every call the same generator)
    a, ca = rel(_Inp(upd), gen())
    b, _ = rel(_Inp(upd), gen())
    assert not torch.allclose(a, b)  # independent noise: the difference of the releases is not noise-free
    base = int(torch.randint(0, 2**62, (1,), generator=gen()))
    want, _ = DPFedAvg(0.5, 1.0, expected_cohort=4)(_Inp(upd), torch_gen(base, "dp-release", 0))
    assert torch.equal(a, want) and ca["clipped"] == 1.0
    # std z S / m on each coordinate, around the clipped sum / m
    big = _Releases((DPFedAvg(0.5, 1.0, expected_cohort=4),))(_Inp(torch.zeros(1, 200_000)), gen())[0]
    assert float(big.std()) == pytest.approx(0.5 / 4, rel=0.01)
    with pytest.raises(RuntimeError, match="accounted"):
        rel(_Inp(upd), gen())


def test_scaffold_under_central_dp_accounts_two_releases_a_round_and_noises_both(tmp_path: Path) -> None:
    cfg = digits_config(tmp_path / "dp", "scaffold", rounds=3)
    cfg["dp"] = CENTRAL
    sim = Simulation(validate(cfg))
    res = sim.run()
    recs = [json.loads(x) for x in (Path(res.run_dir) / "metrics.jsonl").read_text().splitlines()]
    two = SampledGaussian(1.0, population=8, cohort=4, sampling="fixed", releases_per_round=2)
    one = SampledGaussian(1.0, population=8, cohort=4, sampling="fixed")
    for r in (r for r in recs if r["round"] > 0):
        assert r["dp/epsilon"] == pytest.approx(final_epsilon(two, r["round"], 1e-5), rel=1e-9)
        assert r["dp/epsilon"] > final_epsilon(one, r["round"], 1e-5)
    assert recs[-1]["alg/dp/noise_std"] == 0.5 and recs[-1]["alg/dp/senders"] == 4
    # both sums were privatised: the model and the server control variate differ from plain SCAFFOLD's
    plain_cfg = digits_config(tmp_path / "plain", "scaffold", rounds=3)
    plain = Simulation(validate(plain_cfg))
    plain.run()
    s_dp, s_pl = sim.executor.states[-1], plain.executor.states[-1]
    for k in s_pl["c"]:
        assert not torch.allclose(s_dp["c"][k], s_pl["c"][k])
    # the control variate moved by at most (clipped sum + noise) / m * |S| / N a round: its noise is
    # of std z S / m * |S| / N per coordinate and round, not the unclipped deltas' scale
    c = torch.cat([v.reshape(-1) for v in s_dp["c"].values()])
    assert float(c.std()) < 3 * 0.5 / 4 * 4 / 8 * 3 ** 0.5


def test_scaffold_central_dp_refusals_are_one_line(tmp_path: Path) -> None:
    from lowband.config import ConfigError

    cfg = digits_config(tmp_path, "scaffold", rounds=2)
    cfg["dp"] = {**CENTRAL, "adaptive_clip": True}
    with pytest.raises(ConfigError, match="share one fixed clip") as e:
        Simulation(validate(cfg))
    assert "\n" not in str(e.value)
    cfg["dp"] = CENTRAL
    cfg["topology"] = {"kind": "star", "sampling": "poisson", "fraction": 0.5}
    with pytest.raises(ConfigError, match="Poisson sampling makes private") as e:
        Simulation(validate(cfg))
    assert "\n" not in str(e.value)
