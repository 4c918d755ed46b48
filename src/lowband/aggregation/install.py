"""The driver's side of ``[aggregation]`` and ``[faults.byzantine]``: refuse, install, count.

What a run does with them, in order (a driver calls these; nothing here runs by itself):

1. :func:`check` (before any work): refuses a rule on an algorithm whose aggregation does
   not go through the hook (``Algorithm.aggregation_hook`` False: its server needs the
   individual updates), and, given the round-0 plan, a rule that the plan's inputs cannot
   serve (a server with fewer sampled clients, or a peer with fewer neighbours, than the
   rule needs). Raises :class:`~lowband.config.ConfigError` (one line, exit 2).
2. :func:`install` sets ``alg.aggregation`` (it reaches every node's context through the
   executor) before the executor ships the algorithm anywhere.
3. :class:`RobustnessRecorder`: at the end of each round it drains every place's counters
   (``executor.map_places(drain_place, nodes)``) into a per-round dict the driver adds to
   that round's incidents (summed into the next metrics line and the summary, checkpointed
   with them).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from lowband.aggregation.base import drain_place, merge_counts
from lowband.aggregation.config import build_rule


def check(exp: Any, alg: Any, plan: Any = None) -> None:
    """Refuse (ConfigError, one line) what ``[aggregation]`` cannot serve; see the module docstring."""
    from lowband.config.schema import ConfigError

    cfg = getattr(exp, "aggregation", None)
    rule = build_rule(cfg)
    if rule is None:
        return
    if not getattr(alg, "aggregation_hook", False):
        raise ConfigError(f"aggregation.rule: {alg.name} aggregates individual updates its own way (its server or "
                          f"peers need each sender's message), so a rule {rule.name!r} cannot be applied; drop "
                          f"[aggregation] or use a method that averages models (fedavg, fedprox, scaffold, dfedavg, "
                          f"dpsgd, oneshot_fedavg ...)")
    if plan is None:
        return
    need = rule.min_inputs()
    if alg.family == "server":
        got, where = len(plan.participants), "clients per round"
    else:
        degs = [len(plan.neighbors.get(i, ())) for i in plan.participants] or [0]
        got, where = min(degs) + 1, "nodes in the smallest closed neighbourhood"
    if got < need:
        raise ConfigError(f"aggregation: {rule.needs()} ({rule!r}), but round 1 has {got} {where}; lower "
                          f"aggregation.f or raise the participants")


def install(exp: Any, alg: Any) -> Optional[Any]:
    """Set ``alg.aggregation`` from ``exp.aggregation`` (None when no rule), then install
    ``[faults.byzantine]`` (lowband.attacks.wrapper.install: wraps the attackers' steps, and
    for the omniscient attacks the aggregation) with the attackers drawn among
    ``data.num_clients`` nodes; returns the rule. Idempotent on one algorithm object."""
    if getattr(alg, "_robust_installed", False):
        return alg.aggregation
    rule = build_rule(getattr(exp, "aggregation", None))
    alg.aggregation = rule
    if getattr(getattr(exp, "faults", None), "byzantine", None) is not None:
        from lowband.attacks.wrapper import install as install_attack

        install_attack(exp, alg, exp.data.num_clients)
    alg._robust_installed = True
    return alg.aggregation


class RobustnessRecorder:
    """Moves the rules' counters from the places to the driver, round by round."""

    def __init__(self, num_nodes: int, has_server: bool):
        self.nodes: list[int] = list(range(num_nodes)) + ([-1] if has_server else [])

    def drain(self, executor: Any) -> dict[int, dict[str, float]]:
        """round -> ``robust/<rule>/<counter>`` -> count, from every place (empties them)."""
        parts: Iterable[Any] = executor.map_places(drain_place, self.nodes)
        return merge_counts(list(parts))


__all__ = ["RobustnessRecorder", "check", "install"]
