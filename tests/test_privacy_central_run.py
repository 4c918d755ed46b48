"""DP-FedAvg in real runs: each round's update is the clipped mean plus noise of std
z*S/m per coordinate (measured from the run's metrics), epsilon per round in metrics.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import digits_config
from lowband.algorithms import ALGORITHMS
from lowband.config import validate
from lowband.engine.simulator import Simulation
from lowband.privacy.central import DPFedAvg
from lowband.privacy.central_steps import with_central_dp

pytest.importorskip("dp_accounting")


def _records(tmp_path: Path, monkeypatch, rule: DPFedAvg, track=None, name: str = "r") -> tuple[list[dict], int]:
    monkeypatch.setitem(ALGORITHMS, "fedavg", with_central_dp(ALGORITHMS["fedavg"], rule, track))
    cfg = digits_config(tmp_path / name, "fedavg", rounds=3, upload="delta")
    sim = Simulation(validate(cfg))
    sim.result = sim.run()
    lines = (Path(sim.result.run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if "alg/dp/update_norm" in x], sim.model_size


def test_clipping_bounds_every_round_in_a_real_run(tmp_path: Path, monkeypatch) -> None:
    recs, _ = _records(tmp_path, monkeypatch, DPFedAvg(clip=1e-3, noise_multiplier=0.0, expected_cohort=4))
    assert len(recs) == 3
    for r in recs:
        assert r["alg/dp/update_norm"] <= 1e-3 * (1 + 1e-5)  # the mean of 4 clipped updates
        assert r["alg/dp/clipped_fraction"] == 1.0  # digits updates are far larger than 1e-3


def test_noise_std_and_epsilon_in_a_real_run(tmp_path: Path, monkeypatch) -> None:
    from lowband.privacy.accountant import EpsilonTrack, SampledGaussian

    track = EpsilonTrack.plan(SampledGaussian(1.0, population=8, cohort=4, sampling="fixed"), 3, 1e-5)
    recs, d = _records(tmp_path, monkeypatch, DPFedAvg(clip=1e-3, noise_multiplier=1.0, expected_cohort=4), track)
    for r in recs:
        # ||clipped mean + N(0, (zS/m)^2 I_d)|| ~ zS/m sqrt(d) when the noise dominates
        assert r["alg/dp/update_norm"] == pytest.approx(1e-3 / 4 * math.sqrt(d), rel=0.1)
        assert r["alg/dp/noise_std"] == pytest.approx(1e-3)
        # written as alg/dp/epsilon by the current round loop (the driver's observer will write dp/epsilon)
        assert r["alg/dp/epsilon"] == pytest.approx(track.epsilon(r["round"])) and r["alg/dp/epsilon"] > 0
