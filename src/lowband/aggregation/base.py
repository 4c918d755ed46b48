"""The aggregation hook: one place where a server or a peer combines what it received.

An algorithm that averages models calls ``ctx.aggregate(models, weights, reference)`` (or
``ctx.aggregate_updates(updates, weights, like)`` when it received deltas) on the
aggregating node's :class:`~lowband.algorithms.base.NodeContext` instead of averaging by
hand. With no rule configured the call returns exactly what the algorithm computed before
(its own average, to the byte). With a rule (``[aggregation]``, :mod:`lowband.aggregation`)
it flattens the float entries of each received model minus the reference in one fixed name
order into an :class:`AggregationInput`, calls the rule, and returns
``reference + aggregated update``.

A rule is any callable ``rule(inp, rng) -> (update, counters)`` (optionally with a ``name``
labelling its counters and ``min_inputs()``, see :class:`Rule`): ``update`` is a flat
float32 tensor of the aggregated *update* (the same length as a row of ``inp.updates``),
``counters`` a small dict of counts (``{"discarded": 2}``, ``{"clipped": 1}``) that the run
sums per evaluated round into metrics.jsonl (``robust/<rule>/<counter>``) and over the run
into the summary. ``rng`` is addressed by (seed, round, node, "aggregate") like every other
random choice (:meth:`NodeContext.rng`), so a rule that draws noise (central DP) is
reproducible and resumable.

Counters are collected per process in :data:`COLLECTOR` under (round, node); the driver
drains every place's collector at the end of each round (:func:`drain_place`, run through
``executor.map_places``) and adds the sums to that round's incidents.

Entries that are not floating point (BatchNorm's ``num_batches_tracked``) are not updates:
under a rule they take the maximum over the received models, as the plain average does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, runtime_checkable

import torch

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class AggregationInput:
    """What a rule sees: the senders' updates relative to the aggregator's reference.

    ``updates[i]`` is sender ``senders[i]``'s model minus ``reference`` (float entries,
    flattened in ``names`` order, float32); ``weights[i]`` the algorithm's own weight for it
    (sample counts, mixing weights; not normalised); ``node`` the aggregator (``SERVER`` = -1
    or a peer id), ``round`` the round (1-based); ``reference`` the flat reference model."""

    updates: torch.Tensor
    weights: torch.Tensor
    senders: tuple[int, ...]
    node: int
    round: int
    reference: torch.Tensor
    names: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return int(self.updates.shape[0])

    @property
    def normalised_weights(self) -> torch.Tensor:
        w = self.weights.to(torch.float64)
        return (w / w.sum()).to(torch.float32)


@runtime_checkable
class Rule(Protocol):
    """An aggregation rule: ``rule(inp, rng) -> (aggregated update [d], counters)``.

    ``name`` labels its counters; ``min_inputs`` is the fewest updates it can serve (fewer
    are refused before the run where the count is known, and skipped with a
    ``robust/<name>/skipped`` count where a round delivers fewer)."""

    name: str

    def min_inputs(self) -> int: ...

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]: ...


class Collector:
    """Per-process counters of the aggregation rules: (round, node) -> key -> count."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], dict[str, float]] = {}

    def add(self, round: int, node: int, rule: str, counters: Mapping[str, float]) -> None:
        per = self.counts.setdefault((int(round), int(node)), {})
        for k, v in counters.items():
            key = f"robust/{rule}/{k}"
            per[key] = per.get(key, 0.0) + float(v)

    def drain(self) -> dict[int, dict[str, float]]:
        """round -> key -> sum over the aggregating nodes; empties the collector."""
        out: dict[int, dict[str, float]] = {}
        for (r, _), per in sorted(self.counts.items()):
            dst = out.setdefault(r, {})
            for k, v in per.items():
                dst[k] = dst.get(k, 0.0) + v
        self.counts = {}
        return out


#: this process's collector (a worker process or a Ray shard has its own; see drain_place)
COLLECTOR = Collector()


def drain_place(executor: Any = None, nodes: Any = None) -> dict[int, dict[str, float]]:
    """Drain this process's :data:`COLLECTOR`; the signature of ``executor.map_places``'s
    ``fn(executor, nodes)``, so ``executor.map_places(drain_place, all_nodes)`` collects the
    counters of every place (merge the list with :func:`merge_counts`)."""
    return COLLECTOR.drain()


def merge_counts(parts: Sequence[Mapping[int, Mapping[str, float]]]) -> dict[int, dict[str, float]]:
    """Sum per-place results of :func:`drain_place`."""
    out: dict[int, dict[str, float]] = {}
    for part in parts:
        for r, per in part.items():
            dst = out.setdefault(int(r), {})
            for k, v in per.items():
                dst[k] = dst.get(k, 0.0) + float(v)
    return out


