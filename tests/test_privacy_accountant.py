"""The accountant against closed forms: the Gaussian mechanism's exact epsilon (Balle and
Wang 2018, Theorem 8) and the RDP of the Poisson-subsampled Gaussian at integer orders
(Mironov, Talwar and Zhang 2019, Section 3.3); and the target-epsilon refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import gammaln
from scipy.stats import norm

pytest.importorskip("dp_accounting")

from lowband.privacy.accountant import (  # noqa: E402
    EpsilonTrack,
    PrivacyBudgetError,
    SampledGaussian,
    epsilon_schedule,
    final_epsilon,
    pld_grid,
)


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact epsilon of the Gaussian mechanism with sensitivity 1 and std sigma:
    delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)."""
    def gap(eps: float) -> float:
        return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma) - delta
    return brentq(gap, 0.0, 500.0, xtol=1e-12)


@pytest.mark.parametrize("z,rounds", [(1.0, 1), (2.0, 1), (4.0, 16), (8.0, 100)])
def test_full_participation_matches_the_analytic_gaussian(z: float, rounds: int) -> None:
    # T Gaussian releases of multiplier z compose to one of multiplier z / sqrt(T) (exactly)
    exact = analytic_gaussian_epsilon(z / math.sqrt(rounds), 1e-5)
    mech = SampledGaussian(z, population=50, cohort=50, sampling="all")
    pld = final_epsilon(mech, rounds, 1e-5, "pld")
    rdp = final_epsilon(mech, rounds, 1e-5, "rdp")
    assert pld == pytest.approx(exact, rel=0.01)
    assert exact <= rdp <= 1.25 * exact  # RDP is an upper bound, and not a loose one here


def mironov_rdp(q: float, sigma: float, alpha: int) -> float:
    """RDP at integer order alpha of the Poisson-subsampled Gaussian (add/remove one):
    log(sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2-k)/(2 sigma^2))) / (alpha-1)."""
    k = np.arange(alpha + 1)
    logs = (gammaln(alpha + 1) - gammaln(k + 1) - gammaln(alpha - k + 1) + (alpha - k) * math.log1p(-q)
            + k * math.log(q) + (k * k - k) / (2 * sigma**2))
    m = logs.max()
    return float((m + math.log(np.exp(logs - m).sum())) / (alpha - 1))


def test_poisson_round_is_the_subsampled_gaussian_of_mironov_et_al() -> None:
    from dp_accounting import rdp

    q, z, rounds = 0.1, 1.1, 30
    mech = SampledGaussian(z, population=1000, cohort=100, sampling="poisson")
    orders = [2, 3, 4, 8, 16, 32]
    acc = rdp.RdpAccountant(orders=orders, neighboring_relation=mech.neighbouring())
    acc.compose(mech.round_event(), rounds)
    want = [rounds * mironov_rdp(q, z, a) for a in orders]
    np.testing.assert_allclose(acc.rdp, want, rtol=1e-9)


def test_schedule_is_per_round_cumulative_and_ends_at_the_final_epsilon() -> None:
    mech = SampledGaussian(1.0, population=100, cohort=10, sampling="poisson")
    eps = epsilon_schedule(mech, 40, 1e-5, "rdp")
    assert len(eps) == 40 and all(b >= a for a, b in zip(eps, eps[1:]))
    assert eps[-1] == pytest.approx(final_epsilon(mech, 40, 1e-5, "rdp"), rel=1e-12)
    assert eps[9] == pytest.approx(final_epsilon(mech, 10, 1e-5, "rdp"), rel=1e-12)


@pytest.mark.slow  # a PLD per round of the schedule (about 9 s)
def test_pld_schedule_is_exact_on_its_grid_and_an_upper_bound_between() -> None:
    mech = SampledGaussian(1.0, population=100, cohort=10, sampling="poisson")
    eps = epsilon_schedule(mech, 30, 1e-5, "pld")
    grid = pld_grid(30)
    assert grid[:10] == list(range(1, 11)) and grid[-1] == 30
    for r in (5, 30):
        assert eps[r - 1] == pytest.approx(final_epsilon(mech, r, 1e-5, "pld"), rel=1e-9)
    off = next(r for r in range(11, 30) if r not in grid)
    assert eps[off - 1] >= final_epsilon(mech, off, 1e-5, "pld")
    # PLD is tighter than RDP for the same schedule
    assert eps[-1] < final_epsilon(mech, 30, 1e-5, "rdp")


def test_sampling_amplifies_and_fixed_size_is_accounted_with_replace_one() -> None:
    full = final_epsilon(SampledGaussian(1.0, 100, 100, "all"), 10, 1e-5)
    poisson = final_epsilon(SampledGaussian(1.0, 100, 10, "poisson"), 10, 1e-5)
    fixed = final_epsilon(SampledGaussian(1.0, 100, 10, "fixed"), 10, 1e-5)
    assert poisson < full
    # replace-one doubles the sum's sensitivity: fixed-size at z costs more than Poisson at z
    assert poisson < fixed
    with pytest.raises(ValueError, match="pld.*fixed-size"):
        final_epsilon(SampledGaussian(1.0, 100, 10, "fixed"), 10, 1e-5, "pld")


def test_target_epsilon_refuses_the_run_upfront_and_says_the_fix() -> None:
    mech = SampledGaussian(0.8, population=100, cohort=10, sampling="poisson")
    with pytest.raises(PrivacyBudgetError) as e:
        EpsilonTrack.plan(mech, 200, 1e-5, "rdp", target_epsilon=4.0)
    line = str(e.value)
    assert "\n" not in line and "dp.target_epsilon = 4" in line and "dp.noise_multiplier >=" in line
    z = float(line.rsplit(">=", 1)[1])
    # the suggested multiplier really fits, and is not far above what is needed
    assert final_epsilon(SampledGaussian(z, 100, 10, "poisson"), 200, 1e-5) <= 4.0
    assert final_epsilon(SampledGaussian(z * 0.98, 100, 10, "poisson"), 200, 1e-5) > 4.0
    first = int(line.split("over the target from round ")[1].split(";")[0])
    ok = EpsilonTrack.plan(mech, first - 1, 1e-5, "rdp", target_epsilon=4.0)
    assert ok.epsilon(first - 1) <= 4.0


def test_track_gives_the_observer_its_keys() -> None:
    mech = SampledGaussian(1.0, population=100, cohort=10, sampling="poisson")
    track = EpsilonTrack.plan(mech, 5, 1e-5, "rdp", target_epsilon=50.0)
    assert track.metrics(0) == {"dp/epsilon": 0.0, "dp/delta": 1e-5}
    assert track.metrics(3)["dp/epsilon"] == track.epsilons[2] > 0
    s = track.summary()
    assert s["dp/epsilon"] == track.epsilons[-1] and s["dp/target_epsilon"] == 50.0 and s["dp/accountant"] == "rdp"
    with pytest.raises(ValueError, match="past the 5 rounds"):
        track.metrics(6)
