"""Robust aggregation rules (server and peer), each a callable on an :class:`AggregationInput`.

Every rule takes the senders' updates ``x_i`` (rows of ``inp.updates``: model minus the
aggregator's reference) and returns one aggregated update plus counters. ``f`` is the
number of Byzantine senders a rule is configured to tolerate; each rule refuses (with one
line, before the run where the number of inputs is known) fewer inputs than its paper
needs, and skips a round that delivers fewer (counted as ``robust/<rule>/skipped``; the
model then stays where it was).

Weights: the coordinate-wise rules, Krum and Bulyan select or trim *unweighted*, as the
papers write them; the average over what they keep, the geometric median and the clipping
rules use the algorithm's own weights (sample counts or mixing weights), normalised.

Counters: ``discarded`` (updates a selection rule left out), ``clipped`` (updates a
clipping rule shortened, last iteration), ``outliers`` (coordinate-wise rules: updates
outside the kept range ``[f-th smallest, f-th largest]`` in clearly more coordinates than
an honest update is, see :func:`_outliers`: mostly trimmed away).
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field

from lowband.aggregation.base import AggregationInput

Out = tuple[torch.Tensor, dict[str, float]]


class RuleParams(BaseModel):
    """A rule's parameters (strict: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FParams(RuleParams):
    f: int = Field(1, ge=0, description="number of Byzantine senders tolerated")


class BaseRule:
    """Common plumbing: ``name``, ``Params`` and :meth:`min_inputs`."""

    name: ClassVar[str]
    Params: ClassVar[type[RuleParams]] = RuleParams
    paper: ClassVar[str] = ""

    def __init__(self, **params: Any):
        self.params = self.Params(**params)

    def __getattr__(self, key: str) -> Any:  # rule.f, rule.tau ...
        params = self.__dict__.get("params")
        if params is not None and key in type(params).model_fields:
            return getattr(params, key)
        raise AttributeError(key)

    def min_inputs(self) -> int:
        return 1

    def needs(self) -> str:
        """Why :meth:`min_inputs` (for the refusal line)."""
        return f"{self.name} needs at least {self.min_inputs()} inputs"

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.model_dump().items())
        return f"{self.name}({args})"

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        raise NotImplementedError


def weighted_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum_i w_i x_i / sum_i w_i`` (float32 rows, float64 weights normalised first)."""
    w = w.to(torch.float64)
    w = (w / w.sum()).to(x.dtype)
    return (w[:, None] * x).sum(0)


def _outliers(x: torch.Tensor, f: int) -> int:
    """Rows trimmed away (outside the per-coordinate ``[f-th smallest, f-th largest]``
    range, ties inside) in more than ``(1 + 2f/n) / 2`` of the coordinates: halfway between
    the fraction ``2f/n`` an exchangeable honest row is trimmed in on average and all."""
    n, d = x.shape
    if f == 0 or d == 0:
        return 0
    s = x.sort(dim=0).values
    lo, hi = s[f], s[n - 1 - f]
    out = ((x < lo) | (x > hi)).sum(1).to(torch.float64)
    return int((out > d * (1 + 2 * f / n) / 2).sum())


# --------------------------------------------------------------------------- server rules


class Mean(BaseRule):
    """The plain weighted mean through the hook (no defence): a baseline, and the place a
    wrapper such as central DP noise composes with."""

    name = "mean"

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        return weighted_mean(inp.updates, inp.weights), {}


class Median(BaseRule):
    """Coordinate-wise median (Yin et al., ICML 2018): for even n the mean of the two middle
    values. Tolerates f < n/2; refuses n < 2f + 1."""

    name = "median"
    Params = FParams
    paper = "Yin et al., Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates, ICML 2018"

    def min_inputs(self) -> int:
        return 2 * self.f + 1

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates
        n = x.shape[0]
        s = x.sort(dim=0).values
        med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        return med, {"outliers": _outliers(x, self.f)}


class TrimmedMean(BaseRule):
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018): per coordinate, drop the f
    largest and the f smallest values and average the other n - 2f (uniformly, as in the
    paper). Refuses n < 2f + 1."""

    name = "trimmed_mean"
    Params = FParams
    paper = Median.paper

    def min_inputs(self) -> int:
        return 2 * self.f + 1

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates
        n, f = x.shape[0], self.f
        s = x.sort(dim=0).values
        return s[f:n - f].mean(0), {"outliers": _outliers(x, f)}


