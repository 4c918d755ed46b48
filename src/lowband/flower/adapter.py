"""Export a lowband server-round algorithm as a Flower ServerApp / ClientApp pair.

The ServerApp runs lowband's round driver (:class:`~lowband.engine.simulator.Simulation`:
the same plan, steps, round loop, evaluation, records and observers as ``lowband run``)
with a :class:`FlowerBackend`, which supplies only the transport: it runs the server's
steps on the server's state and sends each client step to the SuperNode holding that
client as a Flower ``Message``; the ClientApp runs the algorithm's client step on its own partition,
with its own state (kept in Flower's ``context.state``) and the inbox it was sent.
Every lowband message travels as its **wire bytes**, encoded by the sender with the
run's codecs (``comm.codec`` ...) and the addressed codec generators, inside a Flower
``ConfigRecord``: the bytes Flower carries for lowband are exactly the bytes lowband's
ledger counts, and the ServerApp keeps that ledger (``bytes/*`` in metrics.jsonl).

What is computed matches ``lowband run`` of the same config: the same partition
(``make_federation``), the same initial model, the same per-node seeding of every step,
the same message bytes, the same server aggregation order (by client id). Only server
family algorithms fit: Flower messages go between the ServerApp and ClientApps, so
peer-to-peer methods (DFedAvg, D-PSGD, NTK-DFL, SPARK, ...) are not expressible.

Evaluation: ``global`` on the ServerApp (global test set); ``personal`` (each client's
own test split), ``personal_joined`` (the same, on the clients that have joined) and
``node_global`` (each client's model on the global test set) by an ``evaluate`` message to
each client they score and to no other (the ``eval.nodes`` sample; none for ``global``
alone: :mod:`lowband.flower.evaluation`); measurement traffic is not counted, as in lowband.
``consensus`` (averaging every client's weights) is not offered, nor are the clients'
own diagnostics (``Algorithm.node_metrics``). ``[faults]`` apply (dropped clients are not
asked, late ones' replies are counted and not delivered); ``[links]`` and codecs with
sender state are refused. Output: the lowband run folder of ``lowband run`` (config.toml,
metrics.jsonl, ledger.csv, summary.json, timing.jsonl, the checkpoint with the server's
state and the manifest) at ``out-dir``; each client's state is saved on its SuperNode
(node config ``state-dir``, one file per round under the run's token), so run config
``resume = true`` continues a killed run exactly.

Neither side trusts the other (design rule 8; the checks are in
:mod:`lowband.flower.guard`). The ServerApp decodes each reply within a budget derived
from the model (a header claiming a huge original shape is refused before anything is
built), only with the codec the run configured, and accepts one reply per sampled client
and step, one message per kind, known kinds, finite float32 tensors of the model's
shapes, a ``num_examples`` between 1 and the client's training split, evaluation numbers
in range; a server step that reads a metadata key a reply lacks drops that reply and
runs again. Whatever is refused is counted (``rejected/<reason>`` in metrics.jsonl),
logged once per reason, and the round goes on. A ClientApp runs only one of the
algorithm's steps of that round in which it is an actor, for a round of the experiment,
and decodes the server's messages within the same budget.

Run config keys (``[tool.flwr.app.config]`` or ``flwr run --run-config``):
``config`` (a lowband TOML, relative to the app folder), ``overrides`` (lowband
``key=value`` overrides separated by spaces, e.g. ``"algorithm.name=fedprox rounds=5"``),
``out-dir``, ``data-index`` (the export's index.json: claims are checked against it),
``resume`` and ``reply-timeout`` (seconds). A SuperNode learns which client it is from its
node config: ``data-file`` (its own client's file, :mod:`lowband.flower.datafile`; the
dataset is not loaded there) or ``partition-id`` (set by the simulation runtime; the
client's split is then rebuilt from the shared dataset). The ServerApp asks each SuperNode
which client it holds and refuses a second claim of a client, or a file the index does
not list, in one line (:meth:`FlowerBackend.connect`).
"""

from __future__ import annotations

import copy
import io
import os
import re
import secrets
import shlex
import time
from logging import INFO, WARNING
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log as flwr_log
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from lowband.algorithms.base import SERVER, Envelope, Outbox, Step
from lowband.comm.ledger import Ledger
from lowband.comm.message import Message as LBMessage
from lowband.comm.network import Network
from lowband.config.schema import ConfigError, Experiment
from lowband.config.loading import apply_overrides, load_toml
from lowband.config.resolve import validate
from lowband.engine.evaluation import _eval_node_global, _eval_personal, _eval_server
from lowband.comm.validate import FRESH_KEY, Rejection, ValidationPolicy, Validator, freshness_problem
from lowband.engine.observers import Faults, Observer, Run
from lowband.engine.rounds import Record, Summary, send
from lowband.engine.simulator import Simulation, encode_outbox
from lowband.flower.datafile import ClientFile, check_claim, read_client_file, read_index, run_protocols
from lowband.flower.evaluation import CLIENT_PROTOCOLS, ParamsCache, asked, needs_state, summaries
from lowband.flower.guard import (
    MAX_MESSAGES, UPLOAD_KINDS, MissingMeta, Rejected, ReplyBudget, StrictMeta, budget_for, check_eval, check_tensors,
    check_upload, checked_round, decode_reply,
)
from lowband.seeding import derive_seed

__all__ = ["client_app", "server_app", "experiment_from_run_config", "FlowerRun", "EVAL_PROTOCOLS"]

RECORD = "lowband"  # name of the ConfigRecord that carries lowband's payload
STATE = "lowband-state"  # name of the ConfigRecord in context.state that holds the node's state
RUN_TOKEN = "lowband-run"  # the ConfigRecord in context.state naming the lowband run (its saved states)
_TOKEN = re.compile(r"[0-9a-f]{16}")  # a run token: 16 hex digits (a folder name on the SuperNode)
EVAL_PROTOCOLS = ("global", "personal", "personal_joined", "node_global")


# --------------------------------------------------------------------------- configuration


