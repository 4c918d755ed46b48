"""The round driver: config -> federation -> topology -> algorithm -> network -> evaluator -> run log.

``Simulation(exp).run()`` executes an experiment. Per round ``r`` (1-based) the driver
plays **plan -> steps -> play -> evaluate -> record**:

1. *plan*: the topology gives the round plan (sampled clients, the peer graph, the contacts);
2. *steps*: the algorithm gives the round's steps for the plan;
3. *play*: :class:`~lowband.engine.rounds.RoundLoop` plays them on the backend (the one
   round loop of every backend): each step's function runs on every actor where the
   actor lives, and every message the actors sent is encoded, counted and delivered;
4. *evaluate*: every ``eval.every`` rounds the backend measures the named protocols;
5. *record*: one line goes to metrics.jsonl (deterministic).

Everything else is an observer (:mod:`lowband.engine.observers`), called at named hooks
of this loop: faults and link time narrow or time the round, refusals and divergences
are counted, watches warn, timing.jsonl and checkpoints are written, a resumed run is
restored, progress bars and TensorBoard look on. The driver knows none of them; a new
one is passed as ``Simulation(exp, observers=[...])``. docs/engine.md has the picture.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from lowband.algorithms import ALGORITHMS
from lowband.algorithms.base import Algorithm, Envelope, Outbox
from lowband.comm.ledger import Ledger
from lowband.comm.network import CodecConfig, Network, Transfer, link_direction  # noqa: F401 (re-exported)
from lowband.comm.validate import ExpectedShapes, ValidationPolicy, Validator
from lowband.config.schema import ConfigError, Experiment
from lowband.config.resolve import hyperparams
from lowband.data.build import load_data, make_federation  # noqa: F401 (re-exported)
from lowband.data.federation import Federation
from lowband.device import is_cpu, resolve_device, to_device
from lowband.engine import checks
from lowband.engine.errors import config_errors
from lowband.engine.evaluation import Evaluator
from lowband.engine.backends import choose_executor
from lowband.engine.executor import NodeEnv, ServerData
from lowband.engine.observers import Counters, Observer, Progress, Round, Run, default_observers
from lowband.engine.observers.privacy import privacy_observer
from lowband.engine.pool import PoolExecutor
from lowband.engine.rounds import ExecutorBackend, RoundLoop, append_records, send
from lowband.engine.rounds import deliver as deliver_items
from lowband.engine.runlog import RunLog, summarize
from lowband.faults import NO_FAULTS, RoundFaults
from lowband.models import MODELS, build_model, count_params
from lowband.seeding import derive_seed
from lowband.topology import RoundPlan, Topology, build_topology
from lowband.train import get_params

__all__ = ["Simulation", "RunResult", "run", "config_errors", "make_federation", "make_topology", "ModelBuilder"]

logger = logging.getLogger("lowband")


#: metric keys each protocol writes (see engine/evaluation.py)
PROTOCOL_METRICS = {"global": ("acc", "loss"), "personal": ("acc_weighted", "acc_mean", "acc_worst10", "loss"),
                    "personal_joined": ("acc_weighted", "acc_mean", "acc_worst10", "loss", "n"),
                    "node_global": ("acc", "acc_std", "loss"), "consensus": ("acc", "loss")}

DEFAULT_TOPOLOGY = {"server": "star", "peer": "kregular", "oneshot": "contact_plan", "local": "star"}


def _input_stats(meta: dict) -> Optional[tuple[list[float], list[float]]]:
    """The dataset's published input normalisation ``(mean, std)`` from its metadata, if any."""
    norm = meta.get("normalize") if isinstance(meta, dict) else None
    if not norm:
        return None
    return [float(v) for v in norm["mean"]], [float(v) for v in norm["std"]]


def make_topology(exp: Experiment, family: str, num_nodes: int,
                  defaults: Optional[Mapping[str, Any]] = None) -> Topology:
    """The topology of the config, or the algorithm family's default; ``defaults`` (an
    algorithm's ``default_topology``) fill the ``[topology]`` keys the config leaves unset."""
    t = exp.topology
    if defaults:
        t = t.model_copy(update={k: v for k, v in defaults.items() if k not in t.model_fields_set})
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


