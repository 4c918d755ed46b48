"""checks.DecayWatch: a run whose main accuracy falls from what it reached and stays there is
warned about once (it exits 0, and its final value is what the tables report); single bad
rounds, swings that recover, or a loss metric are not. The sequences are real runs'."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import digits_config

from lowband.config import validate
from lowband.engine import simulator
from lowband.engine.checks import DecayWatch, LowbandWarning
from lowband.engine.simulator import Simulation

#: the default SPARK at paper size, alpha 0.1 (consensus/acc, rounds 1-30)
SPARK_A01 = [0.4658, 0.6564, 0.6967, 0.7405, 0.7496, 0.7572, 0.7604, 0.7643, 0.7693, 0.7711, 0.7734, 0.7737,
             0.7776, 0.776, 0.7759, 0.7748, 0.7737, 0.7695, 0.7636, 0.7539, 0.7309, 0.6939, 0.649, 0.6196,
             0.5926, 0.5685, 0.545, 0.5239, 0.5025, 0.4801]
#: MOON on FMNIST Dir(0.6) (personal/acc_weighted, rounds 1-40): one round at 36.7% after 80.2%
MOON_DIR06 = [0.337, 0.328, 0.441, 0.536, 0.554, 0.6, 0.62, 0.722, 0.719, 0.679, 0.731, 0.705, 0.759, 0.759,
              0.75, 0.665, 0.772, 0.746, 0.724, 0.779, 0.78, 0.75, 0.755, 0.753, 0.766, 0.761, 0.744, 0.785,
              0.782, 0.773, 0.778, 0.802, 0.768, 0.367, 0.702, 0.725, 0.777, 0.788, 0.779, 0.781]
#: FedCSPACK `code` on pathological FMNIST (rounds 61-100): swings of 10-25 points that recover
CODE_PAT = [0.699, 0.702, 0.748, 0.765, 0.515, 0.72, 0.756, 0.746, 0.713, 0.712, 0.742, 0.582, 0.691, 0.747,
            0.769, 0.723, 0.662, 0.691, 0.622, 0.737, 0.652, 0.574, 0.734, 0.69, 0.643, 0.667, 0.734, 0.699,
            0.682, 0.672, 0.743, 0.662, 0.65, 0.667, 0.705, 0.767, 0.734, 0.771, 0.74, 0.71]


def _feed(watch: DecayWatch, values: list[float], first: int = 1) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, v in enumerate(values):
            watch.check({"round": first + i, watch.main: v})
    return [str(w.message) for w in caught if issubclass(w.category, LowbandWarning)]


def test_the_spark_collapse_is_warned_once() -> None:
    said = _feed(DecayWatch("consensus/acc"), SPARK_A01)
    assert len(said) == 1
    # rounds 20-26 have the median 64.90%, 12.6 points under rounds 10-16's 77.48%
    assert said[0].startswith("round 26: consensus/acc has fallen") and "64.90%" in said[0]
    assert "77.48%, to round 16" in said[0] and "77.76% at round 13" in said[0]


def test_outliers_swings_losses_and_nan_are_not_warned() -> None:
    assert _feed(DecayWatch("personal/acc_weighted"), MOON_DIR06) == []
    assert _feed(DecayWatch("personal/acc_weighted"), CODE_PAT, first=61) == []
    assert _feed(DecayWatch("consensus/loss"), [1 - v for v in SPARK_A01]) == []  # not an accuracy
    assert _feed(DecayWatch("global/acc"), [0.8] * 7 + [float("nan")] * 7) == []  # NaN is skipped
    assert _feed(DecayWatch("global/acc"), [0.8] * 7 + [0.5] * 3) == []  # 3 of 7 under: the median holds


def test_round0_is_left_out_and_a_resumed_run_does_not_repeat_itself() -> None:
    w = DecayWatch("consensus/acc")
    assert w.check({"round": 0, "consensus/acc": 0.9}) is None and w.peak is None
    for i, v in enumerate(SPARK_A01[:26]):  # the first run warned at round 26
        w.check({"round": 1 + i, "consensus/acc": v}, quiet=True)
    assert w.warned
    assert _feed(w, SPARK_A01[26:], first=27) == []


def test_a_run_that_unlearns_warns_and_a_learning_one_does_not(tmp_path: Path, monkeypatch) -> None:
    orig = Simulation._evaluate

    def unlearning(self, r, plan):  # the real metrics, then the main accuracy forced down from round 8
        rec = orig(self, r, plan)
        if r >= 8:
            rec[self.main_metric] = 0.0
        return rec

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Simulation(validate(digits_config(tmp_path / "ok", rounds=14))).run()
    assert not [w for w in caught if "unlearning" in str(w.message)]
    monkeypatch.setattr(simulator.Simulation, "_evaluate", unlearning)
    with pytest.warns(LowbandWarning, match=r"round 11: personal/acc_weighted has fallen"):  # 4 of 7 forced
        Simulation(validate(digits_config(tmp_path / "bad", rounds=14))).run()