def experiment_from_run_config(run_config: dict[str, Any], base_dir: Optional[Path] = None) -> Experiment:
    """The lowband Experiment named by a Flower run config (``config``, ``overrides``, ``out-dir``)."""
    path = str(run_config.get("config", "") or "")
    raw: dict[str, Any] = {}
    if path:
        p = Path(path)
        raw = load_toml(p if p.is_absolute() or base_dir is None else Path(base_dir) / p)
    raw = apply_overrides(raw, shlex.split(str(run_config.get("overrides", "") or "")))
    if run_config.get("out-dir"):
        raw["out_dir"] = str(run_config["out-dir"])
    raw["executor"] = "serial"  # each side runs its own nodes in-process
    exp = validate(raw)
    if exp.device != "cpu":  # its decoders hand out CPU tensors (lowband.flower.guard)
        raise ConfigError(f"device: the Flower adapter runs on the CPU only, got device = {exp.device!r}; "
                          f"leave device out (or \"cpu\") for flwr run")
    return _in_process(exp)


def _in_process(exp: Experiment) -> Experiment:
    """``exp`` run in this process (no worker pool): each side holds its own nodes."""
    return exp.model_copy(update={"engine": exp.engine.model_copy(update={"workers": 1})})


def _check_exportable(sim: Simulation) -> None:
    alg = sim.alg
    if alg.family != "server":
        raise ValueError(f"{alg.name} is a {alg.family}-round algorithm: only server-round algorithms can be "
                         f"exported to Flower (its messages go between a ServerApp and ClientApps; peer-to-peer "
                         f"methods are not expressible there)")
    if getattr(alg, "event_clock", False):
        raise ValueError(f"{alg.name} runs on the event clock of `lowband run` (lowband.asynchronous): its rounds "
                         f"are arrivals the clock plans, which a ClientApp cannot replay; the Flower adapter "
                         f"exports synchronous server rounds only")
    if callable(getattr(alg, "gateways", None)) or isinstance(getattr(type(alg), "gateways", None), property):
        raise ValueError(f"{alg.name} is hierarchical: its gateways are nodes with their own edge rounds between "
                         f"devices and the cloud, and a Flower deployment has one ServerApp and its ClientApps "
                         f"(no middle tier); run it with `lowband run`")
    if sim.exp.links is not None:
        raise ValueError("links: simulated link time is written by `lowband run` only; the Flower adapter does not "
                         "time its rounds (leave [links] out)")
    from lowband.comm.codecs import is_stateful
    from lowband.comm.wire import codec_from_spec

    codecs = sim.network.codecs
    for spec in [codecs.default, *codecs.by_kind.values(), *codecs.by_direction.values()]:
        if is_stateful(codec_from_spec(spec)):
            raise ValueError(f"comm: codec {spec!r} keeps sender state (error feedback, warm start), which the "
                             f"Flower adapter does not carry between a client's rounds yet; use a stateless codec")
    bad = [p for p in sim.protocols if p not in EVAL_PROTOCOLS]
    if bad:
        raise ValueError(f"eval.protocols: the Flower adapter evaluates {', '.join(EVAL_PROTOCOLS)}; "
                         f"not {', '.join(bad)}")


_SETUPS: dict[str, Simulation] = {}


def _setup(exp: Experiment, data: Optional["ClientFile"] = None) -> Simulation:
    """The experiment's algorithm, federation and topology in this process (cached: a
    simulation runtime calls many virtual clients in one process). ``data``: the
    client's own file (:mod:`lowband.flower.datafile`): the federation holds that client's
    data only, and the dataset is neither loaded nor split here. The Experiment object
    (and data file) a ClientApp was given is recognised without re-serialising it on every
    message (a validated Experiment is not changed in place: a changed one is a ``model_copy``)."""
    if _LAST_SETUP and _LAST_SETUP[0] is exp and _LAST_SETUP[1] is data:
        return _LAST_SETUP[2]
    given = exp
    key = exp.to_toml() + (f"\n#data {data.sha256}" if data is not None else "")
    if key not in _SETUPS:
        fed = None
        if data is not None:
            from lowband.flower.datafile import client_federation

            fed = client_federation(data)
            # the protocols a run resolves on the whole federation (the other clients' test splits are not here)
            protocols = run_protocols(exp, bool(data.head.get("has_local_test")))
            exp = exp.model_copy(update={"eval": exp.eval.model_copy(update={"protocols": protocols})})
        sim = Simulation(_in_process(exp), write=False, federation=fed)
        _check_exportable(sim)
        _SETUPS.clear()
        _SETUPS[key] = sim
    _LAST_SETUP[:] = [given, data, _SETUPS[key]]
    return _SETUPS[key]


_LAST_SETUP: list[Any] = []  # [the Experiment object last set up, its data file, its Simulation]


def _client_step(sim: Simulation, node: int, r: int, name: Any, method: Any) -> Step:
    """The step the server asks client ``node`` to run in round ``r``: one of the
    algorithm's own steps of that round with ``node`` among its actors, running the
    method it names. Nothing else is callable (a server cannot make a client run
    ``server_aggregate`` or any other attribute of the algorithm)."""
    steps = sim.alg.steps(r, _played_plan(sim, r))
    found = [s for s in steps if s.name == name]
    if not found:
        raise ValueError(f"refused: {sim.alg.name} has no step {str(name)[:40]!r} in round {r} "
                         f"(its steps: {', '.join(s.name for s in steps)})")
    step = found[0]
    if node not in (int(a) for a in step.actors):
        raise ValueError(f"refused: client {node} is not an actor of step {step.name!r} in round {r}")
    expected = _method_name(sim, step)
    if method != expected:
        raise ValueError(f"refused: step {step.name!r} runs {expected!r}, not {str(method)[:40]!r}")
    return step


def _step_index(sim: Simulation, r: int, name: str) -> int:
    """The position of step ``name`` among round ``r``'s steps: the step number the round
    loop plays it as (the freshness stamp's step)."""
    return [s.name for s in sim.alg.steps(r, _played_plan(sim, r))].index(name)


def _played_plan(sim: Simulation, r: int) -> Any:
    """Round ``r``'s plan as the ServerApp's driver plays it: without the nodes ``[faults]``
    drop in that round (a function of (seed, round, node), the same on every side)."""
    plan = sim.topology.plan(r - 1)
    faults = sim.observer(Faults)
    return faults.model.round(r).apply(plan) if faults is not None else plan


def _method_name(sim: Simulation, step: Step) -> str:
    fn = step.fn
    name = getattr(getattr(fn, "__func__", None), "__name__", None)
    if getattr(fn, "__self__", None) is not sim.alg or name is None:
        raise ValueError(f"{sim.alg.name}: step {step.name!r} runs {fn!r}; the Flower adapter needs step "
                         f"functions that are methods of the algorithm (a client finds them by name)")
    return name