def model_options(exp: Experiment, fed: Federation, name: Optional[str] = None) -> dict[str, Any]:
    """Model builder options of model ``name`` (default ``model.name``): the config's, plus
    what the data dictates (vocabulary size)."""
    opts = exp.model.options()
    info = MODELS[name or exp.model.name]
    accepted = getattr(info, "kwargs", {}) or {}
    if "vocab_size" in accepted and "vocab_size" not in opts and "vocab_size" in fed.meta:
        opts["vocab_size"] = fed.meta["vocab_size"]
    return opts


def encode_outbox(network: Network, round: int, src: int, outbox: Outbox) -> list[Transfer]:
    """Encode ``src``'s outbox exactly as :meth:`Simulation.route` does (same codecs, same
    addressed generators: a broadcast is encoded once for all its receivers), without
    counting or decoding: for backends where the bytes really travel (Ray, Flower).
    Count each transfer with :meth:`Network.record` (once per receiver)."""
    return network.encode_outbox(round, src, outbox.items)


class ModelBuilder:
    """Builds the experiment's modules and their shared initial parameters.

    A plain picklable object (not a closure), so a distributed executor can ship it to its
    workers. ``builder(node)`` is a fresh module of the node's architecture,
    ``builder.key(node)`` that architecture (``mix[node % len(mix)]`` for clients of a
    mixed federation, else ``name``), ``builder.init_params(node)`` a copy of the shared
    initialisation of that architecture, seeded by ``(seed, "init", key)``: the same in
    every process.
    """

    def __init__(self, name: str, mix: list[str], num_classes: int, input_shape: tuple[int, ...],
                 options: dict[str, dict[str, Any]], seed: int, device: Optional[torch.device] = None):
        self.device = None if is_cpu(device) else device  # modules and init on the run's device
        self.name, self.mix = name, list(mix)
        self.num_classes, self.input_shape = num_classes, tuple(input_shape)
        self.options, self.seed = options, int(seed)
        self._init: dict[str, dict[str, torch.Tensor]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_init": {}}  # a worker rebuilds the (deterministic) init

    def key(self, node: int) -> str:
        return self.mix[node % len(self.mix)] if self.mix and node >= 0 else self.name

    def __call__(self, node: int) -> torch.nn.Module:
        a = self.key(node)
        m = build_model(a, num_classes=self.num_classes, input_shape=self.input_shape, **self.options[a])
        return m if self.device is None else m.to(self.device)

    def init_params(self, node: int) -> dict[str, torch.Tensor]:
        a = self.key(node)
        if a not in self._init:
            m = build_model(a, num_classes=self.num_classes, input_shape=self.input_shape,
                            seed=derive_seed(self.seed, "init", a), **self.options[a])
            self._init[a] = get_params(m if self.device is None else m.to(self.device))  # CPU init: same on any device
        return {k: v.clone() for k, v in self._init[a].items()}


@dataclass
class RunResult:
    run_dir: str
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]


