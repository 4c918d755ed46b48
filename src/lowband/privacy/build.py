"""The privacy of a run, built from its ``[dp]`` and ``[secagg]`` sections: one named step of
the driver's construction (:meth:`lowband.engine.simulator.Simulation._privacy`), never a
branch in the round loop.

:func:`build_privacy` returns a :class:`PrivacySetup`:

- ``algorithm``: the algorithm class, wrapped as configured: central DP
  (:func:`~lowband.privacy.central_steps.with_central_dp`, DP-FedAvg at the server) or
  secure aggregation (:func:`~lowband.privacy.secagg_steps.with_secagg`, with the Skellam
  mechanism inside it for distributed DP);
- ``transform``: the sender-side transform of local DP (``clip(S)+gauss(z)``, before the
  codec: :class:`~lowband.comm.network.CodecConfig`'s ``transform``), or ``""``;
- ``track``: the epsilon of every round of central and distributed DP, planned before the
  run starts (``dp.target_epsilon`` refuses a run whose schedule would exceed it:
  :class:`~lowband.privacy.config.PrivacyRefused`, exit 2, nothing written);
- ``local``: the local-DP track, fed by the releases each round's ledger shows.

The run's :class:`~lowband.engine.observers.privacy.Privacy` observer writes the tracks into
metrics.jsonl and summary.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from lowband.config.schema import DPConfig, Experiment, SecAggConfig

from .accountant import EpsilonTrack, PrivacyBudgetError, SampledGaussian
from .config import PrivacyRefused, run_sampling, secagg_sparse_fraction


@dataclass
class PrivacySetup:
    """What a run's privacy changes (module docstring)."""

    algorithm: type
    transform: str = ""
    track: Optional[EpsilonTrack] = None
    local: Any = None  # LocalDPTrack
    mechanism: str = "none"
    secagg: bool = False

    @property
    def active(self) -> bool:
        return self.mechanism != "none" or self.secagg


def local_transform(dp: DPConfig) -> str:
    """The sender-side transform spec of local DP: ``clip(S)+gauss(z)``."""
    return f"clip({dp.clip!r})+gauss({dp.noise_multiplier!r})"


def central_mechanism(dp: DPConfig, population: int, cohort: float, sampling: str,
                      releases: int = 1) -> SampledGaussian:
    """The per-round Gaussian release(s) of DP-FedAvg under the run's sampling (``cohort``: the
    expected clients a round, ``q * N`` under Poisson; ``releases``: sums released a round)."""
    return SampledGaussian(dp.noise_multiplier, population, cohort, "all" if cohort >= population else sampling,
                           releases)


def plan_central(dp: DPConfig, population: int, cohort: float, sampling: str, rounds: int,
                 releases: int = 1) -> EpsilonTrack:
    """Central DP's epsilon per round; :class:`PrivacyRefused` over ``dp.target_epsilon``."""
    try:
        return EpsilonTrack.plan(central_mechanism(dp, population, cohort, sampling, releases), rounds, dp.delta,
                                 dp.accountant, dp.target_epsilon)
    except PrivacyBudgetError as e:
        raise PrivacyRefused(str(e)) from None


def plan_distributed(dp: DPConfig, cohort: int, dims: int, rounds: int) -> tuple[Any, EpsilonTrack]:
    """The Skellam mechanism and its epsilon per round; :class:`PrivacyRefused` over the target."""
    from .distributed import Skellam, skellam_schedule

    try:
        sk = Skellam(clip=float(dp.clip), noise_multiplier=dp.noise_multiplier, bits=dp.bits, n=cohort, d=dims)
    except ValueError as e:
        raise PrivacyRefused(str(e).splitlines()[0]) from None
    eps = skellam_schedule(sk, rounds, dp.delta)
    target = dp.target_epsilon
    if target is not None and eps and eps[-1] > target:
        first = next(r for r, e in enumerate(eps, 1) if e > target)
        raise PrivacyRefused(
            f"dp.target_epsilon = {target:g} would be exceeded: {rounds} rounds of distributed DP (Skellam, noise "
            f"multiplier {dp.noise_multiplier:g}, {dp.bits} bits, {cohort} clients a round) reach epsilon "
            f"{eps[-1]:.3g} at delta {dp.delta:g}, over the target from round {first}; run at most {first - 1} "
            f"rounds or raise dp.noise_multiplier")
    return sk, EpsilonTrack(tuple(eps), float(dp.delta), "skellam-rdp", target)


