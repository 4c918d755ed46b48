"""Where a run's steps execute: the one place that chooses the backend.

- ``serial``: every node's work in this process (:class:`~lowband.engine.executor.SerialExecutor`);
- ``pool``: local worker processes (:class:`~lowband.engine.pool.PoolExecutor`), chosen when
  ``[engine] workers`` asks for more than one, or ``"auto"`` finds the federation big enough
  to pay on a machine with several cores (:func:`~lowband.engine.pool.resolve_workers`);
- ``ray``: shard actors on a Ray cluster (:class:`~lowband.engine.ray_executor.RayExecutor`,
  extra ``lowband[ray]``), when ``executor = "ray"``.

Backends decide where a batch of step calls runs, never what it computes: results are
byte-identical across them (docs/engine.md). This module imports the backends; they import
the executor and the round loop, never this module, so the engine has no import circle.
"""

from __future__ import annotations

from typing import Any, Optional

from lowband.config.schema import Experiment
from lowband.engine.executor import Executor, NodeEnv, SerialExecutor


def make_executor(kind: str, env: NodeEnv, **options: Any) -> Executor:
    """The executor named ``kind`` ("serial"; "pool": local worker processes,
    ``[engine] workers``; "ray" with the ray extra)."""
    if kind == "serial":
        return SerialExecutor(env)
    if kind == "pool":
        from lowband.engine.pool import PoolExecutor

        return PoolExecutor(env, **options)
    if kind == "ray":
        try:
            from lowband.engine.ray_executor import RayExecutor  # type: ignore[import-not-found]
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ValueError(f"executor 'ray' is not available ({exc}); install it with pip install 'lowband[ray]'") from None
        return RayExecutor(env, **options)
    raise ValueError(f"unknown executor {kind!r}; available: serial, ray")


def choose_executor(exp: Experiment, env: NodeEnv, *, auto_ok: bool, model_size: int,
                    train_samples: int) -> tuple[Executor, Optional[int]]:
    """The run's executor and its number of local worker processes (None under Ray).

    ``executor = "ray"`` gets Ray's shard actors; otherwise ``[engine] workers`` local
    processes, 1 meaning serially in this process. ``auto_ok``: whether more than one
    worker may be used at all (a CPU run, and ``workers = "auto"`` only for an algorithm
    that allows it); ``model_size`` x ``train_samples`` is the work ``"auto"`` weighs."""
    if exp.executor == "ray":
        options = {"address": exp.ray_address, "num_workers": exp.ray_workers,
                   "num_cpus": exp.ray_num_cpus, "threads": exp.threads}
        return make_executor("ray", env, **options), None
    from lowband.engine.pool import resolve_workers

    workers = 1 if not auto_ok else resolve_workers(exp.engine.workers, exp.threads, env.num_nodes, model_size,
                                                    train_samples)
    if workers > 1:
        return make_executor("pool", env, num_workers=workers, threads=exp.threads), workers
    return make_executor(exp.executor, env), workers