class Simulation:
    """One experiment, end to end: the round driver (module docstring).

    ``observers``: more :class:`~lowband.engine.observers.Observer` s, called after the
    built-in ones (docs/engine.md: how to write one). ``backend(sim)``: builds the backend
    that holds the nodes and carries their messages instead of the executor the config
    names (the Flower adapter's). ``progress(round, total, record)`` is called after each
    evaluated round (the CLI draws its bar with it)."""

    def __init__(self, exp: Experiment, *, resume: bool = False,
                 progress: Optional[Callable[[int, int, dict[str, Any]], None]] = None,
                 federation: Optional[Federation] = None, write: bool = True,
                 observers: Sequence[Observer] = (), backend: Optional[Callable[["Simulation"], Any]] = None):
        self.exp, self.resume, self.write = exp, resume, write
        self._log: Optional[RunLog] = None  #: the run folder while :meth:`run` goes on (it holds its lock)
        self.device = _run_device(exp)
        self.alg: Algorithm = ALGORITHMS[exp.algorithm.name](hyperparams(exp))
        checks.check_experiment(exp, self.alg)  # refuse what cannot be measured, before any work
        self.fed = self._federation(federation)
        self.num_nodes = len(self.fed.nodes)
        self.alg.num_nodes = self.num_nodes
        self.alg.scratch_root = str(exp.run_dir() / "scratch") if write else None  # recomputable caches only
        with config_errors("topology"):
            self.topology = make_topology(exp, self.alg.family, self.num_nodes, self.alg.default_topology)
            self.alg.check_topology(self.topology, self.num_nodes)
        self.ledger = Ledger()
        self.builder = self._model_builder()
        self.privacy = self._privacy()  # [dp]/[secagg]: the algorithm wrapped, the senders' transform
        self.network = self._network()
        self.executor = self._executor()
        self.protocols = checks.resolve_protocols(self.alg, self.fed, exp.eval.protocols)
        self.main_metric = self._main_metric()
        with config_errors("eval"):
            self.evaluator = Evaluator(self.protocols, self.alg, self.executor, self.num_nodes,
                                       self.fed.global_test_x, self.fed.global_test_y, exp.eval.batch_size, self.topology,
                                       sample=exp.eval.nodes, seed=exp.seed, norm_factor=exp.comm.norm_factor or None)
        #: where the nodes live and how their messages move (ExecutorBackend, or the Flower adapter's)
        self.backend = backend(self) if backend is not None else ExecutorBackend(
            self.executor, self.network, self.evaluator, close_at_end=isinstance(self.executor, PoolExecutor))
        #: the one round loop; the backend decides where each step's calls run
        self.loop = RoundLoop(self.network, self.backend.places)
        #: per-round counts (rejections, faults, ...) written with the metrics; checkpointed
        self.counters = Counters()
        self._progress = Progress(progress)
        traffic = checks.TrafficWatch(  # once-per-run warnings about what crossed the links
            self.network, checks.model_message_bytes([self.builder.init_params(i) for i in range(max(1, len(self.mix)))]),
            exp.algorithm.name)
        #: the run's observers, in hook order (lowband.engine.observers.default_observers)
        self.observers: list[Observer] = default_observers(
            self, traffic=traffic, builder=self.builder, progress=self._progress,
            extra=[*privacy_observer(self.privacy), *observers],
            checkpoints=getattr(self.backend, "checkpoints", True))

    # -- building ---------------------------------------------------------------------------
    def _federation(self, given: Optional[Federation]) -> Federation:
        with config_errors("data"):
            fed = given if given is not None else make_federation(self.exp)
        return fed if is_cpu(self.device) else to_device(fed.materialize(), self.device)  # data lives where training runs

    def _model_builder(self) -> ModelBuilder:
        exp = self.exp
        self.mix = list(exp.model.mix or [])  # [model] mix: client i gets mix[i % len(mix)] (the server model.name)
        with config_errors("model"):
            builder = ModelBuilder(exp.model.name, self.mix, self.fed.num_classes, tuple(self.fed.input_shape),
                                   {a: model_options(exp, self.fed, a) for a in {exp.model.name, *self.mix}}, exp.seed,
                                   device=self.device)
            self.model_size = count_params(builder(0))
            self.model_sizes = {a: count_params(builder(i)) for i, a in enumerate(self.mix)} if self.mix else {}
        return builder

    def _privacy(self) -> Any:
        """``[dp]`` and ``[secagg]`` (lowband.privacy.build): the algorithm is re-made from its
        wrapped class (central DP, secure aggregation), the local-DP transform goes to the
        network; the epsilon schedule is planned here, so a run over ``dp.target_epsilon``
        is refused (ConfigError) before anything is written. None without privacy."""
        exp = self.exp
        if exp.dp is None and exp.secagg is None:
            return None
        from lowband.privacy.build import build_for_run

        setup = build_for_run(exp, type(self.alg), self.topology, self.num_nodes, self.builder.init_params(0))
        if setup.algorithm is not type(self.alg):
            alg = setup.algorithm(hyperparams(exp))
            alg.num_nodes, alg.scratch_root = self.alg.num_nodes, self.alg.scratch_root
            self.alg = alg
        return setup

    def _network(self) -> Network:
        exp, b = self.exp, self.builder
        with config_errors("comm"):
            policy = ValidationPolicy(on_invalid=exp.comm.on_invalid, norm_factor=exp.comm.norm_factor or None,
                                      partial_kinds=frozenset(self.alg.partial_kinds), freshness=exp.comm.freshness)
            return Network(
                CodecConfig(default=exp.comm.codec, by_kind=dict(exp.comm.by_kind), by_direction=dict(exp.comm.by_direction),
                            transform=self.privacy.transform if self.privacy is not None else ""),
                self.ledger, exp.seed, validator=Validator(policy, ExpectedShapes(b.init_params, b.key)),
                device=None if is_cpu(self.device) else self.device,
            )

    def _executor(self) -> Any:
        exp, fed, b = self.exp, self.fed, self.builder
        env = NodeEnv(
            algorithm=self.alg, node_data=list(fed.nodes),
            server_data=ServerData(fed.public_x, fed.public_y, _input_stats(fed.meta)), seed=exp.seed,
            num_classes=fed.num_classes, model_factory=b, model_key=b.key, init_params=b.init_params,
            public_x=fed.public_x if fed.public_x.numel() else None, vectorize=exp.engine.vectorize,
        )
        #: worker processes of the round ([engine] workers; 1: this process, serially; a GPU run stays here)
        auto_ok = is_cpu(self.device) and (exp.engine.workers != "auto" or self.alg.auto_workers)
        with config_errors("executor"):
            executor, self.workers = choose_executor(exp, env, auto_ok=auto_ok, model_size=self.model_size,
                                                     train_samples=sum(int(nd.n_train) for nd in fed.nodes))
        return executor

    def _main_metric(self) -> str:
        main = self.exp.eval.main or self._default_main()
        known = [f"{p}/{m}" for p in self.protocols for m in PROTOCOL_METRICS[p]]
        if main not in known:
            raise ConfigError(f"eval.main: {main!r} is not a metric of this run "
                              f"(protocols {', '.join(self.protocols)}); available: {', '.join(known)}")
        return main

    def _default_main(self) -> str:
        main = self.alg.default_main
        if main.split("/")[0] in self.protocols:
            return main
        for p, key in (("consensus", "consensus/acc"), ("global", "global/acc"),
                       ("personal", "personal/acc_weighted"), ("node_global", "node_global/acc")):
            if p in self.protocols:
                return key
        return main

    @property
    def progress(self) -> Optional[Callable[[int, int, dict[str, Any]], None]]:
        """``progress(round, total, record)`` after each evaluated round (None: none)."""
        return self._progress.callback

    @progress.setter
    def progress(self, fn: Optional[Callable[[int, int, dict[str, Any]], None]]) -> None:
        self._progress.callback = fn

    def observer(self, kind: type) -> Any:
        """The run's first observer of type ``kind`` (None: none), e.g. ``sim.observer(LinkClock).timer``."""
        return next((o for o in self.observers if isinstance(o, kind)), None)

    # -- messaging ------------------------------------------------------------------
    def route(self, round: int, outboxes: dict[int, Outbox], faults: RoundFaults = NO_FAULTS,
              deliver: bool = True) -> dict[int, list[Envelope]]:
        """Encode, count, validate and deliver every message; returns the receivers' inboxes.

        Every transfer is counted; a message refused by its receiver's validation, sent by
        a late node or addressed to a dropped one is left out of the inboxes.
        ``deliver=False`` (the round's last step, whose inboxes nobody reads) only counts.
        For callers that run steps by hand (``executor.run_step``); :meth:`run` plays whole
        rounds with :attr:`loop`, through the same :func:`~lowband.engine.rounds.send` and
        :func:`~lowband.engine.rounds.deliver`."""
        net = self.network
        start = len(net.rejections)
        records, local, _ = send(net, round, outboxes, last=not deliver)
        append_records(net.ledger, round, records)
        inboxes = deliver_items(net, round, local, faults) if deliver else {}
        # the order the Ray executor reports them in (it only changes which one is logged)
        net.rejections[start:] = sorted(net.rejections[start:], key=lambda x: (x.src, x.dst, x.reason, x.kind))
        return inboxes

    # -- bytes -------------------------------------------------------------------------
    def byte_record(self, round: int) -> dict[str, int]:
        """``bytes/<direction>`` and ``declared/<direction>`` so far, and their totals."""
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

    def ledger_summary(self) -> dict[str, Any]:
        """The run's byte totals for summary.json: ``bytes_<direction>`` (encoded) and
        ``declared_bytes_<direction>`` per link direction (up, down, peer)."""
        out: dict[str, Any] = {}
        for direction in ("up", "down", "peer"):
            e, d = self.ledger.totals(direction=direction)
            out[f"bytes_{direction}"] = int(e)
            out[f"declared_bytes_{direction}"] = int(d)
        return out

    # -- the driver ------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run the rounds (from the checkpoint with ``resume``) and return the result. A run
        interrupted by an error or a signal stops its Ray actors before the error propagates:
        they would otherwise hold the runtime's CPUs, and a later run in the same process
        (a notebook) would wait for them forever. Its checkpoint is what ``--resume`` reads."""
        try:
            return self._run()
        except BaseException:
            if self.exp.executor == "ray":
                try:
                    self.executor.close()
                except Exception:  # pragma: no cover - never mask the interrupting error
                    pass
            raise
        finally:
            if self._log is not None:  # the run folder's lock: another run may write there now
                self._log.release()

    def _notify(self, hook: str, *args: Any) -> None:
        for o in self.observers:
            getattr(o, hook)(*args)

    def _run(self) -> RunResult:
        exp = self.exp
        self._log = RunLog.open(exp, resume=self.resume) if self.write else None
        run = Run(self, self._log, self.observers, self.counters)
        self._notify("on_run_start", run)  # a resume restores the run here (observers.checkpoint.Resume)
        if run.start == 0:
            self.backend.init_states(self.topology.plan(0) if self.num_nodes else None)
            if exp.eval.at_round0:
                plan0 = self.topology.plan(0)
                self._record(run, Round(0, plan0, plan0))
        for r in range(run.start + 1, exp.rounds + 1):
            self._round(run, r)
        return self._finish(run)

    def _round(self, run: Run, r: int) -> None:
        """plan -> steps -> play (encode, count, deliver) -> evaluate -> record."""
        plan = self.topology.plan(r - 1)  # topology rounds are 0-based
        rnd = Round(r, plan, plan)
        self._notify("on_round_start", run, rnd)
        rnd.steps = list(self.alg.steps(r, rnd.played))
        rnd.diverged = self.loop.play(rnd.steps, r, rnd.played, rnd.faults, rnd.clock)
        self._notify("on_deliver", run, rnd)
        if r % self.exp.eval.every == 0 or r == self.exp.rounds:
            self._record(run, rnd)
        self._notify("on_round_end", run, rnd)

    def _record(self, run: Run, rnd: Round) -> None:
        """Evaluate, let the observers add to the record, write it."""
        rec = self._evaluate(rnd.number, rnd.plan)
        self._notify("on_eval", run, rnd, rec)
        run.metrics.append(rec)
        if run.log is not None:
            run.log.log_metrics(rec)
        self._notify("on_record", run, rnd, rec)

    def _evaluate(self, r: int, plan: RoundPlan) -> dict[str, Any]:
        """The round's record: the protocols' metrics and the bytes so far."""
        return {"round": r, **self.backend.evaluate(r, plan), **self.byte_record(r)}

    def _finish(self, run: Run) -> RunResult:
        exp, fed = self.exp, self.fed
        summary = summarize(
            run.metrics, main=self.main_metric, target=exp.eval.target,
            extra={"name": exp.name, "algorithm": exp.algorithm.name, "dataset": exp.data.dataset,
                   "model": exp.model.name, "model_params": self.model_size, "num_nodes": self.num_nodes,
                   "num_classes": fed.num_classes, "seed": exp.seed, "protocols": self.protocols,
                   **self.ledger_summary(), **({"model_mix": self.model_sizes} if self.model_sizes else {}),
                   **({"data_sha256": fed.meta["sha256"]} if "sha256" in fed.meta else {}),
                   **({"index_map": fed.meta["federation"]["index_map"]}
                      if "index_map" in fed.meta.get("federation", {}) else {})},
        )
        self._notify("on_run_end", run, summary)
        if run.log is not None:
            run.log.write_ledger(self.ledger)
            run.log.write_summary(summary)
        self.backend.close()
        return RunResult(str(run.log.dir) if run.log else "", summary, run.metrics)


def _run_device(exp: Experiment) -> Any:
    """The run's torch device (``device``; sets ``threads``)."""
    if exp.threads:
        torch.set_num_threads(exp.threads)
    with config_errors("device"):
        device = resolve_device(exp.device)
        if not is_cpu(device) and exp.executor != "serial":
            raise ValueError(f"{exp.device!r} runs on the serial executor only (executor {exp.executor!r} "
                             f"workers compute on the CPU); use device = \"cpu\" or executor = \"serial\"")
    return device


def run(exp: Experiment, **kwargs: Any) -> RunResult:
    """Run an experiment (see :class:`Simulation`)."""
    return Simulation(exp, **kwargs).run()
