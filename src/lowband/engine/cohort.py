"""The executor side of vectorised cohorts: run a :class:`~lowband.train.cohort.LocalSGDStep`
over a step's actors, their supported jobs trained together (:func:`lowband.train.cohort.train_cohort`),
with the per-node seeding, states, outboxes and divergence reports of the per-node path.
The training itself (the job, the rule, the cohort trainers) is in :mod:`lowband.train.cohort`;
its public names are re-exported here for the engine's callers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from lowband.seeding import derive_seed, seed_torch
from lowband.train.cohort import (MODES, LocalSGDStep, SGDJob, cohort_methods, cohort_size, local_sgd_step,
                                  mlp_layers, train_cohort, unsupported, vectorised)
from lowband.train.sgd import diverged_count, note_divergence

if TYPE_CHECKING:  # pragma: no cover
    from lowband.algorithms.base import Envelope, Outbox, Step


def _group_key(job: SGDJob, arch: str) -> tuple:
    return (arch, job.batch_size, float(job.lr), float(job.momentum), bool(job.nesterov and job.momentum > 0),
            float(job.weight_decay), job.grad_clip, str(job.x.device), job.x.dtype)


def run_step(executor: Any, step: "Step", round: int, plan: Any,
             inboxes: dict[int, list["Envelope"]], mode: str) -> dict[int, "Outbox"]:
    """``SerialExecutor.run_step`` for a :class:`~lowband.train.cohort.LocalSGDStep`: the same
    per-node seeding, states, outboxes and divergence reports, with the supported jobs
    trained in cohorts and the others on the per-node path."""
    from lowband.engine.inbox import own_inbox

    prepare, finish = cohort_methods(step.fn)  # type: ignore[misc]
    env = executor.env
    pending: dict[int, tuple[Any, Any, list, SGDJob, torch.Tensor]] = {}
    groups: dict[tuple, list[int]] = {}  # per group: its prepared members not trained yet
    sizes: dict[tuple, int] = {}
    done: dict[int, tuple[Any, "Outbox"]] = {}
    diverged: set[int] = set()

    def train(chunk: list[int]) -> None:
        model = pending[chunk[0]][0].model
        gens = [torch.Generator() for _ in chunk]
        for g, n in zip(gens, chunk):  # the global RNG as the step's own path would train with it
            g.set_state(pending[n][4])
        for node, g, (params, stats) in zip(chunk, gens, train_cohort(model, [pending[n][3] for n in chunk], gens)):
            # finished at once: the node's old state and its job are dropped before the
            # next cohort trains (memory: two sets of all nodes' weights are never held)
            ctx, state, inbox, _, _ = pending.pop(node)
            torch.set_rng_state(g.get_state())  # where the step's own path would be after training
            before = diverged_count()
            if stats.samples and not math.isfinite(stats.loss):
                note_divergence()
            done[node] = finish(ctx, state, inbox, params, stats)
            if diverged_count() != before:
                diverged.add(node)
            executor.states[node] = done[node][0]
            del ctx, state, inbox, params

    for node in step.actors:
        seed_torch(derive_seed(env.seed, "torch", round, node, step.name))
        ctx = executor.context(node, round, plan)
        state, inbox = executor.states[node], own_inbox(inboxes, node)
        before = diverged_count()
        job = prepare(ctx, state, inbox)
        if unsupported(ctx.model, job, mode) is not None:  # exactly the step's own path
            params, stats = job.run(ctx.model)
            done[node] = finish(ctx, state, inbox, params, stats)
            if diverged_count() != before:
                diverged.add(node)
            executor.states[node] = done[node][0]
            continue
        pending[node] = (ctx, state, inbox, job, torch.get_rng_state())
        key = _group_key(job, env.model_key(node))
        if key not in sizes:
            sizes[key] = cohort_size(ctx.model, job.x.device)
        members = groups.setdefault(key, [])
        members.append(node)
        del ctx, state, inbox, job
        if len(members) == sizes[key]:
            # trained as soon as a cohort is full (the cohorts of the whole-step loop: a
            # group's members in actor order, ``size`` at a time), so at most one cohort's
            # jobs (their data, gathered from the shared dataset) are held per group
            groups[key] = []
            train(members)
    for members in groups.values():
        if members:
            train(members)
    executor.diverged.extend((round, n) for n in step.actors if n in diverged)
    return {node: done[node][1] for node in step.actors}


def vectorised(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a step the cohort path can take (a marked, bound step method)."""
    return cohort_methods(fn) is not None


__all__ = ["MODES", "LocalSGDStep", "SGDJob", "cohort_size", "local_sgd_step", "mlp_layers", "run_step",
           "train_cohort", "unsupported", "vectorised"]
