"""Export a lowband server-round algorithm as a Flower ServerApp / ClientApp pair.

The ServerApp plays lowband's round loop for the server: it samples the round's clients
with lowband's topology (same seed, same clients), runs the server's steps on the
server's state, and sends each client step to the SuperNode holding that client as a
Flower ``Message``; the ClientApp runs the algorithm's client step on its own partition,
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
own test split) and ``node_global`` (each client's model on the global test set) by an
``evaluate`` message to every client; measurement traffic is not counted, as in lowband.
``consensus`` (averaging every client's weights) is not offered. Output: a lowband run folder (config.toml, metrics.jsonl,
summary.json) at ``out-dir``.

Run config keys (``[tool.flwr.app.config]`` or ``flwr run --run-config``):
``config`` (a lowband TOML, relative to the app folder), ``overrides`` (lowband
``key=value`` overrides separated by spaces, e.g. ``"algorithm.name=fedprox rounds=5"``)
and ``out-dir``. A SuperNode learns which client it is from its node config
``partition-id`` (set by the simulation runtime, or ``flower-supernode --node-config
"partition-id=3 num-partitions=10"`` on a real machine).
"""

from __future__ import annotations

import io
import shlex
from logging import INFO
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from lowband.algorithms.base import SERVER, Envelope, Step
from lowband.comm.ledger import Ledger
from lowband.comm.message import Message as LBMessage
from lowband.comm.network import Network
from lowband.comm.wire import decode_message
from lowband.config import Experiment, apply_overrides, load_toml, validate
from lowband.engine.evaluation import _eval_node_global, _eval_personal, _eval_server, worst_fraction_mean
from lowband.engine.runlog import RunLog, summarize
from lowband.engine.simulator import Simulation, encode_outbox
from lowband.seeding import derive_seed

__all__ = ["client_app", "server_app", "experiment_from_run_config", "FlowerRun", "EVAL_PROTOCOLS"]

RECORD = "lowband"  # name of the ConfigRecord that carries lowband's payload
STATE = "lowband-state"  # name of the ConfigRecord in context.state that holds the node's state
EVAL_PROTOCOLS = ("global", "personal", "node_global")


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
    return validate(raw)


def _check_exportable(sim: Simulation) -> None:
    alg = sim.alg
    if alg.family != "server":
        raise ValueError(f"{alg.name} is a {alg.family}-round algorithm: only server-round algorithms can be "
                         f"exported to Flower (its messages go between a ServerApp and ClientApps; peer-to-peer "
                         f"methods are not expressible there)")
    bad = [p for p in sim.protocols if p not in EVAL_PROTOCOLS]
    if bad:
        raise ValueError(f"eval.protocols: the Flower adapter evaluates {', '.join(EVAL_PROTOCOLS)}; "
                         f"not {', '.join(bad)}")


_SETUPS: dict[str, Simulation] = {}


def _setup(exp: Experiment) -> Simulation:
    """The experiment's algorithm, federation and topology in this process (cached: a
    simulation runtime calls many virtual clients in one process)."""
    key = exp.to_toml()
    if key not in _SETUPS:
        sim = Simulation(exp, write=False)
        _check_exportable(sim)
        _SETUPS.clear()
        _SETUPS[key] = sim
    return _SETUPS[key]


def _step_fn(sim: Simulation, name: str) -> Callable:
    fn = getattr(sim.alg, name, None)
    if fn is None or not callable(fn):
        raise ValueError(f"{sim.alg.name} has no step method {name!r}")
    return fn


def _method_name(sim: Simulation, step: Step) -> str:
    fn = step.fn
    name = getattr(getattr(fn, "__func__", None), "__name__", None)
    if getattr(fn, "__self__", None) is not sim.alg or name is None:
        raise ValueError(f"{sim.alg.name}: step {step.name!r} runs {fn!r}; the Flower adapter needs step "
                         f"functions that are methods of the algorithm (a client finds them by name)")
    return name


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


