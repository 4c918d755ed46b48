"""Central DP in real runs before the aggregation hook lands: :func:`with_central_dp`
derives from a FedAvg-like class a subclass whose server aggregation is DP-FedAvg
(:class:`~lowband.privacy.central.DPFedAvg`): each reply's update (weights minus the
round's global model, or the delta) is clipped, the sum noised, divided by the expected
cohort, and the algorithm's own server step (``server_apply``: plain FedAvg or a server
optimiser) applies it. Nothing else of the algorithm changes.

The rule's noise is addressed by ``(seed, "dp-central", round)``; the adaptive clip lives in
the server state (``dp_clip``), so checkpoints and resumes keep it. ``round_metrics`` adds
``dp/epsilon`` (from the run's :class:`~lowband.privacy.accountant.EpsilonTrack`) and the
rule's counters, written as ``alg/dp/...`` by the current round loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from ..algorithms.base import SERVER, Envelope, NodeContext, Outbox, State
from ..seeding import torch_gen
from .accountant import EpsilonTrack
from .central import DPFedAvg, central_dp_releases


@dataclass
class _Input:
    updates: torch.Tensor
    weights: torch.Tensor
    senders: tuple[int, ...]
    node: int
    round: int
    reference: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    support: Optional[torch.Tensor] = None


def with_central_dp(cls: type, rule: DPFedAvg, track: Optional[EpsilonTrack] = None) -> type:
    """A subclass of FedAvg-like ``cls`` aggregating with ``rule`` (see the module docstring)."""
    releases = central_dp_releases(getattr(cls, "name", "?"), getattr(cls, "family", "?"))
    if releases != 1 or not hasattr(cls, "server_apply"):
        raise ValueError(f"dp.mechanism = \"central\" for {cls.name!r} needs the aggregation hook "
                         f"(lowband.aggregation): its server aggregates more than one sum a round")

    class Private(cls):  # type: ignore[misc, valid-type]
        dp_rule = rule
        dp_track = track
        #: ``sharedmask(frac)`` uplink: the noise goes on the round's public support only
        #: (lowband.privacy.sparsify); None: on every coordinate
        dp_support: Optional[float] = None

        def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            # an empty inbox (a Poisson round that sampled nobody, or every reply lost) still
            # releases the noise: the mechanism's output may not reveal that the cohort was empty
            glob = state["params"]
            names = sorted(k for k, v in glob.items() if v.is_floating_point())
            ref = torch.cat([glob[k].reshape(-1).float() for k in names])
            rows = []
            for e in inbox:
                t = e.msg.tensors
                if e.msg.kind == "weights":
                    rows.append(torch.cat([(t[k] if k in t else glob[k]).reshape(-1).float() for k in names]) - ref)
                else:
                    rows.append(torch.cat([(t[k] if k in t else torch.zeros_like(glob[k])).reshape(-1).float()
                                           for k in names]))
            inp = _Input(torch.stack(rows) if rows else torch.zeros((0, ref.numel())), torch.ones(len(rows)),
                         tuple(e.src for e in inbox), SERVER, ctx.round, ref)
            if self.dp_support is not None:
                from .sparsify import message_support

                inp.support = message_support(self.dp_support, ctx.seed, ctx.round, getattr(self.hp, "upload", "delta"),
                                              [(k, tuple(glob[k].shape)) for k in names])
            if "dp_clip" in state:
                self.dp_rule.load_state_dict({"clip": float(state["dp_clip"])})
            agg, counters = self.dp_rule(inp, torch_gen(ctx.seed, "dp-central", ctx.round))
            delta, i = {}, 0
            for k in names:
                n = glob[k].numel()
                delta[k] = agg[i:i + n].reshape(glob[k].shape).to(glob[k].dtype)
                i += n
            for k, v in glob.items():  # integer buffers keep the global model's value
                delta.setdefault(k, torch.zeros_like(v))
            new = self.server_apply(ctx, state, delta)
            diag = {**counters, **self.dp_rule.last, "update_norm": float(agg.norm())}
            return {**new, "dp_clip": float(self.dp_rule.clip), "dp_round": ctx.round,
                    "dp_counters": {k: float(v) for k, v in diag.items()}}, Outbox()

        def round_metrics(self, server_state: State) -> dict[str, float]:
            out = dict(super().round_metrics(server_state))
            out.update({f"dp/{k}": v for k, v in server_state.get("dp_counters", {}).items()})
            if self.dp_track is not None and "dp_round" in server_state:
                out.update(self.dp_track.metrics(int(server_state["dp_round"])))
            return out

        def __reduce__(self):  # a class made here has no importable name: pickle how to make it again
            return _remade, (with_central_dp, (cls, rule, track), self.__dict__)

    Private.__name__ = Private.__qualname__ = f"DP{cls.__name__}"
    return Private


def _remade(wrap, args: tuple, state: dict) -> Any:
    """An instance of ``wrap(*args)`` with ``state`` (unpickling a wrapped algorithm in a worker)."""
    obj = object.__new__(wrap(*args))
    obj.__dict__.update(state)
    return obj


class _Releases:
    """The rules of a round's releases through the aggregation hook: call ``i`` of a round is
    release ``i`` (its own :class:`DPFedAvg`, and noise from its own generator: the hook hands
    every call of a node and round the same generator, and two releases noised alike would
    cancel in their difference)."""

    name = "dp_fedavg"

    def __init__(self, rules: tuple[DPFedAvg, ...]) -> None:
        self.rules, self.calls = rules, 0

    def min_inputs(self) -> int:
        return 1

    def __call__(self, inp: Any, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        if self.calls >= len(self.rules):
            raise RuntimeError(f"central DP: {self.calls + 1} releases in one round; {len(self.rules)} accounted")
        i, self.calls = self.calls, self.calls + 1
        base = int(torch.randint(0, 2**62, (1,), generator=rng))
        return self.rules[i](inp, torch_gen(base, "dp-release", i))


def with_central_dp_hook(cls: type, rules: tuple[DPFedAvg, ...]) -> type:
    """Central DP for a server method that aggregates through the hook (``ctx.aggregate_updates``)
    and releases ``len(rules)`` sums a round: SCAFFOLD's model delta and control-variate delta.

    Each release is DP-FedAvg (:class:`DPFedAvg`: clipped to S, noise z S on the sum, divided by
    the expected cohort m) with independent noise; the accountant composes the releases
    (``SampledGaussian.releases_per_round``). SCAFFOLD's server then steps
    ``x <- x + eta_g * release_1`` and ``c <- c + (|S| / N) * release_2``: the factor |S| (the
    replies' count) is public only under fixed-size sampling, which
    :func:`~lowband.privacy.config.check_privacy` therefore requires."""
    releases = central_dp_releases(getattr(cls, "name", "?"), getattr(cls, "family", "?"))
    if releases != len(rules) or not getattr(cls, "aggregation_hook", False):
        raise ValueError(f"dp.mechanism = \"central\" for {cls.name!r}: {releases} releases a round through the "
                         f"aggregation hook, {len(rules)} rules given")

    class Private(cls):  # type: ignore[misc, valid-type]
        dp_rules = rules

        def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            if ctx.aggregation is not None:
                raise ValueError("dp.mechanism = \"central\" and an [aggregation] rule are both aggregation rules")
            new, out = super().server_aggregate(replace(ctx, aggregation=_Releases(self.dp_rules)), state, inbox)
            diag = {"clip": self.dp_rules[0].clip, "noise_std": self.dp_rules[0].z_update * self.dp_rules[0].clip,
                    "senders": float(sum(e.msg.kind == "delta" for e in inbox))}
            return {**new, "dp_counters": diag}, out

        def round_metrics(self, server_state: State) -> dict[str, float]:
            out = dict(super().round_metrics(server_state))
            out.update({f"dp/{k}": v for k, v in server_state.get("dp_counters", {}).items()})
            return out

        def __reduce__(self):  # a class made here has no importable name: pickle how to make it again
            return _remade, (with_central_dp_hook, (cls, rules), self.__dict__)

    Private.__name__ = Private.__qualname__ = f"DP{cls.__name__}"
    return Private