def secagg_run(sa: SecAggConfig, skellam: Any = None, sparse: Optional[float] = None) -> Any:
    """The SecAgg settings of a run (distributed DP: the ring is ``dp.bits`` wide; ``sparse``:
    the ``sharedmask`` fraction the masked vector carries)."""
    from .secagg import SecAggParams
    from .secagg_steps import SecAggRun

    bits = skellam.bits if skellam is not None else sa.modulus_bits
    try:
        return SecAggRun(SecAggParams(modulus_bits=bits, degree=sa.degree, threshold=sa.threshold),
                         clip_range=sa.clip_range, levels_bits=sa.levels_bits, skellam=skellam, sparse=sparse)
    except ValueError as e:
        raise PrivacyRefused(str(e).splitlines()[0]) from None


def build_privacy(exp: Experiment, algorithm: type, *, population: int, cohort: float, dims: int,
                  shapes: Optional[list[tuple[int, ...]]] = None) -> PrivacySetup:
    """The run's privacy (module docstring). ``population``: clients that may be sampled,
    ``cohort``: clients a round (expected: ``q * N`` under Poisson sampling), ``dims``: float
    coordinates of the model; ``shapes``: their tensors' shapes (a ``sharedmask`` uplink keeps
    ``ceil(frac * numel)`` of each)."""
    dp, sa = exp.dp, exp.secagg
    mech = dp.mechanism if dp is not None else "none"
    secure = sa is not None and sa.enabled
    out = PrivacySetup(algorithm, mechanism=mech, secagg=secure)
    if mech == "central":
        from .central import AdaptiveClip, DPFedAvg, central_dp_releases
        from .central_steps import with_central_dp, with_central_dp_hook

        assert dp is not None
        releases = central_dp_releases(exp.algorithm.name, getattr(algorithm, "family", "server"))
        out.track = plan_central(dp, population, cohort, run_sampling(exp), exp.rounds, releases)
        if releases > 1:  # SCAFFOLD: model and control-variate deltas, each its own release
            try:
                rules = tuple(DPFedAvg(dp.clip, dp.noise_multiplier, expected_cohort=cohort) for _ in range(releases))
            except ValueError as e:
                raise PrivacyRefused(str(e).splitlines()[0]) from None
            out.algorithm = with_central_dp_hook(algorithm, rules)
            return out
        adaptive = (AdaptiveClip(dp.target_quantile, dp.clip_learning_rate, dp.clip or AdaptiveClip.initial_clip,
                                 dp.bit_noise) if dp.adaptive_clip else None)
        try:
            rule = DPFedAvg(dp.clip, dp.noise_multiplier, expected_cohort=cohort, adaptive=adaptive)
        except ValueError as e:
            raise PrivacyRefused(str(e).splitlines()[0]) from None
        out.algorithm = with_central_dp(algorithm, rule)
    elif mech == "local":
        from .transforms import LocalDPTrack

        assert dp is not None
        out.transform = local_transform(dp)
        out.local = LocalDPTrack(dp.noise_multiplier, dp.delta, dp.accountant)
    skellam = None
    sparse = secagg_sparse_fraction(exp)
    if mech == "central" and sparse is not None:  # noise on the round's public support only
        out.algorithm.dp_support = sparse
    if mech == "distributed":
        from .sparsify import support_size

        assert dp is not None
        skellam, out.track = plan_distributed(dp, int(cohort), dims if sparse is None else
                                              support_size(sparse, shapes or [(dims,)]), exp.rounds)
    if secure:
        from .secagg_steps import with_secagg

        assert sa is not None
        out.algorithm = with_secagg(algorithm, secagg_run(sa, skellam, sparse))
    return out


def build_for_run(exp: Any, algorithm: type, topology: Any, population: int, init: dict) -> Any:
    """:func:`build_privacy` for a run: the cohort is the topology's clients a round (a fixed
    schedule: its largest round; Poisson sampling: the expected ``q * N``, exactly what the
    accountant's sampling rate and DP-FedAvg's fixed denominator need), the dimension the
    model's floating-point entries."""
    cohort: float = int(getattr(topology, "per_round", population))
    if getattr(topology, "sampling", None) == "poisson":
        cohort = float(topology.fraction) * population
        if cohort < 1:
            raise PrivacyRefused(f"topology.fraction = {topology.fraction:g} expects {cohort:.3g} of {population} "
                                 f"clients a round; DP-FedAvg needs at least one expected: raise topology.fraction")
    elif cohort < 1:
        cohort = max(len(s) for s in topology.schedule)
    dims = sum(v.numel() for v in init.values() if v.is_floating_point())
    shapes = [tuple(v.shape) for v in init.values() if v.is_floating_point()]
    return build_privacy(exp, algorithm, population=population, cohort=cohort, dims=dims, shapes=shapes)