class _Client:
    """One SuperNode's lowband client: its partition, its state, the algorithm's steps."""

    def __init__(self, exp: Experiment, context: Context):
        self.sim = _setup(exp)
        self.exp = exp
        cfg = context.node_config
        if "partition-id" not in cfg:
            raise ValueError("this SuperNode has no 'partition-id' in its node config; start it with "
                             "--node-config \"partition-id=<i> num-partitions=<n>\"")
        self.node = int(cfg["partition-id"])
        n = self.sim.num_nodes
        if not 0 <= self.node < n:
            raise ValueError(f"partition-id {self.node} is outside the experiment's clients 0..{n - 1} "
                             f"(data.num_clients = {n})")
        if "num-partitions" in cfg and int(cfg["num-partitions"]) != n:
            raise ValueError(f"num-partitions = {cfg['num-partitions']} but the experiment has "
                             f"data.num_clients = {n}; make them equal")
        self.context = context

    # state in context.state (persists across messages of a run on this SuperNode)
    def load_state(self) -> dict[str, Any]:
        rec = self.context.state.get(STATE) if STATE in self.context.state else None
        if rec is not None and "state" in rec:
            return _state_from(rec["state"])
        sim, node = self.sim, self.node
        torch.manual_seed(derive_seed(self.exp.seed, "torch", "init", node))
        return sim.alg.init_node(sim.executor.context(node, 0, sim.topology.plan(0)))

    def save_state(self, state: dict[str, Any]) -> None:
        self.context.state[STATE] = ConfigRecord({"state": _state_bytes(state)})

    def step(self, cfg: ConfigRecord) -> ConfigRecord:
        sim, node = self.sim, self.node
        r, name, method = int(cfg["round"]), str(cfg["step"]), str(cfg["fn"])
        plan = sim.topology.plan(r - 1)
        n_in = int(cfg["n-in"])
        inbox = [Envelope(int(s), decode_message(b)) for s, b in zip(cfg["in-src"], cfg["in"])] if n_in else []
        ex = sim.executor
        ex.states = {node: self.load_state()}
        out = ex.run_step(Step(name, [node], _step_fn(sim, method)), r, plan, {node: inbox})[node]
        self.save_state(ex.states[node])
        net = Network(sim.network.codecs, Ledger(), self.exp.seed)
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
        r = int(cfg["round"])
        protocols = list(cfg["protocols"])
        ctx = sim.executor.context(node, r, sim.topology.plan(max(r - 1, 0)))
        state = self.load_state()
        out: dict[str, Any] = {}
        if "personal" in protocols:
            server_params = decode_message(cfg["server-params"]).tensors if "server-params" in cfg else None
            acc, loss, n = _eval_personal(ctx, state, sim.alg, not sim.alg.personalized, server_params, bs)
            out.update({"personal/acc": float(acc), "personal/loss": float(loss), "personal/n": int(n)})
        if "node_global" in protocols:
            test = (sim.fed.global_test_x, sim.fed.global_test_y)
            acc, loss = _eval_node_global(ctx, state, sim.alg, test, bs)
            out.update({"node_global/acc": float(acc), "node_global/loss": float(loss)})
        return MetricRecord(out)


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
        client = _Client(exp_of(context), context)
        return Message(RecordDict({RECORD: ConfigRecord({"partition-id": client.node})}), reply_to=msg)

    return app


# --------------------------------------------------------------------------- server


@dataclass
class _Pending:
    src: int
    index: int
    data: bytes