def krum_scores(x: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each row: the sum of its squared distances to its n - f - 2 nearest
    other rows (Blanchard et al. 2017)."""
    n = x.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=torch.float64)
    d2 = torch.cdist(x.to(torch.float64), x.to(torch.float64)).pow(2)
    d2.fill_diagonal_(float("inf"))
    k = min(max(n - f - 2, 1), n - 1)  # at least one neighbour (Bulyan's last picks)
    return d2.sort(dim=1).values[:, :k].sum(1)


class MultiKrumParams(FParams):
    m: Optional[int] = Field(None, ge=1, description="updates averaged (Multi-Krum); unset: n - f")


class Krum(BaseRule):
    """Krum (Blanchard et al., NeurIPS 2017): the update with the smallest sum of squared
    distances to its n - f - 2 nearest neighbours. Refuses n < 2f + 3."""

    name = "krum"
    Params = FParams
    paper = "Blanchard et al., Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent, NeurIPS 2017"

    def min_inputs(self) -> int:
        return 2 * self.f + 3

    def select(self, n: int) -> int:
        return 1

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates
        n = x.shape[0]
        m = min(self.select(n), n)
        chosen = krum_scores(x, self.f).argsort(stable=True)[:m]  # ties: the lower index
        return weighted_mean(x[chosen], inp.weights[chosen]), {"discarded": n - m}


class MultiKrum(Krum):
    """Multi-Krum (Blanchard et al. 2017): the mean (algorithm weights) of the m updates with
    the best Krum scores; m = n - f unless set. Refuses n < 2f + 3."""

    name = "multikrum"
    Params = MultiKrumParams

    def select(self, n: int) -> int:
        return self.m if self.m is not None else n - self.f


class Bulyan(BaseRule):
    """Bulyan (El Mhamdi et al., ICML 2018) over Krum: select theta = n - 2f updates by
    repeated Krum (each time the best-scored one among those left, scored among those left),
    then per coordinate average the beta = theta - 2f values closest to the selection's
    median. Refuses n < 4f + 3."""

    name = "bulyan"
    Params = FParams
    paper = "El Mhamdi et al., The Hidden Vulnerability of Distributed Learning in Byzantium, ICML 2018"

    def min_inputs(self) -> int:
        return 4 * self.f + 3

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates
        n, f = x.shape[0], self.f
        theta = n - 2 * f
        left = list(range(n))
        chosen: list[int] = []
        while len(chosen) < theta:
            # Krum on the remaining set (its last picks, with fewer than f + 3 left, score
            # each by its nearest remaining neighbour: krum_scores keeps at least one)
            best = int(krum_scores(x[left], f).argsort(stable=True)[0])
            chosen.append(left.pop(best))
        sel = x[sorted(chosen)]
        beta = theta - 2 * f
        s = sel.sort(dim=0).values
        med = s[theta // 2] if theta % 2 else (s[theta // 2 - 1] + s[theta // 2]) / 2
        idx = (sel - med).abs().argsort(dim=0, stable=True)[:beta]
        return sel.gather(0, idx).mean(0), {"discarded": n - theta}


class GeoMedParams(RuleParams):
    iterations: int = Field(3, ge=1, description="smoothed Weiszfeld iterations (RFA: a few suffice)")
    nu: float = Field(1e-6, gt=0, description="smoothing nu: distances below it count as nu")


class GeoMed(BaseRule):
    """Geometric median by the smoothed Weiszfeld algorithm (RFA, Pillutla et al., IEEE TSP
    2022): from the weighted mean, ``v <- sum_i b_i x_i / sum_i b_i`` with
    ``b_i = alpha_i / max(nu, ||v - x_i||)`` (alpha: the algorithm's weights). Breakdown
    point 1/2 of the total weight. Counters: none."""

    name = "geomed"
    Params = GeoMedParams
    paper = "Pillutla, Kakade, Harchaoui, Robust Aggregation for Federated Learning, IEEE TSP 2022"

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates.to(torch.float64)
        a = inp.weights.to(torch.float64)
        a = a / a.sum()
        v = (a[:, None] * x).sum(0)
        for _ in range(self.iterations):
            b = a / (x - v).norm(dim=1).clamp_min(self.nu)
            v = (b[:, None] * x).sum(0) / b.sum()
        return v.to(torch.float32), {}


class ClipParams(RuleParams):
    tau: Optional[float] = Field(None, gt=0, description="clipping radius; unset: the median distance of the "
                                                         "updates to the current centre (our reading, see docs)")
    iterations: int = Field(3, ge=1, description="clipping iterations l")


class CenteredClipping(BaseRule):
    """Centered clipping (Karimireddy, He, Jaggi, ICML 2021): from v = 0 (the reference
    model), ``l`` times ``v <- v + sum_i w_i clip_tau(x_i - v)`` with
    ``clip_tau(z) = z min(1, tau/||z||)`` (w: the algorithm's weights, normalised).

    Deviation: the paper starts from the previous round's aggregate (with worker momentum);
    here every round starts at the reference (v = 0), so the rule is stateless and a resumed
    run the same; ``tau`` unset takes the median distance at each iteration."""

    name = "centered_clipping"
    Params = ClipParams
    paper = "Karimireddy, He, Jaggi, Learning from History for Byzantine Robust Optimization, ICML 2021"

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates
        w = inp.normalised_weights
        v = torch.zeros_like(x[0])
        clipped = 0
        for _ in range(self.iterations):
            z = x - v
            norms = z.norm(dim=1)
            tau = float(self.tau) if self.tau is not None else float(norms.median())
            scale = torch.where(norms > tau, tau / norms.clamp_min(1e-30), torch.ones_like(norms))
            clipped = int((norms > tau).sum())
            v = v + (w[:, None] * (z * scale[:, None])).sum(0)
        return v, {"clipped": clipped}


# --------------------------------------------------------------------------- peer rules


def _own_index(inp: AggregationInput) -> Optional[int]:
    return inp.senders.index(inp.node) if inp.node in inp.senders else None


class Bridge(BaseRule):
    """BRIDGE-T (Yang and Bajwa, IEEE TSIPN 2019), a peer rule: per coordinate, drop the f
    largest and f smallest of the *neighbours'* values, then average the rest together with
    the node's own (uniformly, as in the paper). Refuses a node with fewer than 2f + 1
    neighbours. At a server (no own model among the inputs) it is the trimmed mean."""

    name = "bridge"
    Params = FParams
    paper = "Yang and Bajwa, ByRDiE / BRIDGE: Byzantine-resilient decentralized learning, IEEE TSIPN 2019"

    def min_inputs(self) -> int:
        return 2 * self.f + 2  # the node itself and 2f + 1 neighbours

    def needs(self) -> str:
        return f"bridge with f = {self.f} needs at least {2 * self.f + 1} neighbours per node (2f + 1)"

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        own = _own_index(inp)
        x = inp.updates
        if own is None:
            return TrimmedMean(f=self.f)(inp, rng)
        nb = torch.cat([x[:own], x[own + 1:]])
        n, f = nb.shape[0], self.f
        kept = nb.sort(dim=0).values[f:n - f]
        return torch.cat([x[own:own + 1], kept]).mean(0), {"outliers": _outliers(nb, f)}


class SelfClipParams(FParams):
    f: int = Field(1, ge=0, description="neighbours assumed Byzantine (sets the adaptive radius)")
    tau: Optional[float] = Field(None, gt=0, description="clipping radius; unset: adaptive (the (f+1)-th largest "
                                                         "neighbour distance, our reading of the paper's rule)")


class SelfCenteredClipping(BaseRule):
    """Self-centred clipping, ClippedGossip (He, Karimireddy, Jaggi, 2022), a peer rule:
    ``x_i <- x_i + sum_j W_ij clip_tau(x_j - x_i)`` with W the algorithm's mixing weights
    (uniform over the closed neighbourhood for DFedAvg / D-PSGD). ``tau`` unset: the
    (f+1)-th largest neighbour distance, so the f farthest neighbours are clipped to it."""

    name = "self_clipping"
    Params = SelfClipParams
    paper = "He, Karimireddy, Jaggi, Byzantine-Robust Decentralized Learning via ClippedGossip, 2022"

    def min_inputs(self) -> int:
        return self.f + 2 if self.tau is None else 1

    def needs(self) -> str:
        return (f"self_clipping with an adaptive radius and f = {self.f} needs at least {self.f + 1} neighbours "
                f"per node (or set aggregation.tau)")

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Out:
        x = inp.updates  # relative to the node's own model: its own row is 0
        w = inp.normalised_weights
        norms = x.norm(dim=1)
        own = _own_index(inp)
        if self.tau is not None:
            tau = float(self.tau)
        else:
            nb = torch.cat([norms[:own], norms[own + 1:]]) if own is not None else norms
            tau = float(nb.sort(descending=True).values[min(self.f, nb.numel() - 1)])
        scale = torch.where(norms > tau, tau / norms.clamp_min(1e-30), torch.ones_like(norms))
        return (w[:, None] * (x * scale[:, None])).sum(0), {"clipped": int((norms > tau).sum())}


RULES: dict[str, type[BaseRule]] = {r.name: r for r in (Mean, Median, TrimmedMean, Krum, MultiKrum, Bulyan, GeoMed,
                                                          CenteredClipping, Bridge, SelfCenteredClipping)}
"""Rule name -> class. Another module adds a rule with :func:`register_rule`."""


def register_rule(cls: type[BaseRule]) -> type[BaseRule]:
    """Class decorator: make ``cls`` available as ``[aggregation] rule = cls.name``."""
    if cls.name in RULES and RULES[cls.name] is not cls:
        raise ValueError(f"aggregation rule {cls.name!r} registered twice")
    RULES[cls.name] = cls
    return cls


__all__ = ["RULES", "BaseRule", "Bridge", "Bulyan", "CenteredClipping", "GeoMed", "Krum", "Mean", "Median",
           "MultiKrum", "RuleParams", "SelfCenteredClipping", "TrimmedMean", "krum_scores", "register_rule",
           "weighted_mean"]