def _state_name(r: int) -> str:
    return f"r{int(r):06d}.pt"


def _saved_rounds(d: Path) -> list[int]:
    """The rounds whose state a client saved in ``d``, in order."""
    if not d.is_dir():
        return []
    return sorted(int(p.name[1:7]) for p in d.iterdir() if re.fullmatch(r"r\d{6}\.pt", p.name))


def _state_bytes(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _state_from(data: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(data), weights_only=True)


def _wire_params(params: Optional[dict[str, torch.Tensor]]) -> Optional[bytes]:
    """Parameters for an evaluation message (fp32 wire: float32 arrives bit-identical)."""
    if params is None:
        return None
    from lowband.comm.wire import codec_from_spec, encode_message
    from lowband.seeding import torch_gen

    return encode_message(LBMessage("eval", dict(params)), codec_from_spec("fp32"), torch_gen(0, "eval"))


# --------------------------------------------------------------------------- client

_FILES: dict[str, ClientFile] = {}


def _client_file(path: str, exp: Experiment) -> ClientFile:
    """The SuperNode's data file, read and checked once per process."""
    key = f"{path}\n{exp.to_toml()}"
    if key not in _FILES:
        _FILES.clear()
        _FILES[key] = read_client_file(path, exp)
    return _FILES[key]



class _Client:
    """One SuperNode's lowband client: its partition, its state, the algorithm's steps."""

    def __init__(self, exp: Experiment, context: Context):
        cfg = context.node_config
        self.data: Optional[ClientFile] = None
        if cfg.get("data-file"):  # the client's own data file (lowband partition --export)
            self.data = _client_file(str(cfg["data-file"]), exp)
            if "partition-id" in cfg and int(cfg["partition-id"]) != self.data.client:
                raise ValueError(f"partition-id = {cfg['partition-id']} but data-file {cfg['data-file']} holds "
                                 f"client {self.data.client}; leave partition-id out (the file says which client)")
        self.sim = _setup(exp, self.data)
        self.exp = exp
        if self.data is not None:
            self.node = self.data.client
        elif "partition-id" not in cfg:
            raise ValueError("this SuperNode has no 'data-file' nor 'partition-id' in its node config; start it with "
                             "--node-config \"data-file='<dir>/client-0003.npz'\" (lowband partition CONFIG --export "
                             "DIR) or --node-config \"partition-id=<i> num-partitions=<n>\"")
        else:
            self.node = int(cfg["partition-id"])
        n = self.sim.num_nodes
        if not 0 <= self.node < n:
            raise ValueError(f"partition-id {self.node} is outside the experiment's clients 0..{n - 1} "
                             f"(data.num_clients = {n})")
        if "num-partitions" in cfg and int(cfg["num-partitions"]) != n:
            raise ValueError(f"num-partitions = {cfg['num-partitions']} but the experiment has "
                             f"data.num_clients = {n}; make them equal")
        self.context = context
        self.budget = budget_for(self.sim)

    # state in context.state (persists across messages of a Flower run on this SuperNode) and,
    # with the node config's state-dir, in one file per round there (what a resumed run reads)
    def _state_dir(self) -> Optional[Path]:
        """This client's folder of saved states for the lowband run the ServerApp named
        (its run token, sent with the ``query``), or None without a ``state-dir``."""
        root = self.context.node_config.get("state-dir")
        rec = self.context.state.get(RUN_TOKEN) if RUN_TOKEN in self.context.state else None
        token = rec.get("token") if rec is not None else None
        if not root or not isinstance(token, str) or not _TOKEN.fullmatch(token):
            return None
        return Path(str(root)).expanduser() / token / f"client-{self.node:04d}"

    def load_state(self, before: int) -> dict[str, Any]:
        """The client's state: this Flower run's, else the last one saved in a round before
        ``before`` (a resumed run), else its initial state."""
        rec = self.context.state.get(STATE) if STATE in self.context.state else None
        if rec is not None and "state" in rec:
            return _state_from(rec["state"])
        d = self._state_dir()
        saved = _saved_rounds(d) if d is not None else []
        older = [r for r in saved if r < before]
        if older:
            return _state_from((d / _state_name(max(older))).read_bytes())
        sim, node = self.sim, self.node
        torch.manual_seed(derive_seed(self.exp.seed, "torch", "init", node))
        return sim.alg.init_node(sim.executor.context(node, 0, sim.topology.plan(0)))

    def save_state(self, state: dict[str, Any], r: int) -> None:
        """Keep the state (context.state); with a state-dir, also as round ``r``'s file,
        keeping what a resume from the ServerApp's last checkpoint may need (the newest
        state at least ``checkpoint_every`` rounds old, and every later one)."""
        data = _state_bytes(state)
        self.context.state[STATE] = ConfigRecord({"state": data})
        d = self._state_dir()
        if d is None:
            return
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / (_state_name(r) + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, d / _state_name(r))
        every = max(1, int(self.exp.checkpoint_every or 1))
        old = [q for q in _saved_rounds(d) if q <= r - every]
        for q in old[:-1]:
            (d / _state_name(q)).unlink(missing_ok=True)

    def keeps_state(self) -> bool:
        return self._state_dir() is not None

    def _decode(self, data: Any, codec_for: Optional[Callable[[str], str]] = None) -> LBMessage:
        """A message from the server, decoded within the run's budget (or refused);
        ``codec_for(kind)``: the codec it must use (default: the run's, down the link)."""
        net = self.sim.network
        try:
            msg = decode_reply(data, self.budget, codec_for or (lambda kind: net.codec_for(kind, "down").spec))
            check_tensors(msg)
        except Rejected as e:
            raise ValueError(f"client {self.node} refuses the server's message ({e})") from None
        return msg

    def _fresh(self, msg: LBMessage, r: int, k: int) -> LBMessage:
        """With ``comm.freshness``: refuse a server message not stamped (round ``r``, step
        ``k - 1``), the step before this one (a replayed or re-ordered message); drop the stamp."""
        if self.exp.comm.freshness:
            problem = freshness_problem(msg, r, k - 1 if k > 0 else None)
            if problem is not None:
                raise ValueError(f"client {self.node} refuses the server's message ({problem[0]}: {problem[1]})")
            msg.meta.pop(FRESH_KEY, None)
        return msg

    def _inbox(self, cfg: ConfigRecord) -> list[Envelope]:
        n_in = cfg.get("n-in")
        if type(n_in) is not int or not 0 <= n_in <= MAX_MESSAGES:
            raise ValueError(f"refused: n-in = {str(n_in)[:40]} is not a message count in 0..{MAX_MESSAGES}")
        if not n_in:
            return []
        data, srcs = cfg.get("in"), cfg.get("in-src")
        if not (isinstance(data, list) and isinstance(srcs, list) and len(data) == len(srcs) == n_in):
            raise ValueError(f"refused: 'in' and 'in-src' must be lists of {n_in} entries")
        if any(src != SERVER for src in srcs):
            raise ValueError(f"refused: Flower carries messages from the server ({SERVER}) only, got senders {srcs}")
        return [Envelope(SERVER, self._decode(b)) for b in data]

    def step(self, cfg: ConfigRecord) -> ConfigRecord:
        sim, node = self.sim, self.node
        r = checked_round(cfg.get("round"), 1, self.exp.rounds)
        step = _client_step(sim, node, r, cfg.get("step"), cfg.get("fn"))
        plan = _played_plan(sim, r)
        k = _step_index(sim, r, step.name)
        inbox = [Envelope(e.src, self._fresh(e.msg, r, k)) for e in self._inbox(cfg)]
        ex = sim.executor
        ex.states = {node: self.load_state(before=r)}
        out = ex.run_step(Step(step.name, [node], step.fn), r, plan, {node: inbox})[node]
        self.save_state(ex.states[node], r)
        net = Network(sim.network.codecs, Ledger(), self.exp.seed,
                      validator=Validator(ValidationPolicy(freshness=True)) if self.exp.comm.freshness else None)
        net.step_tag = (r, k)  # the stamp (comm.freshness): this round, this step
        transfers = encode_outbox(net, r, node, out)
        for t in transfers:
            if t.dsts != (SERVER,):
                raise ValueError(f"{sim.alg.name}: client {node} sends {t.kind!r} to {list(t.dsts)}; Flower "
                                 f"carries client <-> server messages only (peer-to-peer is not expressible)")
            if t.stand_in:
                raise ValueError(f"{sim.alg.name}: message {t.kind!r} carries uncounted stand-in tensors; "
                                 f"the Flower adapter sends only counted wire bytes")
        rec: dict[str, Any] = {"n-out": len(transfers)}
        if transfers:
            rec["out"] = [t.data for t in transfers]
        return ConfigRecord(rec)

    def evaluate(self, cfg: ConfigRecord) -> MetricRecord:
        sim, node, bs = self.sim, self.node, self.sim.exp.eval.batch_size
        r = checked_round(cfg.get("round"), 0, self.exp.rounds)
        protocols = cfg.get("protocols")
        if not isinstance(protocols, list) or not set(protocols) <= {"personal", "node_global"}:
            raise ValueError(f"refused: protocols must be a list of 'personal', 'node_global'; "
                             f"got {str(protocols)[:60]}")
        ctx = sim.executor.context(node, r, sim.topology.plan(max(r - 1, 0)))
        # only what the numbers read: a non-personalised `personal` scores the server's model
        state = self.load_state(before=r + 1) if needs_state(protocols, sim.alg.personalized) else {}
        out: dict[str, Any] = {}
        if "personal" in protocols:
            server_params = None
            if "server-params" in cfg:  # the same bytes to every client of a round: decoded once here
                server_params = _EVAL_PARAMS.get(cfg["server-params"], self._eval_params)
            acc, loss, n = _eval_personal(ctx, state, sim.alg, not sim.alg.personalized, server_params, bs)
            out.update({"personal/acc": float(acc), "personal/loss": float(loss), "personal/n": int(n)})
        if "node_global" in protocols:
            if self.data is not None and not sim.fed.global_test_y.numel():
                raise ValueError(f"client {node}: its data-file holds no global test set (node_global); export the "
                                 f"clients' files from a config whose eval.protocols lists node_global")
            test = (sim.fed.global_test_x, sim.fed.global_test_y)
            acc, loss = _eval_node_global(ctx, state, sim.alg, test, bs)
            out.update({"node_global/acc": float(acc), "node_global/loss": float(loss)})
        return MetricRecord(out)

    def _eval_params(self, data: Any) -> dict[str, torch.Tensor]:
        """The server's model an ``evaluate`` message carries (fp32 wire, see :func:`_wire_params`)."""
        msg = self._decode(data, lambda kind: "fp32")
        if msg.kind != "eval":
            raise ValueError(f"refused: server-params is a {msg.kind!r} message, not 'eval'")
        return msg.tensors


_EVAL_PARAMS = ParamsCache()  # this process's latest server model of an evaluate message


def client_app(experiment: Optional[Experiment] = None, base_dir: Optional[Path] = None) -> ClientApp:
    """A Flower ClientApp running the lowband experiment's client steps.

    ``experiment``: fixed (e.g. for ``flwr.simulation.run_simulation``); None reads it from
    the run config (``config`` relative to ``base_dir``, ``overrides``)."""
    app = ClientApp()

    def exp_of(context: Context) -> Experiment:
        return experiment if experiment is not None else experiment_from_run_config(context.run_config, base_dir)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        out = _Client(exp_of(context), context).step(msg.content[RECORD])
        return Message(RecordDict({RECORD: out}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        res = _Client(exp_of(context), context).evaluate(msg.content[RECORD])
        return Message(RecordDict({"metrics": res}), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        token = msg.content[RECORD].get("run") if RECORD in msg.content else None
        if isinstance(token, str) and _TOKEN.fullmatch(token):  # the lowband run (fresh, or resumed) asking
            context.state[RUN_TOKEN] = ConfigRecord({"token": token})
        client = _Client(exp_of(context), context)
        claim: dict[str, Any] = {"partition-id": client.node, "keeps-state": client.keeps_state()}
        if client.data is not None:  # checked against the export's index at the ServerApp
            claim["sha256"] = client.data.sha256
        return Message(RecordDict({RECORD: ConfigRecord(claim)}), reply_to=msg)

    return app


# --------------------------------------------------------------------------- server


@dataclass
class _Pending:
    src: int
    index: int
    data: bytes


def _delivered(records: list[Record], unpulled: set[int]) -> list[Record]:
    """``records`` without the receivers in ``unpulled`` (their SuperNode never pulled the
    message: no bytes reached them), as ``[faults]`` leaves a dropped node's bytes uncounted;
    a record left without receivers is dropped."""
    if not unpulled:
        return records
    out = []
    for rec in records:
        dsts = tuple(d for d in rec.dsts if d not in unpulled)
        if dsts:
            out.append(rec._replace(dsts=dsts))
    return out


UNKNOWN_NODE = -2  # the sender of a reply from a node that was not asked (Rejection.src)
#: Flower's error codes of a reply the SuperLink makes for a node that is gone
_UNAVAILABLE = (ErrorCode.NODE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)


class FlowerBackend:
    """The ServerApp's transport: a backend of lowband's round driver
    (:class:`~lowband.engine.simulator.Simulation`) over a Flower ``Grid``.

    The driver plays the rounds as for ``lowband run`` (plan, steps, the one round loop,
    evaluation, records, observers); this backend only says where step calls run and how
    messages move: the server's steps on the server's state here, each client step on the
    SuperNode holding that client (a ``train`` message carrying the client's inbox as wire
    bytes; the reply carries its outbox as wire bytes), evaluation of the clients'
    protocols by ``evaluate`` messages.

    Replies are untrusted (design rule 8, see :mod:`lowband.flower.guard`): each one is
    checked before anything of it reaches the server's state; a bad one is dropped and
    refused as the simulator's receivers refuse (a
    :class:`~lowband.comm.validate.Rejection`: ``rejected/<reason>`` in metrics.jsonl,
    the first of each reason logged), and the round goes on with the remaining replies.
    The bytes of a dropped message are still counted in the ledger (they crossed the
    link), under the kind ``"rejected"``. A SuperNode Flower reports gone is counted as
    ``rejected/dead``; the server's message to it is counted only if it may have been
    pulled (:meth:`_send`): bytes a node never received are not in the ledger."""

    #: the server's state, the ledger and the observers' states are checkpointed here; each
    #: client's states are saved on its SuperNode (node config state-dir), under the run's token
    checkpoints = True

    def __init__(self, sim: Simulation, grid: Grid, timeout: float = 3600.0, data_index: Optional[str] = None):
        self.sim, self.grid, self.timeout = sim, grid, timeout
        self.places = self  # what the round loop plays a step on
        self._k = 0  # the step being played (its number in the round)
        self.net = sim.network  # the ServerApp's ledger is the run's ledger
        self.node_ids: dict[int, int] = {}
        #: the export's index of client files (data-index): claims are checked against it
        self.index: Optional[dict[str, Any]] = read_index(data_index, sim.exp) if data_index else None
        self.refused: list[tuple[int, str]] = []  # (SuperNode id, why) of every refused claim
        self.keeps_state: dict[int, bool] = {}  # client -> its SuperNode saves its states (state-dir)
        self.budget: ReplyBudget = budget_for(sim)
        self.kinds: frozenset[str] = UPLOAD_KINDS | frozenset(getattr(sim.alg, "upload_kinds", ()))
        # the server builds the same partition as the clients: it knows every client's split sizes
        self.n_train = [int(nd.n_train) for nd in sim.fed.nodes]
        self.n_test = [int(nd.n_test) for nd in sim.fed.nodes]
        self._refusals: list[Rejection] = []  # of the step being played
        self._server_inbox: list[Envelope] = []
        self._client_inbox: dict[int, list[_Pending]] = {}
        self._sent: dict[int, dict[str, tuple[tuple[int, ...], torch.dtype]]] = {}  # this round, per client
        self._held: list[Record] = []  # the server's records of the step before, counted with the next
        self._unpulled: set[int] = set()  # clients whose SuperNode never pulled this step's message

    # -- the driver's backend ----------------------------------------------------------------
    def init_states(self, plan: Any) -> None:
        """The server's state (each client initialises its own on its SuperNode)."""
        sim = self.sim
        torch.manual_seed(derive_seed(sim.exp.seed, "torch", "init", SERVER))
        sim.executor.states = {SERVER: sim.alg.init_server(sim.executor.context(SERVER, 0, plan))}

    def map_nodes(self, fn: Callable, nodes: Any, round: int, plan: Any) -> dict[int, Any]:
        """``fn`` on the server here; None for the clients (their states are on their SuperNodes)."""
        nodes = [int(n) for n in nodes]
        out: dict[int, Any] = dict.fromkeys(nodes)
        if SERVER in nodes:
            out.update(self.sim.executor.map_nodes(fn, [SERVER], round, plan))
        return out

    def close(self) -> None:
        pass

    # -- distrust ------------------------------------------------------------------------
    def _reject(self, reason: str, client: Any, r: int, detail: str, into: Optional[list] = None) -> None:
        """Refuse one reply (or message) of ``client``: counted as ``rejected/<reason>``."""
        src = client if type(client) is int else UNKNOWN_NODE
        who = "" if type(client) is int else f"{client}: "
        (self._refusals if into is None else into).append(Rejection(r, src, SERVER, "", reason, who + detail))

    def _expected_shapes(self, c: int) -> Optional[dict[str, tuple[tuple[int, ...], torch.dtype]]]:
        """Shapes and dtypes client ``c``'s tensors named like a parameter of the server's
        model must have: what the server sent ``c`` under that name this round (a method
        may send each client a slice of the model, e.g. FedSPU), else the server model's.
        None for mixed architectures, where a name may mean another tensor elsewhere."""
        if self.sim.exp.model.mix:
            return None
        params = self.sim.alg.server_params(self.sim.executor.states[SERVER])
        if params is None:
            return None
        out = {k: (tuple(v.shape), v.dtype) for k, v in params.items()}
        out.update({k: v for k, v in self._sent.get(c, {}).items() if k in out})
        return out

    def _receive(self, data: Any, c: int) -> LBMessage:
        """One message of client ``c``'s reply, decoded and checked (raises Rejected)."""
        msg = decode_reply(data, self.budget, lambda kind: self.net.codec_for(kind, "up").spec)
        if self.sim.exp.comm.freshness:  # sent in this very step of this round, or a replay
            problem = freshness_problem(msg, *self.net.step_tag)
            if problem is not None:
                raise Rejected(*problem)
            msg.meta.pop(FRESH_KEY, None)
        check_upload(msg, kinds=self.kinds, expected=self._expected_shapes(c), max_examples=self.n_train[c])
        return msg

    # -- plumbing ------------------------------------------------------------------------
    def _send(self, kind: str, content: dict[int, ConfigRecord], r: int, into: Optional[list] = None,
              unpulled: Optional[set[int]] = None) -> dict[int, Message]:
        """Send ``content`` to its clients; the first acceptable reply of each (others are
        rejected: unknown sender, second reply, another message type, an error reply,
        none at all). Raises only when every reply that came is an error reply (a broken
        deployment, not a hostile client).

        ``unpulled``: filled with the clients whose message was never pulled: Flower answered
        it as from a node that is gone (``NODE_UNAVAILABLE``) and the SuperLink had already
        stopped listing that node as online when the message was pushed. A node listed then
        may have pulled its message before it went (Flower's error reply does not say: it
        carries none of the instruction's ``delivered_at``), so its message counts as delivered."""
        msgs = [Message(RecordDict({RECORD: rec}), dst_node_id=self.node_ids[c], message_type=kind)
                for c, rec in content.items()]
        listed = {int(i) for i in self.grid.get_node_ids()} if unpulled is not None else set()
        replies = list(self.grid.send_and_receive(msgs, timeout=self.timeout))
        by_node = {nid: c for c, nid in self.node_ids.items()}
        # the reply Flower makes for a node that is gone carries the SuperLink's id as its sender:
        # it is matched by the message it answers, and the node is recorded as dead, not hostile
        by_msg = {m.metadata.message_id: c for c, m in zip(content, msgs) if m.metadata.message_id}
        out: dict[int, Message] = {}
        seen: set[int] = set()
        errors: dict[int, str] = {}
        for rep in replies:
            gone = by_msg.get(rep.metadata.reply_to_message_id)
            if gone is not None and gone not in seen and rep.has_error() and rep.error.code in _UNAVAILABLE:
                seen.add(gone)
                never = (unpulled is not None and rep.error.code == ErrorCode.NODE_UNAVAILABLE
                         and self.node_ids[gone] not in listed)
                if never:
                    unpulled.add(gone)
                self._reject("dead", gone, r, f"its SuperNode is gone (Flower: {str(rep.error.reason)[:80]}); its "
                             f"{kind!r} message " + ("was never pulled (not counted)" if never else
                                                     "may have been pulled before (counted)"), into)
                continue
            c = by_node.get(rep.metadata.src_node_id)
            if c is None or c not in content:
                self._reject("sender", c if c is not None else f"node {rep.metadata.src_node_id}", r,
                             f"a reply to {kind!r} from a node that was not asked", into)
                continue
            if c in seen:
                self._reject("duplicate", c, r, f"a second reply to {kind!r}", into)
                continue
            seen.add(c)
            if rep.metadata.message_type != kind:
                self._reject("kind", c, r, f"a {str(rep.metadata.message_type)[:40]!r} reply to a {kind!r} message",
                             into)
            elif rep.has_error():
                errors[c] = str(rep.error.reason)
                self._reject("error", c, r, errors[c][:200], into)
            elif not rep.has_content():
                self._reject("wire", c, r, "a reply without content", into)
            else:
                out[c] = rep
        for c in sorted(set(content) - seen):
            self._reject("missing", c, r, f"no reply to {kind!r} within {self.timeout} s", into)
        if errors and len(errors) == len(seen):
            c = min(errors)
            raise RuntimeError(f"round {r}: every client that replied to {kind!r} failed; client {c}: {errors[c]}")
        return out

    def connect(self, token: str = "") -> None:
        """Wait for the SuperNodes and learn which client each one holds: each is asked once
        (a ``query``); the first valid claim of a client wins, and a second claim of it, a
        claim the export's index does not vouch for (``data_index``: the client id and its
        file's sha256) or a node that cannot answer is refused, said in one line, and never
        sent anything. Raises (one line) when a client is still unclaimed at the deadline."""
        n = self.sim.num_nodes
        deadline = time.time() + self.timeout
        asked: set[int] = set()
        while True:
            new = [int(i) for i in self.grid.get_node_ids() if int(i) not in asked]
            if new:
                asked.update(new)
                self._claims(new, token)
            if len(self.node_ids) >= n:
                return
            if time.time() > deadline:
                missing = sorted(set(range(n)) - set(self.node_ids))
                why = "; ".join(f"SuperNode {nid} {reason}" for nid, reason in self.refused[:3])
                raise RuntimeError(f"no SuperNode holds clients {missing[:10]} after {self.timeout:g} s; start one "
                                   f"per client 0..{n - 1}" + (f" (refused: {why})" if why else ""))
            time.sleep(0.5)

    def _claims(self, ids: list[int], token: str = "") -> None:
        """Ask SuperNodes ``ids`` which client they hold (telling them the run's token:
        where their saved states go); keep the valid claims."""
        n = self.sim.num_nodes
        ask = {"ask": "partition-id", **({"run": token} if token else {})}
        msgs = [Message(RecordDict({RECORD: ConfigRecord(ask)}), dst_node_id=nid,
                        message_type="query") for nid in ids]
        for rep in self.grid.send_and_receive(msgs, timeout=self.timeout):
            nid = int(rep.metadata.src_node_id)
            if nid not in ids or nid in self.node_ids.values():
                continue  # not a node asked here (or its second answer)
            if rep.has_error():
                self._refuse_node(nid, f"cannot say which client it holds: {str(rep.error.reason)[:200]}")
                continue
            try:
                claim = rep.content[RECORD]
                pid, sha = claim["partition-id"], claim.get("sha256")
            except (KeyError, ValueError, TypeError):
                pid, sha = None, None
            if type(pid) is not int or not 0 <= pid < n:
                self._refuse_node(nid, f"claims client {str(pid)[:40]}; expected an integer in 0..{n - 1}")
            elif self.index is not None and (problem := check_claim(self.index, pid, sha)) is not None:
                self._refuse_node(nid, problem)
            elif pid in self.node_ids:
                self._refuse_node(nid, f"claims client {pid}, already held by SuperNode {self.node_ids[pid]}; "
                                       f"give each SuperNode its own data-file (or partition-id)")
            else:
                self.node_ids[pid] = nid
                self.keeps_state[pid] = claim.get("keeps-state") is True

    def _refuse_node(self, nid: int, reason: str) -> None:
        """A SuperNode whose claim is refused: said once, never sent a message."""
        self.refused.append((nid, reason))
        flwr_log(WARNING, "lowband: SuperNode %s refused: %s", nid, reason)

    # -- one step (the round loop's backend protocol: lowband.engine.rounds.Backend) --------------
    def step_places(self, step: Step, round: int, plan: Any, codecs: Any, seed: int, policy: Any, faults: Any,
                    late: Any, first: bool, last: bool, acks: list) -> list[Summary]:
        """Deliver the previous step's messages, run ``step`` (the server's part here, the
        clients' on their SuperNodes), encode and route what it sent. Returns the one
        place's ``(records, refusals, divergences, acks)`` (see :func:`lowband.engine.rounds.send`)."""
        if first:
            self._server_inbox, self._client_inbox, self._sent = [], {}, {}
        self._refusals, self._unpulled = [], set()
        r = round
        self._k = 0 if first else self._k + 1
        self.net.step_tag = (int(r), self._k)  # the server's stamps (comm.freshness), as the round loop's
        actors = [int(a) for a in step.actors]
        clients = [a for a in actors if a != SERVER]
        server_out = self._server_step(step, r, plan, self._server_inbox) if SERVER in actors else None
        replies = self._client_step(step, r, clients) if clients else {}
        self._server_inbox, self._client_inbox = [], {}
        # the previous step's server messages, counted now that this step's sends tell which were pulled
        records: list[Record] = _delivered(self._held, self._unpulled)
        self._held = []
        if server_out is not None:
            records += self._route_server(server_out, r, faults, late, last)
        for c in sorted(replies):
            records += self._take_reply(c, replies[c], r, faults, late)
        self._screen(r)
        return [Summary(records, self._refusals, [], [])]

    def apply_acks(self, codecs: Any, seed: int, policy: Any, acks: list) -> None:
        """(Stateless codecs only: the adapter refuses EF21 and other sender state.)"""

    def _client_step(self, step: Step, r: int, clients: list[int]) -> dict[int, list[Any]]:
        """Ask each client to run ``step`` on its inbox; the message bytes of each reply."""
        method = _method_name(self.sim, step)
        content = {}
        for c in clients:
            inbox = sorted(self._client_inbox.get(c, []), key=lambda p: (p.src, p.index))
            rec: dict[str, Any] = {"round": r, "step": step.name, "fn": method, "n-in": len(inbox)}
            if inbox:
                rec["in"] = [p.data for p in inbox]
                rec["in-src"] = [p.src for p in inbox]
            content[c] = ConfigRecord(rec)
        replies = self._send("train", content, r, unpulled=self._unpulled)
        return {c: self._train_payload(c, rep, r) for c, rep in replies.items()}

    def _route_server(self, out: Outbox, r: int, faults: Any, late: Any, last: bool) -> list[Record]:
        """Encode the server's outbox (as the engine's round loop does:
        :func:`lowband.engine.rounds.send`) and hold each message for its clients' next step.
        Its ledger records are held too and counted with that step, without the clients
        whose SuperNode never pulled its message (:meth:`_send`); the round's last step's
        messages (nobody reads them) are counted at once, as the round loop counts them."""
        for dsts, m in out.items:
            for d in dsts:
                self._sent.setdefault(int(d), {}).update({k: (tuple(v.shape), v.dtype) for k, v in m.tensors.items()})
        records, items, _ = send(self.net, r, {SERVER: out}, last=last)
        for item in items:
            for d in faults.deliverable(SERVER, item.dsts):  # downlinks are never late
                self._client_inbox.setdefault(d, []).append(_Pending(SERVER, item.key[1], item.data))
        if last:
            return records
        self._held = records
        return []

    def _take_reply(self, c: int, data_list: list[Any], r: int, faults: Any, late: Any) -> list[Record]:
        """Client ``c``'s messages, each decoded and checked, counted, and held for the
        server's next step (a refused one is counted as ``"rejected"``)."""
        records: list[Record] = []
        kinds: set[str] = set()
        for i, data in enumerate(data_list):
            size = len(data) if isinstance(data, (bytes, bytearray)) else 0
            try:
                if i >= MAX_MESSAGES:  # not even decoded
                    raise Rejected("duplicate", f"message {i + 1} of one reply (at most {MAX_MESSAGES})")
                msg = self._receive(data, c)
                if msg.kind in kinds:  # exactly one message of a kind per client and step counts
                    raise Rejected("duplicate", f"a second {msg.kind!r} message in one reply")
            except Rejected as e:
                self._reject(e.reason, c, r, e.detail)
                records.append(Record(c, i, (SERVER,), "up", "rejected", size, 0))
                continue
            kinds.add(msg.kind)
            records.append(Record(c, i, (SERVER,), "up", msg.kind, size, 0))
            if faults.deliverable(c, (SERVER,)) and (c, i, SERVER) not in late:
                msg.meta = StrictMeta(c, msg.meta)
                self._server_inbox.append(Envelope(c, msg))
        return records

    def _screen(self, r: int) -> None:
        """The receivers' norm screening (:meth:`Network.screen`), as the engine's delivery does."""
        net, saved = self.net, self.net.rejections
        net.rejections = []
        self._server_inbox = net.screen(r, {SERVER: self._server_inbox})[SERVER]
        self._refusals += net.rejections
        net.rejections = saved

    def _server_step(self, step: Step, r: int, plan: Any, inbox: list[Envelope]) -> Outbox:
        """Run a server step on the checked inbox. A client message lacking a metadata key
        the step reads (:class:`~lowband.flower.guard.StrictMeta`) is dropped and the step
        runs again, from the same state, without that client's messages."""
        ex = self.sim.executor
        before = copy.deepcopy(ex.states[SERVER]) if inbox else None
        while True:
            try:
                return ex.run_step(Step(step.name, [SERVER], step.fn), r, plan, {SERVER: inbox})[SERVER]
            except MissingMeta as e:
                if not any(env.src == e.src for env in inbox):  # pragma: no cover - not a client's message
                    raise
                self._reject("num_examples" if e.key == "num_examples" else "meta", e.src, r,
                             f"its message lacks meta[{str(e.key)[:40]!r}], which step {step.name!r} reads")
                inbox = [env for env in inbox if env.src != e.src]
                ex.states[SERVER] = copy.deepcopy(before)

    def _train_payload(self, c: int, rep: Message, r: int) -> list[Any]:
        """The message bytes of client ``c``'s train reply (empty when malformed)."""
        try:
            out = rep.content[RECORD]
            n = out["n-out"]
            data = list(out["out"]) if type(n) is int and n > 0 else []
        except (KeyError, ValueError, TypeError):
            self._reject("wire", c, r, f"the reply is not a {RECORD!r} record with 'n-out' and 'out'")
            return []
        if type(n) is not int or n != len(data):
            self._reject("wire", c, r, f"'n-out' = {str(n)[:20]} does not count the {len(data)} messages of 'out'")
            return []
        return data

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, r: int, plan: Any) -> dict[str, Any]:
        """The protocols' metrics: ``global`` here, the client protocols by an ``evaluate``
        message to each client they score, and to no other (:mod:`lowband.flower.evaluation`;
        refused replies go to the run's rejections)."""
        sim, ex, alg = self.sim, self.sim.executor, self.sim.alg
        rec: dict[str, Any] = {}
        bs = sim.exp.eval.batch_size
        if "global" in sim.protocols:
            res = ex.map_nodes(partial(_eval_server, alg=alg, test=(sim.fed.global_test_x, sim.fed.global_test_y), bs=bs),
                               [SERVER], r, plan)[SERVER]
            if res is not None:
                rec["global/acc"], rec["global/loss"] = res[0], res[1]
        if any(p in CLIENT_PROTOCOLS for p in sim.protocols):
            rec.update(self._evaluate_clients(r))
        return rec

    def _evaluate_clients(self, r: int) -> dict[str, Any]:
        """The client protocols from an ``evaluate`` message to each client one of them
        scores this round, asking it only for the numbers used (:func:`asked`)."""
        sim, ex, alg = self.sim, self.sim.executor, self.sim.alg
        ask = asked(sim.protocols, sim.evaluator, r)
        into = self.net.rejections  # collected with the round's (lowband.engine.observers.incidents)
        wire = None
        if any("personal" in n for n in ask.values()) and not alg.personalized and alg.has_server:
            wire = _wire_params(alg.server_params(ex.states[SERVER]))
        content = {}
        for c, numbers in ask.items():
            base: dict[str, Any] = {"round": r, "protocols": numbers}
            if wire is not None and "personal" in numbers:
                base["server-params"] = wire
            content[c] = ConfigRecord(base)
        reps = self._send("evaluate", content, r, into) if content else {}
        got: dict[int, dict[str, Any]] = {}
        for c in sorted(reps):
            try:
                numbers = reps[c].content["metrics"] if "metrics" in reps[c].content else {}
                got[c] = check_eval(numbers, ask[c], self.n_test[c])
            except Rejected as e:
                self._reject(e.reason, c, r, e.detail, into)
        return summaries(sim.protocols, sim.evaluator, r, got)


class _Connect(Observer):
    """Connects the SuperNodes when the run starts (after :class:`Resume`): a fresh run gets
    a new token, a resumed one its checkpoint's, which each SuperNode is told, so the
    clients' saved states (node config ``state-dir``) are this lowband run's and no other's."""

    def __init__(self) -> None:
        self.token = ""

    def restore(self, ckpt: dict[str, Any]) -> None:
        self.token = str(ckpt.get("flower_run", ""))

    def checkpoint_state(self) -> dict[str, Any]:
        return {"flower_run": self.token}

    def on_run_start(self, run: Run) -> None:
        if run.start == 0 or not _TOKEN.fullmatch(self.token):
            self.token = secrets.token_hex(8)
        backend: FlowerBackend = run.sim.backend
        backend.connect(self.token)
        lost = sorted(c for c, keeps in backend.keeps_state.items() if not keeps)
        if run.start > 0 and lost:
            raise ConfigError(f"resume from round {run.start}: the SuperNodes of clients {lost[:10]} keep no states "
                              f"(their node config has no state-dir), so their clients cannot continue exactly; "
                              f"start every SuperNode with --node-config \"state-dir='<dir>' ...\"")


class FlowerRun:
    """The ServerApp side of one run: lowband's round driver with a :class:`FlowerBackend`,
    so the run folder (metrics.jsonl, ledger.csv, summary.json, timing.jsonl, checkpoint)
    is what ``lowband run`` writes for the same config.

    ``resume``: continue the run folder's checkpoint (as ``lowband run --resume``; each
    SuperNode needs a ``state-dir``). ``data_index``: the export's index of client files
    (:mod:`lowband.flower.datafile`): each SuperNode's claim is checked against it."""

    def __init__(self, exp: Experiment, grid: Grid, *, timeout: float = 3600.0, write: bool = True,
                 observers: Any = (), resume: bool = False, data_index: Optional[str] = None):
        self.exp = exp
        # its own simulation: never shares states with an in-process client
        self.sim = Simulation(_in_process(exp), write=write, resume=resume, observers=[_Connect(), *observers],
                              backend=lambda sim: FlowerBackend(sim, grid, timeout, data_index))
        _check_exportable(self.sim)
        self.backend: FlowerBackend = self.sim.backend

    def run(self) -> list[dict[str, Any]]:
        exp, sim = self.exp, self.sim
        if sim.write:
            flwr_log(INFO, "lowband: %s (%s, %d clients, %d rounds) -> %s", exp.name, exp.algorithm.name,
                     sim.num_nodes, exp.rounds, exp.run_dir().resolve())
        return sim.run().metrics


def _flag(value: Any, key: str) -> bool:
    """A boolean run-config value (``true``/``false``, as TOML or as a string)."""
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "1", "yes"):
        return True
    if str(value).strip().lower() in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"run config {key} = {str(value)[:40]!r}: expected true or false")


def _seconds(value: Any, key: str) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        t = float("nan")
    if not 0 < t < 1e7:
        raise ConfigError(f"run config {key} = {str(value)[:40]!r}: expected seconds, a number above 0")
    return t


def server_app(experiment: Optional[Experiment] = None, base_dir: Optional[Path] = None,
               timeout: float = 3600.0) -> ServerApp:
    """A Flower ServerApp running the lowband experiment's server side (see the module
    docstring); ``experiment`` as in :func:`client_app`."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        rc = context.run_config
        exp = experiment if experiment is not None else experiment_from_run_config(rc, base_dir)
        # run config keys: reply-timeout (seconds, else the app's), resume, data-index
        wait = _seconds(rc.get("reply-timeout", timeout), "reply-timeout")
        index = str(rc.get("data-index", "") or "")
        if index and base_dir is not None and not Path(index).is_absolute():
            index = str(Path(base_dir) / index)
        FlowerRun(exp, grid, timeout=wait, resume=_flag(rc.get("resume", False), "resume"),
                  data_index=index or None).run()

    return app
