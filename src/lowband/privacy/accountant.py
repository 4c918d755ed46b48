"""Privacy accounting with dp-accounting (Google's ``dp_accounting``): RDP and PLD.

A DP-FedAvg round is one Gaussian release of the clipped sum of the sampled clients'
updates (user-level DP, McMahan et al. 2018), amplified by the sampling the run really
uses. This module turns a run's schedule into the epsilon it spends, round by round,
*before* the run starts, so that ``dp.target_epsilon`` refuses a run that would exceed it
instead of stopping it halfway (the whole schedule is known upfront: rounds, cohort,
noise multiplier).

Sampling events (``dp_accounting.dp_event``):

- ``"poisson"``: each client takes part independently with probability ``q = m / N``
  (``PoissonSampledDpEvent``), add-or-remove-one neighbours; RDP and PLD.
- ``"fixed"``: exactly ``m`` of ``N`` clients, uniformly without replacement (what
  ``topology.sampling = "fraction"/"count"`` does): ``SampledWithoutReplacementDpEvent``
  (Wang, Balle and Kasiviswanathan 2019, Theorem 27), which dp-accounting models under the
  *replace-one* relation only, and with RDP only (its PLD accountant refuses the event: we
  refuse ``accountant = "pld"`` with ``"fixed"`` in one line). Under replace-one the sum of
  clipped updates moves by up to ``2 S``, so the Gaussian's multiplier relative to that
  sensitivity is ``z / 2`` (sound; the factor is written here because it is easy to miss).
- ``"all"``: every client every round: a plain Gaussian release per round.

``releases_per_round`` composes several releases per round (SCAFFOLD releases its model
delta and its control-variate delta, each clipped to S and noised with multiplier z).

:class:`EpsilonTrack` is what a run's observer reads: ``track.metrics(round)`` gives the
``dp/epsilon`` and ``dp/delta`` keys of that round's metrics record and
``track.summary()`` the ones for summary.json.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

Sampling = Literal["poisson", "fixed", "all"]
Method = Literal["rdp", "pld"]
SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "all")
METHODS: tuple[str, ...] = ("rdp", "pld")
PLD_DISCRETIZATION = 1e-4
"""Value discretisation interval of the PLD accountant (dp-accounting's default)."""


class PrivacyBudgetError(ValueError):
    """A run's schedule would spend more than ``dp.target_epsilon`` (one line: what and how to fix)."""


@contextlib.contextmanager
def _quiet():
    """dp-accounting logs (absl) a warning for each RDP order it drops as non-convergent;
    the order is simply left out of the minimum, so the warnings are noise in a run's log."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _dpa():
    """dp_accounting, imported on use: it is an optional extra (``pip install lowband[privacy]``)."""
    try:
        import dp_accounting
        from dp_accounting import pld, rdp  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("differential privacy needs dp-accounting: pip install 'lowband[privacy]' "
                          "(or pip install dp-accounting)") from e
    return dp_accounting


@dataclass(frozen=True)
class SampledGaussian:
    """The per-round mechanism of a DP-FedAvg run.

    ``noise_multiplier`` z: the noise std on the sum divided by the clip norm S.
    ``population`` N: clients that may be sampled; ``cohort`` m: clients per round
    (expected, for Poisson). ``releases_per_round``: Gaussian releases composed per round."""

    noise_multiplier: float
    population: int
    cohort: float
    sampling: Sampling = "fixed"
    releases_per_round: int = 1

    def __post_init__(self) -> None:
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"dp.noise_multiplier must be a positive number, got {self.noise_multiplier}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"dp sampling must be one of {list(SAMPLINGS)}, got {self.sampling!r}")
        if not (1 <= self.cohort <= self.population):
            raise ValueError(f"dp: cohort {self.cohort} must be between 1 and the population {self.population}")
        if self.releases_per_round < 1:
            raise ValueError(f"dp: releases_per_round must be >= 1, got {self.releases_per_round}")

    @property
    def q(self) -> float:
        """Sampling rate m / N."""
        return self.cohort / self.population

    def neighbouring(self):
        """dp-accounting's neighbouring relation for this sampling (replace-one for fixed size)."""
        rel = _dpa().NeighboringRelation
        return rel.REPLACE_ONE if self.sampling == "fixed" else rel.ADD_OR_REMOVE_ONE

    def round_event(self):
        """The ``DpEvent`` of one round."""
        dpa = _dpa()
        if self.sampling == "fixed":
            # replace-one: the clipped sum moves by up to 2S, so std z*S is z/2 sensitivities
            gauss = dpa.GaussianDpEvent(self.noise_multiplier / 2)
            one = dpa.SampledWithoutReplacementDpEvent(self.population, self.cohort, gauss)
        elif self.sampling == "poisson" and self.cohort < self.population:
            one = dpa.PoissonSampledDpEvent(self.q, dpa.GaussianDpEvent(self.noise_multiplier))
        else:
            one = dpa.GaussianDpEvent(self.noise_multiplier)
        return one if self.releases_per_round == 1 else dpa.SelfComposedDpEvent(one, self.releases_per_round)


def _accountant(mech: SampledGaussian, method: Method):
    dpa = _dpa()
    if method == "rdp":
        return dpa.rdp.RdpAccountant(neighboring_relation=mech.neighbouring())
    if method == "pld":
        if mech.sampling == "fixed" and mech.cohort < mech.population:
            raise ValueError("dp.accountant = \"pld\" cannot account fixed-size sampling without replacement "
                             "(dp-accounting models it with RDP only): set dp.accountant = \"rdp\" or sample "
                             "clients by Poisson")
        return dpa.pld.PLDAccountant(neighboring_relation=mech.neighbouring(),
                                     value_discretization_interval=PLD_DISCRETIZATION)
    raise ValueError(f"dp.accountant must be one of {list(METHODS)}, got {method!r}")


def epsilon_schedule(mech: SampledGaussian, rounds: int, delta: float, method: Method = "rdp") -> list[float]:
    """Epsilon at ``delta`` after each round 1..``rounds`` (cumulative, non-decreasing)."""
    if not (0 < delta < 1):
        raise ValueError(f"dp.delta must be in (0, 1), got {delta}")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if method == "rdp":
        # RDP composes by adding: one round's curve, scaled by r, converted per round
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        acc = _accountant(mech, "rdp")
        with _quiet():
            acc.compose(mech.round_event())
        one = np.asarray(acc.rdp, dtype=np.float64)
        orders = np.asarray(acc.orders, dtype=np.float64)
        return [float(compute_epsilon(orders, r * one, delta)[0]) for r in range(1, rounds + 1)]
    # PLD: composing round by round costs ~0.5 s a round; compute the exact epsilon at a
    # grid of rounds (every round up to 10, then ~12 per decade, and the last) and report
    # round r the value at the first grid round >= r: an upper bound (epsilon grows with
    # r), exact at the grid rounds and at the end
    grid = pld_grid(rounds)
    at = {r: final_epsilon(mech, r, delta, method) for r in grid}
    out: list[float] = []
    gi = 0
    for r in range(1, rounds + 1):
        while grid[gi] < r:
            gi += 1
        out.append(at[grid[gi]])
    return out


def pld_grid(rounds: int) -> list[int]:
    """Rounds at which the PLD schedule is computed exactly (see :func:`epsilon_schedule`)."""
    if rounds <= 0:
        return []
    pts = set(range(1, min(rounds, 10) + 1)) | {rounds}
    r = 10.0
    while r < rounds:
        r *= 10 ** (1 / 12)
        pts.add(min(rounds, int(math.ceil(r))))
    return sorted(pts)


def final_epsilon(mech: SampledGaussian, rounds: int, delta: float, method: Method = "rdp") -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds (one composition, not the whole schedule)."""
    if rounds == 0:
        return 0.0
    dpa = _dpa()
    acc = _accountant(mech, method)
    with _quiet():
        acc.compose(dpa.SelfComposedDpEvent(mech.round_event(), rounds))
        return float(acc.get_epsilon(delta))


def noise_for_target(mech: SampledGaussian, rounds: int, delta: float, target_epsilon: float,
                     method: Method = "rdp") -> float:
    """The smallest noise multiplier (to 3 significant digits, rounded up) whose ``rounds``
    rounds stay within ``target_epsilon``: the fix a refusal suggests."""
    def eps(z: float) -> float:
        return final_epsilon(SampledGaussian(z, mech.population, mech.cohort, mech.sampling,
                                             mech.releases_per_round), rounds, delta, method)
    lo, hi = 1e-3, max(mech.noise_multiplier, 1.0)
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return math.inf
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if eps(mid) > target_epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0005:
            break
    digits = 3 - int(math.floor(math.log10(hi))) - 1
    return math.ceil(hi * 10**digits) / 10**digits


def check_target(epsilons: list[float], target_epsilon: Optional[float], mech: SampledGaussian, delta: float,
                 method: Method = "rdp") -> None:
    """Raise :class:`PrivacyBudgetError` (one line) when the schedule ends above ``target_epsilon``."""
    if target_epsilon is None or not epsilons or epsilons[-1] <= target_epsilon:
        return
    first = next(r for r, e in enumerate(epsilons, 1) if e > target_epsilon)
    z = noise_for_target(mech, len(epsilons), delta, target_epsilon, method)
    raise PrivacyBudgetError(
        f"dp.target_epsilon = {target_epsilon:g} would be exceeded: {len(epsilons)} rounds at noise multiplier "
        f"{mech.noise_multiplier:g} ({mech.cohort} of {mech.population} clients a round, {mech.sampling} sampling, "
        f"{method}) reach epsilon {epsilons[-1]:.3g} at delta {delta:g}, over the target from round {first}; "
        f"run at most {first - 1} rounds or set dp.noise_multiplier >= {z:g}")


@dataclass(frozen=True)
class EpsilonTrack:
    """The epsilon a run spends, per round, computed before it starts.

    A run's observer calls :meth:`metrics` at the end of each round (its keys join that
    round's metrics.jsonl record) and :meth:`summary` at the end (keys of summary.json)."""

    epsilons: tuple[float, ...]
    delta: float
    method: str
    target_epsilon: Optional[float] = None

    @classmethod
    def plan(cls, mech: SampledGaussian, rounds: int, delta: float, method: Method = "rdp",
             target_epsilon: Optional[float] = None) -> "EpsilonTrack":
        """The whole schedule's epsilons; refuses (:class:`PrivacyBudgetError`) a run over its target."""
        eps = epsilon_schedule(mech, rounds, delta, method)
        check_target(eps, target_epsilon, mech, delta, method)
        return cls(tuple(eps), float(delta), method, target_epsilon)

    def epsilon(self, round: int) -> float:
        """Cumulative epsilon after ``round`` (0 before the first round)."""
        if round <= 0:
            return 0.0
        if round > len(self.epsilons):
            raise ValueError(f"round {round} is past the {len(self.epsilons)} rounds the budget was planned for")
        return self.epsilons[round - 1]

    def metrics(self, round: int) -> dict[str, float]:
        """Keys for round ``round``'s metrics record."""
        return {"dp/epsilon": self.epsilon(round), "dp/delta": self.delta}

    def summary(self) -> dict[str, object]:
        """Keys for summary.json."""
        out: dict[str, object] = {"dp/epsilon": self.epsilon(len(self.epsilons)), "dp/delta": self.delta,
                                  "dp/accountant": self.method}
        if self.target_epsilon is not None:
            out["dp/target_epsilon"] = self.target_epsilon
        return out