class FlowerRun:
    """The ServerApp side of one run: lowband's round loop over a Flower ``Grid``."""

    def __init__(self, exp: Experiment, grid: Grid, *, timeout: float = 3600.0, write: bool = True):
        self.exp = exp
        self.grid = grid
        self.timeout = timeout
        self.write = write
        self.sim = Simulation(exp, write=False)  # its own: never shares states with an in-process client
        _check_exportable(self.sim)
        self.net = self.sim.network  # the ServerApp's ledger is the run's ledger
        self.node_ids: dict[int, int] = {}

    # -- plumbing ------------------------------------------------------------------------
    def _send(self, kind: str, content: dict[int, ConfigRecord]) -> dict[int, Message]:
        msgs = [Message(RecordDict({RECORD: rec}), dst_node_id=self.node_ids[c], message_type=kind)
                for c, rec in content.items()]
        replies = list(self.grid.send_and_receive(msgs, timeout=self.timeout))
        by_node = {nid: c for c, nid in self.node_ids.items()}
        out: dict[int, Message] = {}
        for rep in replies:
            c = by_node[rep.metadata.src_node_id]
            if rep.has_error():
                raise RuntimeError(f"client {c} failed: {rep.error.reason}")
            out[c] = rep
        missing = sorted(set(content) - set(out))
        if missing:
            raise RuntimeError(f"no reply from clients {missing} within {self.timeout} s")
        return out

    def connect(self) -> None:
        """Wait for the SuperNodes and learn which client (partition) each one holds."""
        n = self.sim.num_nodes
        deadline = time.time() + self.timeout
        while True:
            ids = list(self.grid.get_node_ids())
            if len(ids) >= n:
                break
            if time.time() > deadline:
                raise RuntimeError(f"{len(ids)} SuperNodes connected, the experiment has {n} clients")
            time.sleep(1.0)
        msgs = [Message(RecordDict({RECORD: ConfigRecord({"ask": "partition-id"})}), dst_node_id=nid,
                        message_type="query") for nid in ids]
        for rep in self.grid.send_and_receive(msgs, timeout=self.timeout):
            if rep.has_error():
                raise RuntimeError(f"SuperNode {rep.metadata.src_node_id}: {rep.error.reason}")
            pid = int(rep.content[RECORD]["partition-id"])
            if pid in self.node_ids:
                raise RuntimeError(f"two SuperNodes hold partition {pid}; give each a distinct partition-id")
            self.node_ids[pid] = rep.metadata.src_node_id
        missing = sorted(set(range(n)) - set(self.node_ids))
        if missing:
            raise RuntimeError(f"no SuperNode holds clients {missing[:10]}; start one per partition-id 0..{n - 1}")

    # -- the round loop --------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        exp, sim = self.exp, self.sim
        self.connect()
        log = RunLog.open(exp) if self.write else None
        if log is not None:
            log.truncate_after(-1)
            flwr_log(INFO, "lowband: %s (%s, %d clients, %d rounds) -> %s", exp.name, exp.algorithm.name,
                     sim.num_nodes, exp.rounds, log.dir.resolve())
        ex = sim.executor
        torch.manual_seed(derive_seed(exp.seed, "torch", "init", SERVER))
        ex.states = {SERVER: sim.alg.init_server(ex.context(SERVER, 0, sim.topology.plan(0)))}
        metrics: list[dict[str, Any]] = []

        def emit(r: int, plan: Any) -> None:
            rec = self.evaluate(r, plan)
            metrics.append(rec)
            if log is not None:
                log.log_metrics(rec)

        if exp.eval.at_round0:
            emit(0, sim.topology.plan(0))
        for r in range(1, exp.rounds + 1):
            t0 = time.perf_counter()
            plan = sim.topology.plan(r - 1)
            self.play_round(r, plan)
            if r % exp.eval.every == 0 or r == exp.rounds:
                emit(r, plan)
            if log is not None:
                log.log_timing({"round": r, "round_s": round(time.perf_counter() - t0, 4)})
        if log is not None:
            log.write_summary(summarize(
                metrics, main=sim.main_metric, target=exp.eval.target,
                extra={"name": exp.name, "algorithm": exp.algorithm.name, "dataset": exp.data.dataset,
                       "model": exp.model.name, "model_params": sim.model_size, "num_nodes": sim.num_nodes,
                       "seed": exp.seed, "protocols": sim.protocols, "backend": "flower",
                       **sim._ledger_summary()}))
        return metrics

    def play_round(self, r: int, plan: Any) -> None:
        """The round's steps: server steps here, client steps on the SuperNodes; every
        message as wire bytes, counted in the ledger in lowband's order."""
        sim, ex, ledger = self.sim, self.sim.executor, self.sim.ledger
        server_inbox: list[Envelope] = []
        client_inbox: dict[int, list[_Pending]] = {}
        for step in sim.alg.steps(r, plan):
            actors = [int(a) for a in step.actors]
            clients = [a for a in actors if a != SERVER]
            replies: dict[int, list[bytes]] = {}
            server_out = None
            if SERVER in actors:
                server_out = ex.run_step(Step(step.name, [SERVER], step.fn), r, plan, {SERVER: server_inbox})[SERVER]
            if clients:
                method = _method_name(sim, step)
                content = {}
                for c in clients:
                    inbox = sorted(client_inbox.get(c, []), key=lambda p: (p.src, p.index))
                    rec: dict[str, Any] = {"round": r, "step": step.name, "fn": method, "n-in": len(inbox)}
                    if inbox:
                        rec["in"] = [p.data for p in inbox]
                        rec["in-src"] = [p.src for p in inbox]
                    content[c] = ConfigRecord(rec)
                for c, rep in self._send("train", content).items():
                    out = rep.content[RECORD]
                    replies[c] = list(out["out"]) if int(out["n-out"]) else []
            # route in lowband's order: the server first, then clients by id, outbox order
            server_inbox, client_inbox = [], {}
            if server_out is not None:
                for t in encode_outbox(self.net, r, SERVER, server_out):
                    if len(t.dsts) == 1:
                        ledger.record(r, SERVER, t.dsts[0], t.direction, t.kind, len(t.data), t.declared)
                    else:
                        ledger.record_many(r, SERVER, t.dsts, t.direction, t.kind, len(t.data), t.declared)
                    for d in t.dsts:
                        client_inbox.setdefault(d, []).append(_Pending(SERVER, t.index, t.data))
            for c in sorted(replies):
                for data in replies[c]:
                    msg = self.net.deliver(data, c, SERVER, round=r, direction="up")
                    server_inbox.append(Envelope(c, msg))

    def evaluate(self, r: int, plan: Any) -> dict[str, Any]:
        sim, ex, alg = self.sim, self.sim.executor, self.sim.alg
        rec: dict[str, Any] = {"round": r}
        bs = self.exp.eval.batch_size
        if "global" in sim.protocols:
            res = ex.map_nodes(partial(_eval_server, alg=alg, test=(sim.fed.global_test_x, sim.fed.global_test_y), bs=bs),
                               [SERVER], r, plan)[SERVER]
            if res is not None:
                rec["global/acc"], rec["global/loss"] = res[0], res[1]
        on_clients = [p for p in sim.protocols if p in ("personal", "node_global")]
        if on_clients:
            base: dict[str, Any] = {"round": r, "protocols": on_clients}
            if "personal" in on_clients and not alg.personalized and alg.has_server:
                wire = _wire_params(alg.server_params(ex.states[SERVER]))
                if wire is not None:
                    base["server-params"] = wire
            reps = self._send("evaluate", {c: ConfigRecord(dict(base)) for c in range(sim.num_nodes)})
            res = [reps[c].content["metrics"] for c in range(sim.num_nodes)]
            # the aggregation of lowband.engine.evaluation.Evaluator, on the same per-node numbers
            if "personal" in on_clients:
                accs = np.array([m["personal/acc"] for m in res], dtype=float)
                losses = np.array([m["personal/loss"] for m in res], dtype=float)
                ns = np.array([m["personal/n"] for m in res], dtype=float)
                ok = ns > 0
                if ok.any():
                    rec["personal/acc_weighted"] = float(np.sum(accs[ok] * ns[ok]) / ns[ok].sum())
                    rec["personal/acc_mean"] = float(accs[ok].mean())
                    rec["personal/acc_worst10"] = worst_fraction_mean(accs[ok].tolist(), 0.1)
                    rec["personal/loss"] = float(np.sum(losses[ok] * ns[ok]) / ns[ok].sum())
            if "node_global" in on_clients:
                accs = np.array([m["node_global/acc"] for m in res], dtype=float)
                rec["node_global/acc"] = float(np.nanmean(accs))
                rec["node_global/acc_std"] = float(np.nanstd(accs))
                rec["node_global/loss"] = float(np.nanmean([m["node_global/loss"] for m in res]))
        rec.update(sim.byte_record(r))
        rec.update({f"alg/{k}": float(v) for k, v in (alg.round_metrics(ex.states[SERVER]) or {}).items()})
        return rec


def server_app(experiment: Optional[Experiment] = None, base_dir: Optional[Path] = None,
               timeout: float = 3600.0) -> ServerApp:
    """A Flower ServerApp running the lowband experiment's server side (see the module
    docstring); ``experiment`` as in :func:`client_app`."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        exp = experiment if experiment is not None else experiment_from_run_config(context.run_config, base_dir)
        FlowerRun(exp, grid, timeout=timeout).run()

    return app
