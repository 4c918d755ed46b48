"""Distributed DP: the Skellam mechanism inside secure aggregation (Agarwal, Kairouz and
Liu, "The Skellam Mechanism for Differentially Private Federated Learning", NeurIPS 2021),
with the bits per coordinate as the knob.

Each client, in integers so that secure aggregation's modular sum carries it exactly:

1. clip its update to L2 norm ``c``;
2. rotate it with a randomized Walsh-Hadamard transform (random signs addressed by
   ``(seed, round, "ddp-rotation")``, shared by all clients and the server; the vector is
   zero-padded to ``D = 2**ceil(log2 d)``), which spreads its mass evenly over the
   coordinates so that few bits suffice without wrapping around the modulus;
3. scale by ``gamma`` and round each coordinate randomly to a neighbouring integer,
   conditionally: redrawn until the rounded vector's norm is at most ``Delta_2`` (the
   bound of Kairouz et al. 2021, with ``beta = exp(-1/2)``);
4. add symmetric Skellam noise of variance ``mu / n`` per coordinate (Poisson(mu / 2n) -
   Poisson(mu / 2n)); the sum of ``n`` clients' noise is Skellam of variance ``mu``;
5. reduce mod ``2**bits`` and hand the vector to SecAgg (:mod:`.secagg`), whose masked
   input then weighs ``ceil(D * bits / 8)`` bytes.

The server maps the modular sum to signed integers, divides by ``gamma``, rotates back
and divides by the expected cohort (DP-FedAvg's fixed denominator).

``mu = (z * Delta_2)**2``: ``z`` plays the noise multiplier's part. ``gamma`` is chosen
from the bits: the sum's coordinates, about ``n c gamma / sqrt(D)`` at most for aligned
updates plus ``k = 3`` noise standard deviations, must fit in ``2**(bits - 1)``.

Accounting (:func:`skellam_epsilon`): the RDP of the Skellam mechanism (Agarwal et al.
2021, Theorem 3.5), for integer orders ``alpha``::

    eps(alpha) <= alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu))

with ``D2`` the rounded L2 bound and ``D1 = min(D2^2, sqrt(D) D2)``, composed over rounds
and converted to (epsilon, delta) with dp-accounting's conversion. No amplification by
sampling is applied (dp-accounting has no subsampled Skellam): the epsilon is an upper
bound, larger than central DP's at the same ``z``. If fewer than the expected ``n``
clients contribute, the noise is smaller than planned: the bound assumes all ``n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..seeding import np_gen, torch_gen

DEFAULT_BETA = math.exp(-0.5)
"""Conditional rounding's failure probability parameter (Kairouz et al. 2021)."""
STD_MARGIN = 3.0
"""Noise standard deviations kept inside the modulus when choosing ``gamma``."""
ORDERS = tuple(range(2, 257))


