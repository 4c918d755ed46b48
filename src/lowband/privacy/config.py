"""The ``[dp]`` and ``[secagg]`` sections of an experiment, and the checks that refuse,
before a run starts, a combination that cannot be served (one line each).

The section models live in the schema (:mod:`lowband.config.schema`, which imports nothing
of lowband) and are re-exported here. :func:`check_privacy` is the pure check of a
combination; :func:`check_experiment_privacy` reads it off a validated experiment (the
resolver calls it, so every front door refuses before anything is written) and raises
:class:`PrivacyRefused`, a :class:`~lowband.config.schema.ConfigError` that ``lowband
frontier`` reports as a *refused* cell.
"""

from __future__ import annotations

from typing import Any, Optional

from lowband.config.schema import ConfigError, DPConfig, Experiment, SecAggConfig

__all__ = ["DPConfig", "SecAggConfig", "PrivacyRefused", "SECAGG_UPLINK_CODECS", "check_privacy",
           "check_experiment_privacy", "run_sampling", "uplink_codecs", "robust_rule"]


class PrivacyRefused(ConfigError):
    """A privacy setting the run cannot serve (one line: what and how to fix)."""


#: uplink codecs SecAgg accepts besides ``sharedmask(frac)``: the upload travels as the masked
#: field vector (the field quantisation, ``secagg.levels_bits``, is its codec). ``sharedmask``
#: keeps the round's shared coordinates, so the masked vector carries only those
#: (lowband.privacy.sparsify); lowband's top-k, random masks and sketches draw their
#: coordinates per sender and are refused.
SECAGG_UPLINK_CODECS = ("fp32",)


def check_privacy(dp: Optional[DPConfig], secagg: Optional[SecAggConfig], *, algorithm: str, family: str,
                  uplink_codecs: tuple[str, ...] = (), sampling: str = "fixed",
                  norm_screen: bool = False, robust_rule: Optional[str] = None) -> None:
    """Raise ValueError (one line) for a combination that cannot be served (docs/privacy.md)."""
    from .central import central_dp_releases
    from .secagg_steps import check_secagg

    dp = dp or DPConfig()
    secagg = secagg or SecAggConfig()

    if dp.mechanism == "central":
        central_dp_releases(algorithm, family)
        if dp.accountant == "pld" and sampling == "fixed":
            raise ValueError("dp.accountant = \"pld\" cannot account fixed-size sampling without replacement: set "
                             "dp.accountant = \"rdp\"")
        if sampling == "list":
            raise ValueError("dp.mechanism = \"central\" needs random client sampling to account it: "
                             "topology.sampling = \"list\" replays a fixed schedule; use \"count\", \"fraction\" "
                             "or \"all\"")
        if robust_rule is not None:
            raise ValueError(f"dp.mechanism = \"central\" and aggregation rule {robust_rule!r} are both aggregation "
                             f"rules: choose one")
    if dp.mechanism == "distributed" and sampling == "poisson":
        raise ValueError("dp.mechanism = \"distributed\" splits the Skellam noise over a known cohort, but "
                         "topology.sampling = \"poisson\" draws a random one (fewer clients would add less noise "
                         "than accounted): use topology.sampling = \"count\" or \"fraction\"")
    if dp.mechanism == "distributed" and not secagg.enabled:
        raise ValueError("dp.mechanism = \"distributed\" adds noise inside secure aggregation: set "
                         "secagg.enabled = true")
    if secagg.enabled:
        check_secagg(algorithm, family)
        if norm_screen:
            raise ValueError("secagg.enabled = true hides individual updates: the norm screen "
                             "(comm.norm_factor) cannot see them; set comm.norm_factor = 0 or drop secagg")
        if robust_rule is not None:
            raise ValueError(f"secagg.enabled = true hides individual updates: aggregation rule {robust_rule!r} "
                             f"needs them; drop one")
        if dp.mechanism == "central":
            raise ValueError("secagg.enabled = true hides individual updates from the server, which central DP "
                             "must clip: use dp.mechanism = \"distributed\" (or \"local\")")
        for spec in uplink_codecs:
            if spec not in SECAGG_UPLINK_CODECS and not _summable(spec):
                raise ValueError(f"secagg.enabled = true sums masked vectors position by position, so uplink codec "
                                 f"{spec!r} cannot be carried (top-k's client-chosen indices, qsgd's and int8's "
                                 f"per-client scales, per-client random masks and error feedback are not summable); "
                                 f"use fp32 or the round-shared sparsifier sharedmask(frac)")


def _summable(spec: str) -> bool:
    """``sharedmask(frac)`` alone: SecAgg carries its round-shared coordinates (lowband.privacy.sparsify)."""
    from .sparsify import shared_fraction

    try:
        return shared_fraction(spec) is not None and spec.startswith("sharedmask(")
    except ValueError:
        return False