def rule_name(rule: Any) -> str:
    """``rule.name``, or a plain callable's class name (the counters' label)."""
    return str(getattr(rule, "name", type(rule).__name__))


def rule_min_inputs(rule: Any) -> int:
    """``rule.min_inputs()``, or 1 for a plain callable."""
    get = getattr(rule, "min_inputs", None)
    return int(get()) if callable(get) else 1


# --------------------------------------------------------------------------- flattening


def float_names(like: Params) -> tuple[str, ...]:
    """The float entries of ``like`` in its own order: the fixed order of the flat vectors."""
    return tuple(k for k, v in like.items() if v.is_floating_point())


def flat(params: Params, names: Sequence[str]) -> torch.Tensor:
    """``params``'s entries ``names`` as one float32 vector (a missing entry is an error)."""
    return torch.cat([params[k].reshape(-1).to(torch.float32) for k in names]) if names else torch.zeros(0)


def unflat(vec: torch.Tensor, like: Params, names: Sequence[str]) -> Params:
    """Split ``vec`` back into ``like``'s float entries ``names`` (their shapes and dtypes)."""
    out: Params = {}
    i = 0
    for k in names:
        t = like[k]
        out[k] = vec[i:i + t.numel()].reshape(t.shape).to(t.dtype)
        i += t.numel()
    return out


# --------------------------------------------------------------------------- the hook


def apply_rule(rule: Rule, updates: list[Params], weights: Sequence[float], like: Params, *, senders: Sequence[int],
               node: int, round: int, rng: torch.Generator, reference: Optional[Params] = None) -> Params:
    """The rule's aggregated update as a parameter dict over ``like``'s float entries
    (counters go to :data:`COLLECTOR`). ``updates`` are already relative to ``reference``."""
    names = float_names(like)
    n = len(updates)
    label = rule_name(rule)
    if n < rule_min_inputs(rule):
        COLLECTOR.add(round, node, label, {"skipped": 1})
        return {k: torch.zeros_like(like[k]) for k in names}
    inp = AggregationInput(
        updates=torch.stack([flat(u, names) for u in updates]),
        weights=torch.tensor([float(w) for w in weights], dtype=torch.float32),
        senders=tuple(int(s) for s in senders), node=int(node), round=int(round),
        reference=flat(reference, names) if reference is not None else torch.zeros(sum(like[k].numel() for k in names)),
        names=names)
    upd, counters = rule(inp, rng)
    if counters:
        COLLECTOR.add(round, node, label, counters)
    return unflat(upd, like, names)


def aggregate_models(rule: Optional[Rule], models: list[Params], weights: Sequence[float], reference: Params, *,
                     senders: Sequence[int], node: int, round: int, rng: Callable[[], torch.Generator],
                     plain: Callable[[], Params]) -> Params:
    """``plain()`` without a rule; else ``reference + rule(models - reference)`` (non-float
    entries: the maximum over ``models``, as :func:`lowband.train.weighted_average` keeps)."""
    if rule is None:
        return plain()
    names = float_names(reference)
    ups = [{k: m[k].to(torch.float32) - reference[k].to(torch.float32) for k in names} for m in models]
    upd = apply_rule(rule, ups, weights, reference, senders=senders, node=node, round=round, rng=rng(),
                     reference=reference)
    out: Params = {}
    for k, v in reference.items():
        if k in upd:
            out[k] = (v.to(torch.float32) + upd[k].to(torch.float32)).to(v.dtype)
        else:
            out[k] = torch.stack([m[k] for m in models]).max(dim=0).values.clone()
    return out


def aggregate_updates(rule: Optional[Rule], updates: list[Params], weights: Sequence[float], like: Params, *,
                      senders: Sequence[int], node: int, round: int, rng: Callable[[], torch.Generator],
                      plain: Callable[[], Params], reference: Optional[Params] = None) -> Params:
    """``plain()`` without a rule; else the rule's aggregate of ``updates`` (deltas, already
    relative to the aggregator's model ``reference``) over ``like``'s float entries
    (non-float entries: the maximum over ``updates``)."""
    if rule is None:
        return plain()
    names = float_names(like)
    upd = apply_rule(rule, [{k: u[k] for k in names} for u in updates], weights, like, senders=senders, node=node,
                     round=round, rng=rng(), reference=reference)
    return {k: upd[k] if k in upd else torch.stack([u[k] for u in updates]).max(dim=0).values.clone()
            for k in like}


__all__ = ["AggregationInput", "COLLECTOR", "Collector", "Rule", "aggregate_models", "aggregate_updates", "apply_rule",
           "drain_place", "flat", "float_names", "merge_counts", "unflat"]
