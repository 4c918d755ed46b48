"""Byzantine attackers: who they are and the update each attack sends (pure formulas).

An attack turns the attacker's honest update ``u`` (its outgoing model minus the model it
started from, or its delta) into the update it sends. The formulas, on flat float32
vectors:

- ``sign_flip``: ``-scale * u`` (scale 1);
- ``scaling``: ``scale * u`` (scale 20, the 20-50x range of the issue that reported it);
- ``gaussian``: ``N(0, sigma^2)`` per coordinate in place of ``u`` (sigma 200, Fang et al.
  2020's Gaussian attack), drawn from the attacker's addressed generator;
- ``label_flip`` (data poisoning, Fang et al. 2020): the attacker trains on labels
  ``C - 1 - y`` and sends what that training gives;
- ``alie`` ("a little is enough", Baruch et al. 2019): ``mu - z sigma`` coordinate-wise, mu
  and sigma the mean and standard deviation of the honest updates of the same aggregation,
  ``z = Phi^{-1}((n - s) / n)`` with ``s = floor(n/2 + 1) - f`` (n inputs, f attackers
  among them) unless ``z`` is set;
- ``ipm`` (inner-product manipulation, Xie et al. 2020): ``-epsilon * mu`` (epsilon 0.1);
- ``model_replacement`` (Bagdasaryan et al. 2020): the attacker trains on its data plus a
  backdoored copy of a fraction of it (a trigger patch, relabelled to ``target``) and sends
  ``G + gamma (X - G)``: its update boosted by ``gamma = n / eta`` (n inputs of the
  aggregation, eta = 1), so that averaging replaces the model by its own.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from lowband.seeding import np_gen

#: attacks that act on what the attacker sends (sender-side, before the codec)
SENDER_KINDS = ("sign_flip", "scaling", "gaussian", "label_flip", "model_replacement")
#: attacks that need the honest updates of the same aggregation (played at the aggregator)
OMNISCIENT_KINDS = ("alie", "ipm")
#: attacks that change the attacker's training data
DATA_KINDS = ("label_flip", "model_replacement")
KINDS = SENDER_KINDS + OMNISCIENT_KINDS


def choose_attackers(num_nodes: int, seed: int, nodes: Optional[Sequence[int]] = None,
                     fraction: Optional[float] = None) -> tuple[int, ...]:
    """The attacking nodes: ``nodes`` as given, or ``round(fraction * num_nodes)`` (at least
    one for a positive fraction) drawn once from ``(seed, "byzantine")``."""
    if nodes is not None:
        return tuple(sorted(int(i) for i in nodes))
    if not fraction:
        return ()
    k = max(1, int(round(float(fraction) * num_nodes)))
    perm = np_gen(seed, "byzantine").permutation(num_nodes)
    return tuple(sorted(int(i) for i in perm[:k]))


def sign_flip(u: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return -scale * u


def scaling(u: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    return scale * u


def gaussian(u: torch.Tensor, sigma: float, gen: torch.Generator) -> torch.Tensor:
    return sigma * torch.randn(u.shape, generator=gen, dtype=torch.float32)


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max for n inputs of which f are attackers."""
    s = math.floor(n / 2 + 1) - f
    p = (n - s) / n
    p = min(max(p, 1e-6), 1 - 1e-6)
    from statistics import NormalDist

    return float(NormalDist().inv_cdf(p))


def alie(honest: torch.Tensor, z: float) -> torch.Tensor:
    """``mu - z sigma`` over the honest rows (population std; one honest row: sigma 0)."""
    mu = honest.mean(0)
    sigma = honest.std(0, unbiased=False) if honest.shape[0] > 1 else torch.zeros_like(mu)
    return mu - z * sigma


def ipm(honest: torch.Tensor, epsilon: float = 0.1) -> torch.Tensor:
    return -epsilon * honest.mean(0)


def boost(u: torch.Tensor, gamma: float) -> torch.Tensor:
    """Model replacement: the update scaled by gamma (the model sent is ``G + gamma u``)."""
    return gamma * u


# --------------------------------------------------------------------------- data poisoning


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    return (num_classes - 1 - y).to(y.dtype)


def add_trigger(x: torch.Tensor, value: Optional[float] = None) -> torch.Tensor:
    """``x`` with the backdoor trigger: the bottom-right 3x3 patch of every channel (image
    inputs ``[N, C, H, W]``), a 2x2 patch of a square flat input (digits' 8x8), else the
    last 4 features, set to ``value`` (default: the largest value of ``x``)."""
    x = x.clone()
    v = float(x.max()) if value is None else float(value)
    if x.dim() == 4:
        x[:, :, -3:, -3:] = v
    elif x.dim() == 2:
        side = int(round(math.sqrt(x.shape[1])))
        if side * side == x.shape[1] and side >= 4:
            img = x.view(x.shape[0], side, side)
            img[:, -2:, -2:] = v
        else:
            x[:, -4:] = v
    else:
        x.view(x.shape[0], -1)[:, -4:] = v
    return x


def backdoor_data(x: torch.Tensor, y: torch.Tensor, target: int, fraction: float,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The clean data plus triggered copies of ``fraction`` of it, relabelled ``target``."""
    n = int(y.shape[0])
    k = int(round(fraction * n))
    if k == 0:
        return x, y
    idx = torch.randperm(n, generator=gen)[:k].to(x.device)
    return torch.cat([x, add_trigger(x[idx], float(x.max()))]), torch.cat([y, torch.full((k,), int(target),
                                                                                          dtype=y.dtype,
                                                                                          device=y.device)])


def attackers_array(attackers: Sequence[int], num_nodes: int) -> np.ndarray:
    a = np.zeros(num_nodes, dtype=bool)
    a[list(attackers)] = True
    return a


__all__ = ["DATA_KINDS", "KINDS", "OMNISCIENT_KINDS", "SENDER_KINDS", "add_trigger", "alie", "alie_z",
           "backdoor_data", "boost", "choose_attackers", "flip_labels", "gaussian", "ipm", "scaling", "sign_flip"]
