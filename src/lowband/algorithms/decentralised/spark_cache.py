"""SPARK's caches and memory plan: performance only, no number depends on them.

- :meth:`SparkCaches.xp`: each node's weight-independent ``X P1`` (Gaussian ``P`` with the
  MLP) computed once per node and run and kept across rounds and requester groups
  (:class:`~lowband.algorithms.decentralised.ntk_cache.XPCache`: RAM up to ``xp_cache_mb``,
  then memory-mapped files in ``scratch_dir`` or the run folder's ``scratch/`` up to
  ``xp_cache_disk_mb``; float32 by default, so results are identical with or without it).
- :meth:`SparkCaches.lift`: ``w0 + P theta_bar_i``, which every responder of requester i
  computes, once per process and round
  (:class:`~lowband.algorithms.decentralised.ntk_cache.LiftCache`).
- :func:`memory_groups`: as many requester groups as keep one group's projected Jacobians
  and the steps' working memory within ``max_inflight_mb`` (SPARK at the paper's size moves
  14 GB of them per round), so that the process stays within its base (data, model, ``P``)
  plus ``xp_cache_mb`` plus ``max_inflight_mb`` (measured: benchmarks/README.md, "SPARK
  within its memory budgets").

Neither cache is state: a resumed run or a worker process rebuilds them (they pickle empty).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, Optional

import torch

from lowband.algorithms.base import NodeContext, Params
from lowband.algorithms.decentralised.ntk_cache import LiftCache, XPCache
from lowband.topology import RoundPlan


class SparkCaches:
    """The ``X P`` and lift caches of one run (budgets read from ``alg.hp`` at first use)."""

    def __init__(self, alg: Any) -> None:
        self.alg = alg
        self._xp_cache: Optional[XPCache] = None
        self.lifts: Optional[LiftCache] = None

    def xp_cache(self) -> XPCache:
        """This run's :class:`XPCache` (files in ``scratch_dir``, else the run folder's ``scratch/``)."""
        if self._xp_cache is None:
            hp = self.alg.hp
            folder = hp.scratch_dir or self.alg.scratch_root
            self._xp_cache = XPCache(hp.xp_cache_mb, hp.xp_cache_disk_mb if folder else 0.0, folder, hp.xp_cache_dtype)
        return self._xp_cache

    def xp(self, ctx: NodeContext, key: Hashable, compute: Callable[[torch.Tensor], Any],
           idx: Optional[torch.Tensor]) -> Any:
        """``X P1`` for this round's rows ``idx`` (None: all) of the node's data: computed on all
        its training inputs once per run, so a node's numbers do not depend on whether its
        product was cached."""
        q = self.xp_cache().get((ctx.node, key), ctx.data.train_x, compute)
        if idx is None:
            return q
        if isinstance(q, torch.Tensor):
            return q[idx]
        return q[idx.numpy()]

    def lift(self, round: int, key: Hashable, theta: torch.Tensor,
             lift: Callable[[torch.Tensor], Params]) -> Params:
        """``lift(theta)`` from this round's :class:`LiftCache` (the same bytes; the dict is
        shared, read-only)."""
        if self.lifts is None:
            self.lifts = LiftCache()
        return self.lifts.get(round, key, theta, lift)


#: rows and classes per reply in the estimate (the paper's setting: ~200 samples x 10 classes)
EST_ROWS, EST_CLASSES = 200, 10
#: the share of ``max_inflight_mb`` kept for the steps' working memory beside the replies (an
#: ``X P`` product being computed and two being written, a requester's stacked Jacobians, its
#: kernel and evolution, the allocator's slack between freed and new message buffers). Half:
#: at 100 nodes 0.4 kept the process within base + budgets but 0.12 GiB over 4 GiB, 0.2 over
#: both (benchmarks/README.md, "SPARK within its memory budgets")
WORKING_SHARE = 0.5


def inflight_bytes(hp: Any, plan: RoundPlan) -> float:
    """An estimate of the bytes of all the round's projected Jacobian replies: one per directed
    edge and each requester's own. A step holds a group's replies about once: the engine
    frees each sender's tensors as it encodes them (``send(consume=True)``), and each
    received message's bytes as it decodes them; each requester's own reply is dropped
    after its update."""
    n = len(plan.participants)
    edges = sum(len(v) for v in plan.neighbors.values())
    # as many columns as coordinates (a concatenated layout: up to 3 k, e.g. 2.11 k for the MLP)
    width = hp.k * (1 if hp.projection_layout == "sum" else 3)
    return (edges + n) * EST_ROWS * EST_CLASSES * width * 4 * hp.sample_fraction


def memory_groups(hp: Any, plan: RoundPlan) -> int:
    """As many requester groups as keep one group's projected Jacobians within the part of
    ``max_inflight_mb`` left beside the steps' working memory (:data:`WORKING_SHARE`)."""
    n = len(plan.participants)
    room = (1.0 - WORKING_SHARE) * hp.max_inflight_mb * 1e6
    return max(1, min(n, int(math.ceil(inflight_bytes(hp, plan) / room))))
