"""The attack as a wrapper, not a branch in the round loop.

:func:`install` wraps the algorithm's steps: every step function runs as before on honest
nodes; on an attacker it runs on the attacker's (poisoned, for the data attacks) data, and
the attacker's outgoing model messages are transformed *before the codec*: the network then
encodes, counts and delivers them like any other (the attacker's bytes are in the ledger,
its codec state is its own). Nothing else changes: same seeds, same states, so a resumed
run is the same run.

What the transform changes: messages of kinds ``weights``, ``delta`` and ``control_delta``.
The attacker's update ``u`` is the message minus its reference: for ``delta`` kinds the
reference is 0; for ``weights`` it is the model the attacker started the step from (the
server's broadcast in its inbox for server methods, its own model before the step for peer
methods; where the message equals that model, as D-PSGD's, which sends the model it holds,
the shared initial model). It sends ``reference + attack(u)`` in the float entries; other
entries and the metadata (``num_examples``) are left as they are.

The omniscient attacks (``alie``, ``ipm``) need the honest updates of the same round, which
exist together only where they are aggregated. They are played there: the attacker sends
its honest message (crossing the link, counted), and the aggregation hook
(:class:`Adversary`, wrapping the configured rule or the plain mean) replaces each
attacker's row by the crafted vector computed from the honest rows of the same
aggregation. This is the strongest (omniscient) reading of both papers; under a lossy codec
the crafted vector skips the codec, a small advantage to the attacker. It applies where the
algorithm aggregates through the hook (``Algorithm.aggregation_hook``), and is refused
elsewhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from lowband.aggregation.base import AggregationInput
from lowband.attacks import model as atk
from lowband.attacks.config import ByzantineConfig

ATTACKED_KINDS = ("weights", "delta", "control_delta")
SERVER = -1


class Attack:
    """The run's attack: the config and the attacking nodes."""

    def __init__(self, cfg: ByzantineConfig, attackers: tuple[int, ...], seed: int):
        self.cfg, self.attackers, self.seed = cfg, frozenset(attackers), int(seed)
        self.nodes = tuple(sorted(attackers))

    @property
    def kind(self) -> str:
        return self.cfg.kind

    def describe(self) -> dict[str, Any]:
        """What the summary says of the attack."""
        params = {k: v for k, v in self.cfg.model_dump().items() if k not in ("kind", "nodes", "fraction")
                  and k in ("scale", "on", "sigma", "z", "epsilon", "gamma", "target", "poison_fraction")
                  and k in _reads(self.kind)}
        if self.kind in ("sign_flip", "scaling"):
            params["scale"] = self.cfg.coefficient
        return {"kind": self.kind, "nodes": list(self.nodes), **params}

    # -- the attacker's data --------------------------------------------------------------
    def poisoned(self, ctx: Any) -> Any:
        """``ctx`` with the attacker's training data poisoned (data attacks), else ``ctx``."""
        if self.kind not in atk.DATA_KINDS:
            return ctx
        d = ctx.data
        if not dataclasses.is_dataclass(d):
            d = d.materialize()  # a NodeView (rows of the shared dataset): poison a copy of its own
        if self.kind == "label_flip":
            data = dataclasses.replace(d, train_y=atk.flip_labels(d.train_y, ctx.num_classes))
        else:
            from lowband.seeding import torch_gen

            x, y = atk.backdoor_data(d.train_x, d.train_y, self.cfg.target, self.cfg.poison_fraction,
                                     torch_gen(self.seed, "byzantine", "backdoor", ctx.node))
            data = dataclasses.replace(d, train_x=x, train_y=y)
        return dataclasses.replace(ctx, data=data)

    # -- the attacker's messages ------------------------------------------------------------
    def transform(self, u: torch.Tensor, ctx: Any, index: int) -> torch.Tensor:
        """The update the attacker sends in place of its honest update ``u`` (flat)."""
        k = self.kind
        if k == "sign_flip":
            return atk.sign_flip(u, self.cfg.coefficient)
        if k == "scaling":
            return atk.scaling(u, self.cfg.coefficient)
        if k == "gaussian":
            return atk.gaussian(u, self.cfg.sigma, ctx.rng("byzantine", "gaussian", index))
        if k == "model_replacement":
            n = len(ctx.participants) if ctx.node >= 0 and not ctx.neighbors else len(ctx.neighbors) + 1
            return atk.boost(u, self.cfg.gamma if self.cfg.gamma is not None else float(max(n, 1)))
        return u  # label_flip: the poisoned training is the attack; alie / ipm: at the aggregator

    def attack_outbox(self, ctx: Any, state_before: Any, inbox: list, outbox: Any) -> Any:
        from lowband.algorithms.base import Outbox
        from lowband.comm.message import Message

        if self.kind in atk.OMNISCIENT_KINDS or self.kind == "label_flip":
            return outbox
        server_model = next((e.msg.tensors for e in inbox if e.src == SERVER and e.msg.kind == "weights"), None)
        own = state_before.get("params") if isinstance(state_before, dict) else None
        out = Outbox()
        for index, (dsts, msg) in enumerate(outbox.items):
            if msg.kind not in ATTACKED_KINDS:
                out.items.append((dsts, msg))
                continue
            ref = None
            if msg.kind == "weights" and self.cfg.on == "update":
                ref = server_model if server_model is not None else own
                if ref is not None and _same(msg.tensors, ref):
                    ref = ctx.init_params()
            names = [k for k, v in msg.tensors.items() if v.is_floating_point() and (ref is None or k in ref)]
            if not names:
                out.items.append((dsts, msg))
                continue
            base = {k: (ref[k].to(torch.float32) if ref is not None else torch.zeros_like(msg.tensors[k],
                                                                                          dtype=torch.float32))
                    for k in names}
            u = torch.cat([(msg.tensors[k].to(torch.float32) - base[k]).reshape(-1) for k in names])
            v = self.transform(u, ctx, index)
            tensors = dict(msg.tensors)
            i = 0
            for k in names:
                t = msg.tensors[k]
                tensors[k] = (base[k] + v[i:i + t.numel()].reshape(t.shape)).to(t.dtype)
                i += t.numel()
            out.items.append((dsts, Message(msg.kind, tensors, dict(msg.meta), dict(msg.declared),
                                            dict(msg.stand_in))))
        return out


