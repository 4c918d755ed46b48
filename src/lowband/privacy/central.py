"""Central differential privacy: DP-FedAvg as an aggregation rule.

User-level DP-FedAvg (McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018), with the fixed-denominator estimator: the server
clips each client's update (model minus the round's reference model) to L2 norm ``S``,
sums, adds Gaussian noise of std ``z * S`` to every coordinate and divides by the
*expected* cohort size ``m`` (the configured clients per round under fixed-size
sampling, ``q * N`` under Poisson), not by the number of replies, so that a dropped or
added client changes the output only through its bounded contribution. Clients are
weighted uniformly (``w_k = 1``): weighting by example counts would raise the
sensitivity and needs each count (the paper's ``min(n_k / w_hat, 1)`` with a public
``w_hat`` is not implemented).

Adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private
Learning with Adaptive Clipping", NeurIPS 2021): each client also contributes the bit
``b_k = [||Delta_k|| <= S]``; the server sums the bits, adds Gaussian noise of std
``sigma_b`` and moves the clip geometrically towards the ``gamma`` quantile of the norms:
``S <- S * exp(-eta_C * (b_tilde - gamma))`` with ``b_tilde = noisy bit sum / m``. The
paper's defaults: ``gamma = 0.5``, ``eta_C = 0.2``, ``S_0 = 0.1``, ``sigma_b = m / 20``.
The bits are a second Gaussian release; the update's noise multiplier becomes
``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` so that both together cost what one release
of multiplier ``z`` costs (Andrew et al., Theorem 1): the accountant is charged ``z``.

The rule's mutable state is the current clip (adaptive clipping); :meth:`state_dict` /
:meth:`load_state_dict` checkpoint it.

Which methods it serves (:func:`central_dp_releases`): a server whose aggregation needs
only the sum of the clients' updates. SCAFFOLD releases two sums a round (its model delta
and its control-variate delta, each through its own rule instance, each clipped and
noised with multiplier ``z``), so its accountant composes two releases a round. Methods
whose server needs each client's update (FedNova's per-client normalisation, robust
rules, personalised packs) are refused with one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch
from torch import Tensor

DEFAULT_TARGET_QUANTILE = 0.5
DEFAULT_CLIP_LR = 0.2
DEFAULT_INITIAL_CLIP = 0.1
DEFAULT_BIT_NOISE_FRACTION = 1 / 20
"""``sigma_b = m / 20`` (Andrew et al. 2021, Section 3)."""


class _Input(Protocol):
    """What the aggregation hook hands a rule (lowband.aggregation.AggregationInput)."""

    updates: Tensor  # [n, d]: each sender's model minus ``reference``, flat
    weights: Tensor  # [n]
    round: int


@dataclass(frozen=True)
class AdaptiveClip:
    """Adaptive clipping by quantile (Andrew et al. 2021); defaults are the paper's."""

    target_quantile: float = DEFAULT_TARGET_QUANTILE
    learning_rate: float = DEFAULT_CLIP_LR
    initial_clip: float = DEFAULT_INITIAL_CLIP
    bit_noise: Optional[float] = None
    """``sigma_b``; None: ``expected_cohort / 20``."""

    def __post_init__(self) -> None:
        if not 0 < self.target_quantile < 1:
            raise ValueError(f"dp.target_quantile must be in (0, 1), got {self.target_quantile}")
        if not self.learning_rate > 0:
            raise ValueError(f"dp.clip_learning_rate must be > 0, got {self.learning_rate}")
        if not self.initial_clip > 0:
            raise ValueError(f"dp.clip must be > 0, got {self.initial_clip}")
        if self.bit_noise is not None and not self.bit_noise > 0:
            raise ValueError(f"dp.bit_noise must be > 0, got {self.bit_noise}")


def as_torch_generator(rng: Any) -> torch.Generator:
    """``rng`` if it is a ``torch.Generator``; a numpy ``Generator`` seeds a new one from its stream."""
    if isinstance(rng, torch.Generator):
        return rng
    if hasattr(rng, "integers"):
        g = torch.Generator()
        g.manual_seed(int(rng.integers(0, 2**63 - 1)))
        return g
    raise TypeError(f"rng must be a torch.Generator or numpy Generator, got {type(rng).__name__}")


