"""Which way a metric improves: the one rule that rounds-to-target, Pareto fronts and the
config's target check share (no imports: the config module uses it too)."""

from __future__ import annotations

from typing import Optional


def higher_is_better(metric: Optional[str]) -> bool:
    """Whether a larger value of ``metric`` is better: accuracies yes; losses and spreads
    (``*/loss``, ``node_global/acc_std``) no, so targets are reached from above and Pareto
    fronts minimise them."""
    m = str(metric or "")
    return not (m.endswith("loss") or m.endswith("_std"))


def reaches(metric: str, value: float, target: float) -> bool:
    """Whether ``value`` of ``metric`` meets ``target``: at least it for an accuracy, at most
    it for a loss or spread (a loss target read as "at least" would be met by the untrained
    model at round 0)."""
    return value >= target if higher_is_better(metric) else value <= target
