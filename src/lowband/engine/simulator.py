"""The round loop: config -> federation -> topology -> algorithm -> network -> evaluator -> run log.

``Simulation(exp).run()`` executes an experiment. Per round ``r`` (1-based):

1. the topology gives the round plan (sampled clients, the peer graph, the contacts);
2. the algorithm gives the round's steps; for each step the executor runs the step's
   function on every actor, and the network encodes, counts and delivers every message
   the actors sent;
3. every ``eval.every`` rounds the evaluator measures the named protocols;
4. one line goes to metrics.jsonl (deterministic), one to timing.jsonl, and a checkpoint
   is written, so ``resume=True`` continues to the identical result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

import torch

from lowband.algorithms import ALGORITHMS
from lowband.algorithms.base import SERVER, Algorithm, Envelope, Outbox
from lowband.comm.ledger import Ledger
from lowband.comm.network import CodecConfig, Network
from lowband.config import Experiment, hyperparams
from lowband.data.federation import Federation, build_federation
from lowband.data.sources import load_dataset
from lowband.engine.evaluation import Evaluator, default_protocols
from lowband.engine.executor import NodeEnv, ServerData, make_executor
from lowband.engine.runlog import RunLog, summarize
from lowband.models import MODELS, build_model, count_params
from lowband.seeding import derive_seed
from lowband.topology import RoundPlan, Topology, build_topology
from lowband.train import get_params

DEFAULT_TOPOLOGY = {"server": "star", "peer": "kregular", "oneshot": "contact_plan", "local": "star"}


def make_federation(exp: Experiment) -> Federation:
    """Load the dataset and split it among the nodes as the config says."""
    d = exp.data
    ds = load_dataset(d.dataset, d.data_dir, download=d.download, **d.options)
    return build_federation(
        ds, num_clients=d.num_clients, partition=d.partition, alpha=d.alpha, min_size=d.min_size,
        classes_per_client=d.classes_per_client, samples_per_client=d.samples_per_client,
        split=tuple(d.split), public_size=d.public_size, seed=exp.seed,
    )


def make_topology(exp: Experiment, family: str, num_nodes: int) -> Topology:
    """The topology of the config, or the algorithm family's default."""
    t = exp.topology
    kind = t.kind or DEFAULT_TOPOLOGY[family]
    if family == "local" and t.kind is None:
        return build_topology("star", num_nodes, exp.seed, sampling="all")
    params: dict[str, Any] = {}
    if kind == "star":
        params = {"sampling": t.sampling, "fraction": t.fraction}
        if t.count is not None:
            params["count"] = t.count
        if t.schedule is not None:
            params["schedule"] = t.schedule
    elif kind == "kregular":
        params = {"k": t.k, "time_varying": t.time_varying}
    elif kind == "ring":
        params = {"k": 1 if "k" not in t.model_fields_set else t.k}
    elif kind == "erdos_renyi":
        params = {"p": t.p, "time_varying": t.time_varying}
    elif kind == "contact_plan":
        if t.per_round is not None:
            params["per_round"] = t.per_round
        if t.plan_file is not None:
            params["path"] = t.plan_file
    return build_topology(kind, num_nodes, exp.seed, **params)


def model_options(exp: Experiment, fed: Federation) -> dict[str, Any]:
    """Model builder options: the config's, plus what the data dictates (vocabulary size)."""
    opts = exp.model.options()
    info = MODELS[exp.model.name]
    accepted = getattr(info, "kwargs", {}) or {}
    if "vocab_size" in accepted and "vocab_size" not in opts and "vocab_size" in fed.meta:
        opts["vocab_size"] = fed.meta["vocab_size"]
    return opts


@dataclass
class RunResult:
    run_dir: str
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]