def _reads(kind: str) -> tuple[str, ...]:
    from lowband.attacks.config import READS

    return READS[kind]


def _same(a: dict, b: dict) -> bool:
    return all(k in b and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())


class AttackedStep:
    """A step function that runs the attack on attacker nodes (see the module docstring)."""

    def __init__(self, fn: Any, attack: Attack):
        self.fn, self.attack = fn, attack

    def __call__(self, ctx: Any, state: Any, inbox: list) -> Any:
        if ctx.node not in self.attack.attackers:
            return self.fn(ctx, state, inbox)
        new_state, outbox = self.fn(self.attack.poisoned(ctx), state, inbox)
        return new_state, self.attack.attack_outbox(ctx, state, inbox, outbox)


class AttackedSteps:
    """``alg.steps`` with every step's function wrapped in :class:`AttackedStep`."""

    def __init__(self, alg: Any, attack: Attack):
        self.alg, self.attack = alg, attack

    def __call__(self, round: int, plan: Any) -> list:
        from lowband.algorithms.base import Step

        n = getattr(self.alg, "num_nodes", None)
        if n is not None and max(self.attack.nodes) >= n:
            raise ValueError(f"faults.byzantine: attackers {list(self.attack.nodes)} chosen among "
                             f"data.num_clients nodes, but the federation has {n}; list the nodes explicitly")
        steps = type(self.alg).steps(self.alg, round, plan)
        return [Step(s.name, s.actors, AttackedStep(s.fn, self.attack)) for s in steps]


class Adversary:
    """The omniscient attacks' stage of the aggregation hook: each attacker's row becomes
    the crafted vector (``alie``: mu - z sigma, ``ipm``: -epsilon mu) over the honest rows of
    the same aggregation, then the configured rule (or the weighted mean) runs."""

    def __init__(self, inner: Optional[Any], attack: Attack):
        from lowband.aggregation.rules import Mean

        self.defended = inner is not None
        self.inner = inner if inner is not None else Mean()
        self.attack = attack
        self.name = self.inner.name

    def min_inputs(self) -> int:
        return self.inner.min_inputs()

    def needs(self) -> str:
        return self.inner.needs()

    def __repr__(self) -> str:
        return repr(self.inner) if self.defended else "none"  # the plain mean: no defence

    def __call__(self, inp: AggregationInput, rng: torch.Generator) -> Any:
        bad = [i for i, s in enumerate(inp.senders) if s in self.attack.attackers and s != inp.node]
        good = [i for i in range(inp.n) if i not in bad]
        if bad and good:
            honest = inp.updates[good]
            if self.attack.kind == "alie":
                z = self.attack.cfg.z if self.attack.cfg.z is not None else atk.alie_z(inp.n, len(bad))
                crafted = atk.alie(honest, z)
            else:
                crafted = atk.ipm(honest, self.attack.cfg.epsilon)
            x = inp.updates.clone()
            x[bad] = crafted
            inp = dataclasses.replace(inp, updates=x)
        return self.inner(inp, rng)


def build_attack(exp: Any, num_nodes: int) -> Optional[Attack]:
    """The run's :class:`Attack` from ``exp.faults.byzantine``, or None."""
    cfg = getattr(exp.faults, "byzantine", None)
    if cfg is None:
        return None
    attackers = atk.choose_attackers(num_nodes, exp.seed, cfg.nodes, cfg.fraction)
    return Attack(cfg, attackers, exp.seed)


def install(exp: Any, alg: Any, num_nodes: int) -> Optional[Attack]:
    """Refuse what the attack cannot do (ConfigError, one line), else wrap ``alg``'s steps
    (and, for the omniscient attacks, its aggregation); call after the aggregation rule is
    installed (lowband.aggregation.install). Returns the attack (None without one)."""
    from lowband.config.schema import ConfigError

    attack = build_attack(exp, num_nodes)
    if attack is None:
        return None
    bad = [i for i in attack.nodes if i >= num_nodes]
    if bad:
        raise ConfigError(f"faults.byzantine.nodes: {bad} are not nodes of this run (0..{num_nodes - 1})")
    if len(attack.nodes) >= num_nodes:
        raise ConfigError(f"faults.byzantine: every node attacks ({num_nodes}); leave at least one honest node")
    if attack.kind in atk.OMNISCIENT_KINDS:
        if not getattr(alg, "aggregation_hook", False):
            raise ConfigError(f"faults.byzantine.kind: {attack.kind!r} crafts its update from the honest updates "
                              f"at the aggregation hook, which {alg.name} does not use; choose a sender-side kind "
                              f"({', '.join(atk.SENDER_KINDS)})")
        alg.aggregation = Adversary(getattr(alg, "aggregation", None), attack)
    alg.steps = AttackedSteps(alg, attack)
    alg.attack = attack
    return attack


__all__ = ["Adversary", "Attack", "AttackedStep", "AttackedSteps", "build_attack", "install"]
