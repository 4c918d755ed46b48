"""Aggregation-time transforms: robust rules (and, composing on the same hook, central DP).

One documented place for every algorithm (docs/aggregation.md): an algorithm averages what
it received through ``ctx.aggregate`` / ``ctx.aggregate_updates``
(:class:`~lowband.algorithms.base.NodeContext`, implemented in
:mod:`lowband.aggregation.base`); ``[aggregation]`` (:mod:`lowband.aggregation.config`)
picks the rule (:mod:`lowband.aggregation.rules`); the driver side (refusals, counters into
metrics and summary, attackers) is :mod:`lowband.aggregation.install`. Kept free of imports
so that the config schema can import its section without loading torch.
"""
