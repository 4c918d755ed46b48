"""checks.DecayWatch: a run whose main accuracy falls far from its best and stays there is
warned about once (it exits 0, and its final value is what the tables report); one bad
round, an oscillation that recovers, or a loss metric is not."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import digits_config

from lowband.config import validate
from lowband.engine import simulator
from lowband.engine.checks import DecayWatch, LowbandWarning
from lowband.engine.simulator import Simulation

#: the default SPARK run at paper size (consensus/acc, rounds 12-24)
SPARK_A01 = [0.7737, 0.7776, 0.7760, 0.7759, 0.7748, 0.7737, 0.7695, 0.7636, 0.7539, 0.7309, 0.6939, 0.6490, 0.6196]


def _feed(watch: DecayWatch, values: list[float], first: int = 1) -> list[str]:
    said = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, v in enumerate(values):
            watch.check({"round": first + i, watch.main: v})
    said = [str(w.message) for w in caught if issubclass(w.category, LowbandWarning)]
    return said


def test_the_spark_collapse_is_warned_once_at_its_third_round_under() -> None:
    said = _feed(DecayWatch("consensus/acc"), SPARK_A01 + [0.60, 0.58], first=12)
    assert len(said) == 1  # under 67.76% from round 23 (64.90, 61.96, 60.00): the third is round 25
    assert said[0].startswith("round 25: consensus/acc") and "77.76% at round 13" in said[0] and "60.00%" in said[0]


def test_noise_and_recoveries_and_losses_are_not_warned() -> None:
    swing = [0.50, 0.62, 0.48, 0.49, 0.66, 0.52, 0.53, 0.70, 0.58, 0.59, 0.71]  # 2 rounds under at most
    assert _feed(DecayWatch("global/acc"), swing) == []
    assert _feed(DecayWatch("global/loss"), [0.3, 0.9, 1.2, 1.5, 2.0]) == []
    assert _feed(DecayWatch("global/acc"), [0.8, float("nan"), 0.5, 0.5]) == []  # NaN is skipped, not "under"


def test_a_resumed_run_does_not_repeat_what_it_already_said() -> None:
    w = DecayWatch("consensus/acc")
    for i, v in enumerate(SPARK_A01 + [0.60]):  # rounds 12-25 of the first run, which warned at 25
        assert w.check({"round": 12 + i, "consensus/acc": v}, quiet=True) is None or i == len(SPARK_A01)
    assert _feed(w, [0.55, 0.50], first=26) == []


def test_a_run_that_unlearns_warns_and_a_learning_one_does_not(tmp_path: Path, monkeypatch) -> None:
    orig = Simulation._evaluate

    def unlearning(self, r, plan):  # the real metrics, then the main accuracy forced down from round 3
        rec = orig(self, r, plan)
        if r >= 3:
            rec[self.main_metric] = 0.05
        return rec

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Simulation(validate(digits_config(tmp_path / "ok", rounds=6))).run()
    assert not [w for w in caught if "unlearning" in str(w.message)]
    monkeypatch.setattr(simulator.Simulation, "_evaluate", unlearning)
    with pytest.warns(LowbandWarning, match=r"round 5: personal/acc_weighted has been more than 10 points under its best"):
        Simulation(validate(digits_config(tmp_path / "bad", rounds=6))).run()