def secagg_sparse_fraction(exp: Experiment) -> Optional[float]:
    """The ``frac`` of a ``sharedmask(frac)`` uplink codec (the link's), else None."""
    from .sparsify import shared_fraction

    try:
        return shared_fraction(exp.comm.by_direction.get("up", exp.comm.codec))
    except ValueError:
        return None


def run_sampling(exp: Experiment) -> str:
    """The sampling event of a server run's cohort: ``"fixed"`` (``topology.sampling`` =
    ``"count"``/``"fraction"``: a fixed-size cohort without replacement), ``"poisson"``
    (each client independently with probability ``topology.fraction``), ``"all"`` or ``"list"``."""
    s = exp.topology.sampling
    return "fixed" if s in ("count", "fraction") else s


def uplink_codecs(exp: Experiment) -> tuple[str, ...]:
    """The codec specs an upload can travel under: the uplink's (``comm.by_direction.up``,
    else ``comm.codec``) and every ``comm.by_kind`` one (a kind's codec wins over the link's)."""
    up = exp.comm.by_direction.get("up", exp.comm.codec)
    return (up, *[v for k, v in sorted(exp.comm.by_kind.items())])


def robust_rule(exp: Experiment) -> Optional[str]:
    """The configured robust aggregation rule (``[aggregation] rule``), if the schema has the
    section and a rule other than the plain mean is set."""
    rule = getattr(getattr(exp, "aggregation", None), "rule", None)
    return None if rule in (None, "mean") else str(rule)


def check_experiment_privacy(exp: Experiment, family: str) -> None:
    """:func:`check_privacy` of a validated experiment; :class:`PrivacyRefused` (one line).

    The norm screen counts as needing individual updates only when ``comm.norm_factor`` is
    set in the config: the default screen compares same-kind messages, and under SecAgg
    those are masked field vectors whose norms say nothing (it never rejects them)."""
    if exp.dp is None and exp.secagg is None:
        return
    screen = "norm_factor" in exp.comm.model_fields_set and bool(exp.comm.norm_factor)
    try:
        check_privacy(exp.dp, exp.secagg, algorithm=exp.algorithm.name, family=family,
                      uplink_codecs=uplink_codecs(exp), sampling=run_sampling(exp), norm_screen=screen,
                      robust_rule=robust_rule(exp))
        _check_distributed_modulus(exp)
        _check_wiring(exp, family)
    except ConfigError:
        raise
    except ValueError as e:
        raise PrivacyRefused(str(e).splitlines()[0]) from None


def _check_distributed_modulus(exp: Any) -> None:
    dp, sa = exp.dp, exp.secagg
    if dp is None or dp.mechanism != "distributed" or sa is None:
        return
    if "modulus_bits" in sa.model_fields_set and sa.modulus_bits != dp.bits:
        raise ValueError(f"dp.mechanism = \"distributed\": the noise and the sum live in one ring of dp.bits = "
                         f"{dp.bits} bits, but secagg.modulus_bits = {sa.modulus_bits}; set one of them to the "
                         f"other (or leave secagg.modulus_bits out)")


def _check_wiring(exp: Any, family: str) -> None:
    """What the run's build (:mod:`lowband.privacy.build`) cannot wire yet."""
    from .central import central_dp_releases

    dp = exp.dp
    if dp is not None and dp.mechanism == "central" and central_dp_releases(exp.algorithm.name, family) > 1:
        name = exp.algorithm.name
        if dp.adaptive_clip:
            raise ValueError(f"dp.adaptive_clip with {name!r}: its two releases a round (model and control-variate "
                             f"deltas) share one fixed clip; set dp.clip and dp.adaptive_clip = false")
        if run_sampling(exp) == "poisson":
            raise ValueError(f"dp.mechanism = \"central\" with {name!r}: its server scales the control-variate "
                             f"sum by the number of replies, which Poisson sampling makes private; use "
                             f"topology.sampling = \"count\" or \"fraction\"")
    if dp is not None and dp.mechanism == "local":
        if dp.target_epsilon is not None:
            raise ValueError("dp.target_epsilon is planned before the run for central and distributed DP; local DP's "
                             "epsilon depends on the messages each node really sends (metrics: dp/local_epsilon): "
                             "leave dp.target_epsilon out")
        if exp.secagg is not None and exp.secagg.enabled:
            raise ValueError("dp.mechanism = \"local\" noises float messages, but under secagg.enabled = true the "
                             "update travels as a masked integer vector the transform never sees: use "
                             "dp.mechanism = \"distributed\"")
