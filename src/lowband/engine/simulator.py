"""The round loop: config -> federation -> topology -> algorithm -> network -> evaluator -> run log.

``Simulation(exp).run()`` executes an experiment. Per round ``r`` (1-based):

1. the topology gives the round plan (sampled clients, the peer graph, the contacts);
2. the algorithm gives the round's steps; :class:`~lowband.engine.rounds.RoundLoop` plays
   them (the one round loop of every backend): for each step the backend runs the step's
   function on every actor where the actor lives, and every message the actors sent is
   encoded, counted and delivered;
3. every ``eval.every`` rounds the evaluator measures the named protocols;
4. one line goes to metrics.jsonl (deterministic), one to timing.jsonl (wall-clock seconds,
   the engine's workers and the CPU seconds they and this process took:
   :mod:`lowband.engine.cputime`), and a checkpoint is written, so ``resume=True``
   continues to the identical result.

Receivers validate what they get (:mod:`lowband.comm.validate`) and ``[faults]`` drops
nodes and late replies (:mod:`lowband.faults`), in this round loop for every algorithm.
What happened is counted per round (``rejected/<reason>``, ``faults/dropped``,
``faults/late``, ``faults/diverged``) and written with the next metrics line, summed
over the rounds since the previous line; a ``rejected/*`` or ``faults/diverged`` key
appears only when its count is not zero, ``faults/dropped`` and ``faults/late`` in every
line of a run with faults configured.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Optional

import torch

from lowband.algorithms import ALGORITHMS
from lowband.algorithms.base import SERVER, Algorithm, Envelope, Outbox, Step
from lowband.comm import links
from lowband.comm.ledger import Ledger
from lowband.comm.network import CodecConfig, Network, Transfer, link_direction  # noqa: F401 (re-exported)
from lowband.comm.validate import ExpectedShapes, Rejection, ValidationPolicy, Validator
from lowband.config import ConfigError, Experiment, hyperparams
from lowband.data.errors import PartitionError
from lowband.data.federation import Federation, build_federation
from lowband.data.sources import Dataset, load_dataset
from lowband.device import is_cpu, resolve_device, to_device
from lowband.engine import checks
from lowband.engine.cputime import CpuMeter
from lowband.engine.evaluation import Evaluator
from lowband.engine.executor import NodeEnv, ServerData, SerialExecutor, make_executor
from lowband.engine.pool import PoolExecutor, resolve_workers
from lowband.engine.rounds import LocalPlace, RoundLoop, append_records, late_links, send
from lowband.engine.rounds import deliver as deliver_items
from lowband.engine.runlog import RunLog, summarize
from lowband.faults import NO_FAULTS, FaultModel, RoundFaults, dropped_count
from lowband.models import MODELS, build_model, count_params
from lowband.seeding import derive_seed
from lowband.topology import RoundPlan, Topology, build_topology
from lowband.train import get_params

logger = logging.getLogger("lowband")


@contextmanager
def config_errors(section: str):
    """Report a ValueError raised while building ``section`` as a one-line ConfigError."""
    try:
        yield
    except (ConfigError, PartitionError):
        raise
    except ValueError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{section}: {msg}") from None


#: metric keys each protocol writes (see engine/evaluation.py)
PROTOCOL_METRICS = {"global": ("acc", "loss"), "personal": ("acc_weighted", "acc_mean", "acc_worst10", "loss"),
                    "personal_joined": ("acc_weighted", "acc_mean", "acc_worst10", "loss", "n"),
                    "node_global": ("acc", "acc_std", "loss"), "consensus": ("acc", "loss")}

DEFAULT_TOPOLOGY = {"server": "star", "peer": "kregular", "oneshot": "contact_plan", "local": "star"}


def load_data(exp: Experiment) -> Dataset:
    """The experiment's dataset: a built-in or plugin one by name, or the user's npz
    (``data.dataset = "npz"``, :mod:`lowband.data.userdata`)."""
    d = exp.data
    if d.dataset in ("npz", "csv"):
        from lowband.data.userdata import check_model_input, load_user_dataset

        ds = load_user_dataset(d.path, d.dataset, **d.options)
        check_model_input(exp, ds)
        return ds
    return load_dataset(d.dataset, d.data_dir, download=d.download, **d.options)


def make_federation(exp: Experiment) -> Federation:
    """Load the dataset and split it among the nodes as the config says."""
    d = exp.data
    ds = load_data(exp)
    return build_federation(
        ds, num_clients=d.num_clients, partition=d.partition, alpha=d.alpha, min_size=d.min_size,
        classes_per_client=d.classes_per_client, samples_per_client=d.samples_per_client,
        split=tuple(d.split), public_size=d.public_size, public_source=d.public_source,
        seed=exp.seed if d.seed is None else d.seed,
        augment=d.augment, index_map=_index_map(d),
    )


def _index_map(d: Any) -> Any:
    """The validated index map of ``partition = "index_map"`` (None for every other partition)."""
    if d.partition != "index_map":
        return None
    from lowband.data.indexmap import read_index_map

    return read_index_map(d.index_map, d.data_dir)


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


def _round_metrics(ctx: Any, state: Any, alg: Algorithm) -> dict[str, float]:
    return alg.round_metrics(state)


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
    """One experiment, end to end. ``progress(round, total, record)`` is called after
    each evaluated round (the CLI draws its bar with it)."""

    def __init__(self, exp: Experiment, *, resume: bool = False,
                 progress: Optional[Callable[[int, int, dict[str, Any]], None]] = None,
                 federation: Optional[Federation] = None, write: bool = True):
        self.exp = exp
        self.resume = resume
        self.progress = progress
        self.write = write
        self._log: Optional[RunLog] = None  #: the run folder while :meth:`run` goes on (it holds its lock)
        if exp.threads:
            torch.set_num_threads(exp.threads)
        with config_errors("device"):
            self.device = resolve_device(exp.device)
            if not is_cpu(self.device) and exp.executor != "serial":
                raise ValueError(f"{exp.device!r} runs on the serial executor only (executor {exp.executor!r} "
                                 f"workers compute on the CPU); use device = \"cpu\" or executor = \"serial\"")
        self.alg: Algorithm = ALGORITHMS[exp.algorithm.name](hyperparams(exp))
        checks.check_experiment(exp, self.alg)  # refuse what cannot be measured, before any work
        with config_errors("data"):
            self.fed = federation if federation is not None else make_federation(exp)
        if not is_cpu(self.device):  # the data lives where the training runs
            self.fed = to_device(self.fed, self.device)
        self.num_nodes = len(self.fed.nodes)
        self.alg.num_nodes = self.num_nodes
        self.alg.scratch_root = str(exp.run_dir() / "scratch") if write else None  # recomputable caches only
        with config_errors("topology"):
            self.topology = make_topology(exp, self.alg.family, self.num_nodes, self.alg.default_topology)
            self.alg.check_topology(self.topology, self.num_nodes)
        self.ledger = Ledger()
        num_classes = self.fed.num_classes
        # [model] mix: client i gets mix[i % len(mix)] (the server keeps model.name)
        mix = list(exp.model.mix or [])
        with config_errors("model"):
            builder = ModelBuilder(exp.model.name, mix, num_classes, tuple(self.fed.input_shape),
                                   {a: model_options(exp, self.fed, a) for a in {exp.model.name, *mix}}, exp.seed,
                                   device=self.device)
            self.model_size = count_params(builder(0))
            self.model_sizes = {a: count_params(builder(i)) for i, a in enumerate(mix)} if mix else {}
        with config_errors("comm"):
            policy = ValidationPolicy(on_invalid=exp.comm.on_invalid, norm_factor=exp.comm.norm_factor or None,
                                      partial_kinds=frozenset(self.alg.partial_kinds))
            self.network = Network(
                CodecConfig(default=exp.comm.codec, by_kind=dict(exp.comm.by_kind), by_direction=dict(exp.comm.by_direction)),
                self.ledger, exp.seed, validator=Validator(policy, ExpectedShapes(builder.init_params, builder.key)),
                device=None if is_cpu(self.device) else self.device,
            )
        with config_errors("faults"):
            f = exp.faults
            self.faults = FaultModel(self.num_nodes, exp.seed, dropout=f.dropout, dropout_schedule=f.dropout_schedule,
                                     straggler=f.straggler, slowdown=f.slowdown, deadline=f.deadline)
        #: [links]: simulated time per round, from the ledger (None: not timed, nothing written)
        self.timer: Optional[links.LinkTimer] = None
        self._clock: Optional[links.RoundClock] = None
        if exp.links is not None:
            with config_errors("links"):
                self.timer = links.LinkTimer(links.build_link_model(exp.links, compute_s=links.node_compute_seconds(
                    exp.links, hp=self.alg.hp, n_train=[nd.n_train for nd in self.fed.nodes], model_key=builder.key,
                    build=builder, input_shape=tuple(self.fed.input_shape)), seed=exp.seed))
        #: round -> metric key -> count (rejections, faults, divergences); checkpointed
        self.incidents: dict[int, dict[str, int]] = {}
        self._logged: set[str] = set()
        self.traffic = checks.TrafficWatch(  # once-per-run warnings about what crossed the links
            self.network, checks.model_message_bytes([builder.init_params(i) for i in range(max(1, len(mix)))]),
            exp.algorithm.name)
        env = NodeEnv(
            algorithm=self.alg, node_data=list(self.fed.nodes),
            server_data=ServerData(self.fed.public_x, self.fed.public_y, _input_stats(self.fed.meta)), seed=exp.seed,
            num_classes=num_classes, model_factory=builder, model_key=builder.key,
            init_params=builder.init_params,
            public_x=self.fed.public_x if self.fed.public_x.numel() else None,
            vectorize=exp.engine.vectorize,
        )
        options: dict[str, Any] = {}
        kind = exp.executor
        if exp.executor == "ray":
            options = {"address": exp.ray_address, "num_workers": exp.ray_workers,
                       "num_cpus": exp.ray_num_cpus, "threads": exp.threads}
        else:
            #: worker processes of the round ([engine] workers; 1: this process, serially)
            # a GPU run stays in this process
            auto_ok = is_cpu(self.device) and (exp.engine.workers != "auto" or self.alg.auto_workers)
            self.workers = 1 if not auto_ok else resolve_workers(
                exp.engine.workers, exp.threads, self.num_nodes, self.model_size,
                sum(int(nd.n_train) for nd in self.fed.nodes))
            if self.workers > 1:
                kind, options = "pool", {"num_workers": self.workers, "threads": exp.threads}
        with config_errors("executor"):
            self.executor = make_executor(kind, env, **options)
        #: the one round loop; the backend decides where each step's calls run
        self.loop = RoundLoop(self.network, LocalPlace(self.executor, self.network)
                              if isinstance(self.executor, SerialExecutor) else self.executor)
        self.protocols = checks.resolve_protocols(self.alg, self.fed, exp.eval.protocols)
        self.main_metric = exp.eval.main or self._default_main()
        known = [f"{p}/{m}" for p in self.protocols for m in PROTOCOL_METRICS[p]]
        if self.main_metric not in known:
            raise ConfigError(f"eval.main: {self.main_metric!r} is not a metric of this run "
                              f"(protocols {', '.join(self.protocols)}); available: {', '.join(known)}")
        with config_errors("eval"):
            self.evaluator = Evaluator(self.protocols, self.alg, self.executor, self.num_nodes,
                                       self.fed.global_test_x, self.fed.global_test_y, exp.eval.batch_size, self.topology,
                                       sample=exp.eval.nodes, seed=exp.seed, norm_factor=exp.comm.norm_factor or None)

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
        late = late_links(self._clock, records) if self._clock is not None else frozenset()
        inboxes = deliver_items(net, round, local, faults, late) if deliver else {}
        # the order the Ray executor reports them in (it only changes which one is logged)
        net.rejections[start:] = sorted(net.rejections[start:], key=lambda x: (x.src, x.dst, x.reason, x.kind))
        return inboxes

    # -- codec state (error-feedback residuals, warm starts: the senders' own) ------------
    def _codec_states(self) -> dict[str, Any]:
        """The senders' codec states, from where they live (a distributed executor's
        workers, else this process's network)."""
        get = getattr(self.executor, "codec_state_dict", None)
        return get() if get is not None else self.network.codec_state_dict()

    def _load_codec_states(self, sd: dict[str, Any]) -> None:
        load = getattr(self.executor, "load_codec_state_dict", None)
        if load is not None:
            load(sd)
        else:
            self.network.load_codec_state_dict(sd)

    # -- incidents (rejections, faults, divergences) -------------------------------------
    def _note(self, round: int, key: str, n: int = 1) -> None:
        if n:
            per = self.incidents.setdefault(int(round), {})
            per[key] = per.get(key, 0) + int(n)

    def _collect(self, round: int, diverged: Optional[list[tuple[int, int]]] = None) -> None:
        """Move the round's rejections and divergences into :attr:`incidents`; log the
        first of each reason once per run."""
        rejections: list[Rejection] = self.network.rejections
        self.network.rejections = []
        for rej in rejections:
            self._note(round, f"rejected/{rej.reason}")
            if rej.reason not in self._logged:
                self._logged.add(rej.reason)
                logger.warning("%s; further '%s' rejections are counted in metrics.jsonl as rejected/%s, not logged",
                               rej.describe(), rej.reason, rej.reason)
        diverged = list(diverged or []) + list(getattr(self.executor, "diverged", []))
        if getattr(self.executor, "diverged", None):
            self.executor.diverged.clear()
        for r, node in diverged:
            self._note(round, "faults/diverged")
            if "diverged" not in self._logged:
                self._logged.add("diverged")
                logger.warning("round %d: the local training of node %d diverged (non-finite loss); further "
                               "divergences are counted in metrics.jsonl as faults/diverged, not logged", r, node)

    def _incident_record(self, since: int, upto: int) -> dict[str, int]:
        """Counts of rounds ``since < r <= upto``: nonzero keys, plus the fault counts of a
        run with faults configured."""
        rec: dict[str, int] = {"faults/dropped": 0, "faults/late": 0} if self.faults.enabled else {}
        if self.timer is not None and self.timer.model.deadline_s is not None:
            rec["links/late"] = 0
        for r in range(since + 1, upto + 1):
            for k, v in self.incidents.get(r, {}).items():
                rec[k] = rec.get(k, 0) + v
        return dict(sorted(rec.items()))

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

    def _run(self) -> RunResult:
        exp = self.exp
        log = self._log = RunLog.open(exp, resume=self.resume) if self.write else None
        if log is not None and self.resume:
            # no longer a finished run (a restart rewrites its rounds, an extension adds some):
            # a summary left from before would call it finished, and its rounds lost while it runs
            log.summary_path.unlink(missing_ok=True)
        start = 0
        ckpt = log.load_checkpoint() if (log is not None and self.resume) else None
        if ckpt is not None:
            start = int(ckpt["round"])
            self.executor.load_state_dict(ckpt["states"] if is_cpu(self.device) else to_device(ckpt["states"], self.device))
            self.ledger.load_state_dict(ckpt["ledger"])
            self._load_codec_states(ckpt.get("codecs", {}))
            self.incidents = {int(r): {str(k): int(v) for k, v in per.items()}
                              for r, per in ckpt.get("incidents", {}).items()}
            if self.timer is not None:  # simulated times are a function of the ledger: replay them
                for r in range(1, start + 1):
                    self.timer.finish(self.ledger, r)
            log.truncate_after(start)
        else:
            if log is not None:
                log.truncate_after(-1)
            self.executor.init_states(self.topology.plan(0) if self.num_nodes else None)
        metrics: list[dict[str, Any]] = log.metrics() if log is not None else []
        decay = checks.DecayWatch(self.main_metric)  # a main accuracy that falls far from its best
        chance = checks.ChanceWatch(self.main_metric, self.fed.num_classes, exp.rounds)  # ... or never leaves chance
        for rec in metrics:  # a resumed run's earlier rounds: warned in the run that evaluated them
            decay.check(rec, quiet=True)
            chance.check(rec, quiet=True)
        t_run = time.perf_counter()

        if start == 0 and exp.eval.at_round0:
            rec = self._evaluate(0, self.topology.plan(0))
            rec.update(self._incident_record(0, 0))
            metrics.append(rec)
            if log is not None:
                log.log_metrics(rec)
            if self.progress:
                self.progress(0, exp.rounds, rec)

        meter = CpuMeter(getattr(self.executor, "worker_pids", lambda: None))
        workers = int(getattr(self.executor, "num_workers", 1))
        for r in range(start + 1, exp.rounds + 1):
            t0 = time.perf_counter()
            meter.start()
            plan = self.topology.plan(r - 1)  # topology rounds are 0-based
            faults = self.faults.round(r) if self.faults.enabled else NO_FAULTS
            round_plan = faults.apply(plan)
            steps = self.alg.steps(r, round_plan)
            if self.timer is not None and self.timer.model.deadline_s is not None:
                self._clock = self.timer.live(r)
            if faults.dropped:
                self._note(r, "faults/dropped", dropped_count(faults, plan, steps))
                steps = [Step(s.name, faults.actors(s.actors), s.fn) for s in steps]
            diverged = self.loop.play(steps, r, round_plan, faults, self._clock)
            if faults.late:  # late nodes that sent something this round (counted, not delivered)
                cols = self.ledger.columns()
                self._note(r, "faults/late", len(faults.late & set(cols["src"][cols["round"] == r].tolist())))
            self._collect(r, diverged)
            if self.timer is not None:
                self.timer.finish(self.ledger, r)
                if self._clock is not None:
                    self._note(r, "links/late", self._clock.late)
                    self._clock = None
            t_train = time.perf_counter() - t0
            t1 = time.perf_counter()
            if r % exp.eval.every == 0 or r == exp.rounds:
                rec = self._evaluate(r, plan)
                rec.update(self._incident_record(metrics[-1]["round"] if metrics else 0, r))
                metrics.append(rec)
                decay.check(rec)
                chance.check(rec)
                if log is not None:
                    log.log_metrics(rec)
                if self.progress:
                    self.progress(r, exp.rounds, rec)
            t_eval = time.perf_counter() - t1
            cpu_s = meter.stop()  # the CPU the round took in this process and its workers (None: unknown)
            if log is not None:
                log.log_timing({"round": r, "round_s": round(t_train, 4), "eval_s": round(t_eval, 4),
                                "elapsed_s": round(time.perf_counter() - t_run, 3), "workers": workers,
                                **({"cpu_s": cpu_s} if cpu_s is not None else {})})
                if exp.checkpoint_every and (r % exp.checkpoint_every == 0 or r == exp.rounds):
                    codecs = self._codec_states()
                    log.save_checkpoint({"round": r, "states": self.executor.state_dict(),
                                         "ledger": self.ledger.state_dict(),
                                         **({"codecs": codecs} if codecs else {}),
                                         **({"incidents": {str(k): v for k, v in self.incidents.items()}}
                                            if self.incidents else {})})

        summary = summarize(
            metrics, main=self.main_metric, target=exp.eval.target,
            extra={"name": exp.name, "algorithm": exp.algorithm.name, "dataset": exp.data.dataset,
                   "model": exp.model.name, "model_params": self.model_size, "num_nodes": self.num_nodes,
                   "num_classes": self.fed.num_classes, "seed": exp.seed, "protocols": self.protocols,
                   **self.ledger_summary(), **chance.summary(),
                   **({"model_mix": self.model_sizes} if self.model_sizes else {}),
                   **({"data_sha256": self.fed.meta["sha256"]} if "sha256" in self.fed.meta else {}),
                   **({"index_map": self.fed.meta["federation"]["index_map"]}
                      if "index_map" in self.fed.meta.get("federation", {}) else {}),
                   **({"incidents": self._incident_record(0, exp.rounds)} if self.incidents else {})},
        )
        if self.timer is not None:  # simulated time to the main metric's target ([links] only)
            hit = summary.get("rounds_to_target")
            summary["sim_time_s"] = self.timer.elapsed(exp.rounds)
            summary["time_to_target_s"] = self.timer.elapsed(hit) if hit is not None else None
            if self.timer.energy(exp.rounds) is not None:  # a preset with radio power figures
                summary["energy_j"] = self.timer.energy(exp.rounds)
                summary["energy_to_target_j"] = self.timer.energy(hit) if hit is not None else None
        if log is not None:
            log.write_ledger(self.ledger)
            log.write_summary(summary)
        if isinstance(self.executor, PoolExecutor):
            self.executor.close()  # the worker processes end with the run (their states stay readable)
        return RunResult(str(log.dir) if log else "", summary, metrics)

    def _evaluate(self, r: int, plan: RoundPlan) -> dict[str, Any]:
        rec: dict[str, Any] = {"round": r}
        rec.update(self.evaluator(r, plan))
        rec.update(self.byte_record(r))
        if self.timer is not None:
            rec.update(self.timer.record(r))
        self.traffic.check()
        if self.alg.has_server:  # the algorithm's own per-round diagnostics (measurement only)
            extra = self.executor.map_nodes(partial(_round_metrics, alg=self.alg), [SERVER], r, plan)[SERVER]
            rec.update({f"alg/{k}": float(v) for k, v in (extra or {}).items()})
        if type(self.alg).node_metrics is not Algorithm.node_metrics:  # per-node diagnostics (measurement only)
            nodes = list(range(self.num_nodes)) + ([SERVER] if self.alg.has_server else [])
            per_node = self.executor.map_nodes(self.alg.node_metrics, nodes, r, plan)
            for n in nodes:
                for k, v in (per_node[n] or {}).items():
                    if f"alg/{k}" in rec:
                        raise ValueError(f"{self.alg.name}.node_metrics: node {n} repeats metric {k!r}; "
                                         f"include the node id in node-specific keys")
                    rec[f"alg/{k}"] = float(v)
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


def run(exp: Experiment, **kwargs: Any) -> RunResult:
    """Run an experiment (see :class:`Simulation`)."""
    return Simulation(exp, **kwargs).run()