def clip_rows(updates: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Each row scaled to L2 norm at most ``clip``: ``x * min(1, clip / ||x||)``; also the norms."""
    norms = updates.norm(dim=1)
    factor = torch.clamp(clip / torch.clamp(norms, min=1e-30), max=1.0)
    return updates * factor[:, None], norms


class DPFedAvg:
    """An aggregation rule (lowband.aggregation's ``Rule``): ``rule(inp, rng) -> (noised mean
    update [d], counters)``; counters are counts (``clipped``, ``senders``), summed per round by
    the hook; the round's clip and noise std are in :attr:`last` (diagnostics, not counts)."""

    name = "dp_fedavg"

    def min_inputs(self) -> int:
        """One reply suffices: the fixed denominator and the noise protect it."""
        return 1

    def __init__(self, clip: Optional[float], noise_multiplier: float, expected_cohort: float,
                 adaptive: Optional[AdaptiveClip] = None) -> None:
        if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"dp.noise_multiplier must be >= 0, got {noise_multiplier}")
        if not expected_cohort > 0:
            raise ValueError(f"expected cohort must be > 0, got {expected_cohort}")
        if adaptive is None and not (clip is not None and clip > 0):
            raise ValueError(f"dp.clip must be > 0 (or set dp.adaptive_clip = true), got {clip}")
        self.z = float(noise_multiplier)
        self.m = float(expected_cohort)
        self.adaptive = adaptive
        self.clip = float(adaptive.initial_clip if adaptive is not None and clip is None else clip)  # type: ignore[arg-type]
        self.bit_noise = 0.0
        self.z_update = self.z
        if adaptive is not None:
            self.bit_noise = adaptive.bit_noise if adaptive.bit_noise is not None else self.m * DEFAULT_BIT_NOISE_FRACTION
            if self.z > 0:
                if 2 * self.bit_noise <= self.z:
                    raise ValueError(f"adaptive clipping: the bit noise sigma_b = {self.bit_noise:g} must exceed "
                                     f"z / 2 = {self.z / 2:g} (Andrew et al. 2021): raise dp.bit_noise or the cohort")
                self.z_update = (self.z ** -2 - (2 * self.bit_noise) ** -2) ** -0.5

    def __call__(self, inp: _Input, rng: Any) -> tuple[Tensor, dict[str, float]]:
        gen = as_torch_generator(rng)
        u = inp.updates.detach().to(torch.float32)
        if u.dim() != 2:
            raise ValueError(f"DP-FedAvg: updates must be [n, d], got shape {tuple(u.shape)}")
        clip = self.clip
        clipped, norms = clip_rows(u, clip)
        noise = torch.randn(u.shape[1], generator=gen, dtype=torch.float32) * (self.z_update * clip)
        support = getattr(inp, "support", None)
        if support is not None:  # a public, data-independent support (sharedmask): noise there only
            noise = noise * support.to(noise.dtype)
        out = (clipped.sum(0) + noise) / self.m
        counters: dict[str, float] = {"clipped": float((norms > clip).sum()), "senders": float(u.shape[0])}
        self.last: dict[str, float] = {"clip": clip, "noise_std": self.z_update * clip,
                                       "clipped_fraction": float((norms > clip).float().mean()) if len(norms) else 0.0}
        if self.adaptive is not None:
            bits = float((norms <= clip).sum())
            noisy = bits + float(torch.randn((), generator=gen)) * self.bit_noise
            frac = noisy / self.m
            self.clip = clip * math.exp(-self.adaptive.learning_rate * (frac - self.adaptive.target_quantile))
            self.last["unclipped_fraction_noisy"] = frac
        return out, counters

    def state_dict(self) -> dict[str, float]:
        """The rule's state (the current clip) for a checkpoint."""
        return {"clip": self.clip}

    def load_state_dict(self, sd: dict[str, float]) -> None:
        self.clip = float(sd["clip"])


#: server methods whose aggregation needs only the sum of the clients' updates -> Gaussian
#: releases per round under central DP
CENTRAL_DP_RELEASES: dict[str, int] = {"fedavg": 1, "fedprox": 1, "moon": 1, "fedntd": 1, "scaffold": 2}

#: why central DP refuses a method (one line each); methods not listed: the generic reason
CENTRAL_DP_REFUSED: dict[str, str] = {
    "fednova": "its server normalises each client's update by that client's local step count, which needs the "
               "individual updates (and counts)",
    "fedcspack": "its server needs each client's pack (per-client index sets and shapes)",
    "kta": "its server needs each client's predictions, not a clipped sum of model updates",
    "fedmd": "its server needs each client's predictions, not a clipped sum of model updates",
}


def central_dp_releases(algorithm: str, family: str = "server") -> int:
    """Gaussian releases per round of ``algorithm`` under central DP; ValueError (one line) when refused."""
    if algorithm in CENTRAL_DP_RELEASES:
        return CENTRAL_DP_RELEASES[algorithm]
    if family != "server":
        why = f"a {family} method has no server that aggregates"
    else:
        why = CENTRAL_DP_REFUSED.get(algorithm, "its server needs individual updates (not only their sum)")
    raise ValueError(f"dp.mechanism = \"central\" cannot serve algorithm {algorithm!r}: {why}; use dp.mechanism = "
                     f"\"local\" (clip and noise on every sender) or one of {sorted(CENTRAL_DP_RELEASES)}")