def padded(d: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(d, 1))))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform of a vector of length 2**m (its own inverse)."""
    n = x.numel()
    h = x.reshape(-1).clone().to(torch.float64)
    step = 1
    while step < n:
        h = h.view(-1, 2, step)
        a, b = h[:, 0, :], h[:, 1, :]
        h = torch.stack((a + b, a - b), dim=1).reshape(-1)
        step *= 2
    return h / math.sqrt(n)


def _signs(seed: int, round: int, n: int) -> torch.Tensor:
    g = torch_gen(seed, "ddp-rotation", int(round))
    return torch.randint(0, 2, (n,), generator=g, dtype=torch.int64).to(torch.float64) * 2 - 1


def rotate(x: torch.Tensor, seed: int, round: int) -> torch.Tensor:
    D = padded(x.numel())
    v = torch.zeros(D, dtype=torch.float64)
    v[: x.numel()] = x.reshape(-1).double()
    return hadamard(v * _signs(seed, round, D))


def unrotate(y: torch.Tensor, d: int, seed: int, round: int) -> torch.Tensor:
    return (hadamard(y.double()) * _signs(seed, round, y.numel()))[:d]


def rounded_l2_bound(l2: float, dim: int, beta: float = DEFAULT_BETA) -> float:
    """Norm bound of a vector of L2 norm ``l2`` after randomized rounding in ``dim`` coordinates
    (conditional rounding with ``beta``; ``beta = 0``: the deterministic ``l2 + sqrt(dim)``)."""
    det = l2 + math.sqrt(dim)
    if beta <= 0:
        return det
    sq = l2**2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (l2 + math.sqrt(dim) / 2)
    return min(det, math.sqrt(sq))


@dataclass(frozen=True)
class Skellam:
    """The distributed Skellam mechanism of a run: clip ``c``, multiplier ``z``, ``bits`` per
    coordinate, ``n`` expected clients per round, ``d`` coordinates."""

    clip: float
    noise_multiplier: float
    bits: int
    n: int
    d: int
    beta: float = DEFAULT_BETA

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 62:
            raise ValueError(f"dp.bits must be in 2..62, got {self.bits}")
        if not (self.clip > 0 and self.noise_multiplier > 0 and self.n >= 1 and self.d >= 1):
            raise ValueError("dp: clip and noise_multiplier must be > 0, the cohort and dimension >= 1")
        if self.gamma <= 0:
            raise ValueError(f"dp.bits = {self.bits} leave no room for {self.n} clients' sum and its noise: "
                             f"raise dp.bits")

    @property
    def D(self) -> int:
        return padded(self.d)

    @property
    def gamma(self) -> float:
        """Scale: the sum's coordinates (aligned updates: ``n c gamma / sqrt(D)``, plus rounding)
        and ``STD_MARGIN`` noise stds (``z * c * gamma`` roughly) fit in ``2**(bits-1)``."""
        room = 2 ** (self.bits - 1) - 1 - self.n  # rounding moves each client's coordinate by < 1
        per_gamma = self.n * self.clip / math.sqrt(self.D) + STD_MARGIN * self.noise_multiplier * self.clip * 1.1
        return room / per_gamma

    @property
    def l2_sensitivity(self) -> float:
        return rounded_l2_bound(self.clip * self.gamma, self.D, self.beta)

    @property
    def l1_sensitivity(self) -> float:
        d2 = self.l2_sensitivity
        return min(d2 * d2, math.sqrt(self.D) * d2)

    @property
    def variance(self) -> float:
        """Aggregate noise variance mu per coordinate (integer domain)."""
        return (self.noise_multiplier * self.l2_sensitivity) ** 2

    def encode(self, x: torch.Tensor, *, seed: int, round: int, node: int) -> np.ndarray:
        """A client's update as integers mod ``2**bits`` (clipped, rotated, scaled, rounded, noised)."""
        x = x.reshape(-1).double()
        if x.numel() != self.d:
            raise ValueError(f"distributed DP: update of {x.numel()} coordinates, {self.d} expected")
        norm = float(x.norm())
        if norm > self.clip:
            x = x * (self.clip / norm)
        y = rotate(x, seed, round) * self.gamma
        g = torch_gen(seed, "ddp-round", int(round), int(node))
        bound = self.l2_sensitivity
        lo = torch.floor(y)
        for _ in range(1000):
            z = lo + (torch.rand(y.shape, generator=g, dtype=torch.float64) < (y - lo)).double()
            if float(z.norm()) <= bound:
                break
        else:  # pragma: no cover - probability ~ beta**1000
            raise RuntimeError("conditional rounding failed 1000 times")
        rng = np_gen(seed, "ddp-noise", int(round), int(node))
        lam = self.variance / (2 * self.n)
        noise = rng.poisson(lam, self.D).astype(np.int64) - rng.poisson(lam, self.D).astype(np.int64)
        v = z.to(torch.int64).numpy() + noise
        return (v % (1 << self.bits)).astype(np.uint64)

    def decode_sum(self, total: np.ndarray, *, seed: int, round: int) -> torch.Tensor:
        """The float sum of the clipped updates plus noise, from the modular integer sum."""
        m = 1 << self.bits
        signed = total.astype(np.int64)
        signed = np.where(signed >= m // 2, signed - m, signed)
        return unrotate(torch.from_numpy(signed.astype(np.float64)) / self.gamma, self.d, seed, round).float()

    def payload_bytes(self) -> int:
        """Bytes of the SecAgg masked input that carries one client's vector."""
        return math.ceil(self.D * self.bits / 8)


def skellam_rdp(alpha: int, l2: float, l1: float, mu: float) -> float:
    """RDP at integer order ``alpha`` of one Skellam release (Agarwal et al. 2021, Theorem 3.5)."""
    return alpha * l2**2 / (2 * mu) + min(((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu))


def skellam_epsilon(mech: Skellam, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` after ``releases`` rounds (no amplification by sampling)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if releases <= 0:
        return 0.0
    rdp = [releases * skellam_rdp(a, mech.l2_sensitivity, mech.l1_sensitivity, mech.variance) for a in ORDERS]
    return float(compute_epsilon(list(ORDERS), rdp, delta)[0])


def skellam_schedule(mech: Skellam, rounds: int, delta: float) -> list[float]:
    """Epsilon after each round 1..``rounds``."""
    return [skellam_epsilon(mech, r, delta) for r in range(1, rounds + 1)]
