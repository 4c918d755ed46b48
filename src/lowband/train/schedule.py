"""Learning-rate schedules, written once for every algorithm."""

from __future__ import annotations


def decayed_lr(lr: float, lr_decay: float, round: int) -> float:
    """The learning rate of round ``round`` (1-based) under exponential decay per round:
    ``lr * lr_decay ** (round - 1)``, ``lr`` itself in round 1 and before (round 0: set-up
    work such as pre-training). Every algorithm's ``lr_decay`` knob means this."""
    return lr * lr_decay ** max(round - 1, 0)