class Simulation:
    """One experiment, end to end. ``progress(round, total, record)`` is called after
    each evaluated round (the CLI draws its bar with it)."""

    def __init__(self, exp: Experiment, *, resume: bool = False,
                 progress: Optional[Callable[[int, int, dict[str, Any]], None]] = None,
                 federation: Optional[Federation] = None, write: bool = True):
        self.exp = exp
        self.resume = resume
        self.progress = progress
        self.write = write
        if exp.threads:
            torch.set_num_threads(exp.threads)
        self.alg: Algorithm = ALGORITHMS[exp.algorithm.name](hyperparams(exp))
        self.fed = federation if federation is not None else make_federation(exp)
        self.num_nodes = len(self.fed.nodes)
        self.topology = make_topology(exp, self.alg.family, self.num_nodes)
        self.ledger = Ledger()
        self.network = Network(
            CodecConfig(default=exp.comm.codec, by_kind=dict(exp.comm.by_kind), by_direction=dict(exp.comm.by_direction)),
            self.ledger, exp.seed,
        )
        opts = model_options(exp, self.fed)
        name = exp.model.name
        num_classes, input_shape = self.fed.num_classes, tuple(self.fed.input_shape)

        def factory(node: int) -> torch.nn.Module:
            return build_model(name, num_classes=num_classes, input_shape=input_shape, **opts)

        @lru_cache(maxsize=8)
        def init_for(key: str) -> dict[str, torch.Tensor]:
            m = build_model(name, num_classes=num_classes, input_shape=input_shape,
                            seed=derive_seed(exp.seed, "init", key), **opts)
            return get_params(m)

        self.model_size = count_params(factory(0))
        env = NodeEnv(
            algorithm=self.alg, node_data=list(self.fed.nodes),
            server_data=ServerData(self.fed.public_x, self.fed.public_y), seed=exp.seed,
            num_classes=num_classes, model_factory=factory, model_key=lambda n: name,
            init_params=lambda n: {k: v.clone() for k, v in init_for(name).items()},
            public_x=self.fed.public_x if self.fed.public_x.numel() else None,
        )
        self.executor = make_executor(exp.executor, env)
        self.protocols = default_protocols(self.alg, self.fed, exp.eval.protocols)
        self.main_metric = exp.eval.main or self._default_main()
        self.evaluator = Evaluator(self.protocols, self.alg, self.executor, self.num_nodes,
                                   self.fed.global_test_x, self.fed.global_test_y, exp.eval.batch_size)

    def _default_main(self) -> str:
        main = self.alg.default_main
        prefix = main.split("/")[0]
        if prefix in self.protocols:
            return main
        for p, key in (("consensus", "consensus/acc"), ("global", "global/acc"),
                       ("personal", "personal/acc_weighted"), ("node_global", "node_global/acc")):
            if p in self.protocols:
                return key
        return main

    # -- messaging ------------------------------------------------------------------
    def route(self, round: int, outboxes: dict[int, Outbox]) -> dict[int, list[Envelope]]:
        """Encode, count and deliver every message; returns the receivers' inboxes."""
        inboxes: dict[int, list[Envelope]] = {}
        for src in sorted(outboxes):
            for dsts, msg in outboxes[src].items:
                if src == SERVER:
                    direction = "down"
                elif len(dsts) == 1 and dsts[0] == SERVER:
                    direction = "up"
                else:
                    if SERVER in dsts:
                        raise ValueError("a broadcast may not mix the server and peers")
                    direction = "peer"
                if len(dsts) == 1:
                    delivered = {dsts[0]: self.network.send(msg, src, dsts[0], round=round, direction=direction)}
                else:
                    delivered = self.network.broadcast(msg, src, list(dsts), round=round, direction=direction)
                for dst, m in delivered.items():
                    inboxes.setdefault(dst, []).append(Envelope(src, m))
        return inboxes

    # -- bytes -------------------------------------------------------------------------
    def byte_record(self, round: int) -> dict[str, int]:
        rec: dict[str, int] = {}
        tot_e = tot_d = 0
        for direction in ("up", "down", "peer"):
            e, d = self.ledger.totals(direction=direction)
            rec[f"bytes/{direction}"] = int(e)
            rec[f"declared/{direction}"] = int(d)
            tot_e += int(e)
            tot_d += int(d)
        rec["bytes/total"] = tot_e
        rec["declared/total"] = tot_d
        return rec

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> RunResult:
        exp = self.exp
        log = RunLog.open(exp, resume=self.resume) if self.write else None
        start = 0
        ckpt = log.load_checkpoint() if (log is not None and self.resume) else None
        if ckpt is not None:
            start = int(ckpt["round"])
            self.executor.load_state_dict(ckpt["states"])
            self.ledger.load_state_dict(ckpt["ledger"])
            log.truncate_after(start)
        else:
            if log is not None:
                log.truncate_after(-1)
            self.executor.init_states(self.topology.plan(0) if self.num_nodes else None)
        metrics: list[dict[str, Any]] = log.metrics() if log is not None else []
        t_run = time.perf_counter()

        if start == 0 and exp.eval.at_round0:
            rec = self._evaluate(0, self.topology.plan(0))
            metrics.append(rec)
            if log is not None:
                log.log_metrics(rec)
            if self.progress:
                self.progress(0, exp.rounds, rec)

        for r in range(start + 1, exp.rounds + 1):
            t0 = time.perf_counter()
            plan = self.topology.plan(r - 1)  # topology rounds are 0-based
            inboxes: dict[int, list[Envelope]] = {}
            for step in self.alg.steps(r, plan):
                outboxes = self.executor.run_step(step, r, plan, inboxes)
                inboxes = self.route(r, outboxes)
            t_train = time.perf_counter() - t0
            t1 = time.perf_counter()
            if r % exp.eval.every == 0 or r == exp.rounds:
                rec = self._evaluate(r, plan)
                metrics.append(rec)
                if log is not None:
                    log.log_metrics(rec)
                if self.progress:
                    self.progress(r, exp.rounds, rec)
            t_eval = time.perf_counter() - t1
            if log is not None:
                log.log_timing({"round": r, "round_s": round(t_train, 4), "eval_s": round(t_eval, 4),
                                "elapsed_s": round(time.perf_counter() - t_run, 3)})
                if exp.checkpoint_every and (r % exp.checkpoint_every == 0 or r == exp.rounds):
                    log.save_checkpoint({"round": r, "states": self.executor.state_dict(),
                                         "ledger": self.ledger.state_dict()})

        summary = summarize(
            metrics, main=self.main_metric, target=exp.eval.target,
            extra={"name": exp.name, "algorithm": exp.algorithm.name, "dataset": exp.data.dataset,
                   "model": exp.model.name, "model_params": self.model_size, "num_nodes": self.num_nodes,
                   "seed": exp.seed, "protocols": self.protocols, **self._ledger_summary()},
        )
        if log is not None:
            log.write_summary(summary)
        return RunResult(str(log.dir) if log else "", summary, metrics)

    def _evaluate(self, r: int, plan: RoundPlan) -> dict[str, Any]:
        rec: dict[str, Any] = {"round": r}
        rec.update(self.evaluator(r, plan))
        rec.update(self.byte_record(r))
        return rec

    def _ledger_summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for direction in ("up", "down", "peer"):
            e, d = self.ledger.totals(direction=direction)
            out[f"bytes_{direction}"] = int(e)
            out[f"declared_bytes_{direction}"] = int(d)
        return out


def run(exp: Experiment, **kwargs: Any) -> RunResult:
    """Run an experiment (see :class:`Simulation`)."""
    return Simulation(exp, **kwargs).run()
