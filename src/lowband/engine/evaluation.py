"""Named evaluation protocols (the papers disagree, so every number says which it is).

- ``global``: the server's model on the global (held-out official) test set.
- ``personal``: each node's own model on its own local test split; sample-weighted mean,
  plain mean and the mean of the worst 10% of nodes. For algorithms whose clients keep no
  model of their own (FedAvg, FedProx), the global model is evaluated on each client's
  local test split (PFLlib's convention).
- ``personal_joined``: ``personal`` restricted to the clients that have joined, i.e. been
  a participant of at least one round so far (a client never sampled still holds the
  initial model and ``personal`` counts it); ``personal_joined/n`` says how many clients
  were evaluated. Neither is the FedCSPACK authors' exact measurement (docs/user-guide.md,
  "Which protocol a paper's numbers use").
- ``node_global``: each node's model on the global test set, mean over nodes
  (NTK-DFL's "average client accuracy").
- ``consensus``: the uniform average of all nodes' weights on the global test set
  (NTK-DFL's "aggregated model"). A node whose weights are non-finite, or whose weight
  norm exceeds ``norm_factor`` (``comm.norm_factor``, the receivers' screen) times the
  median node's, is left out of the average and counted in ``consensus/excluded``
  (written only when some are, with a warning): one diverged node would otherwise turn
  the average, the decentralised papers' headline number, into noise while the others
  learn (tests/test_validation.py).

Evaluation is measurement: it runs through the executor on each node's own data, is
never fed back to training, and never appears in the ledger.

Cost (issue 18 part 4): ``sample`` (``eval.nodes``) restricts ``personal`` and
``node_global`` to a fixed seeded sample of nodes, drawn once from ``(seed, "eval",
"nodes")``. ``personal`` of an algorithm whose clients keep no model (everyone is scored
with the one global model) runs, on an in-process executor, as one forward pass over all
clients' local test splits concatenated once and kept (:class:`_PooledTests`), split back
per client: the same logits as one forward per client, so the same metrics. Under worker
processes (a sharded executor's ``map_places``) each worker pools its own nodes' splits,
the workers in parallel.
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, Optional, Sequence

import numpy as np
import torch

from lowband.algorithms.base import SERVER, Algorithm, NodeContext, State
from lowband.engine import node_eval
from lowband.engine.checks import LowbandWarning
from lowband.engine.executor import Executor, SerialExecutor
from lowband.seeding import np_gen
from lowband.topology import RoundPlan, Topology
from lowband.train import ROW_ALIGN, eval_batch, evaluate, is_float, load_params, predict_logits
from lowband.train.evaluate import MIN_FORWARD_ROWS


def worst_fraction_mean(values: Sequence[float], fraction: float = 0.1) -> float:
    """Mean of the lowest ``fraction`` of values (at least one value)."""
    vals = sorted(v for v in values if not math.isnan(v))
    if not vals:
        return float("nan")
    k = max(1, int(math.floor(len(vals) * fraction)))
    return float(np.mean(vals[:k]))


def personal_summary(prefix: str, accs: Sequence[float], losses: Sequence[float],
                     ns: Sequence[float]) -> dict[str, float]:
    """``personal``-style metrics from per-node (accuracy, loss, test samples): the
    sample-weighted and plain mean accuracy, the worst 10%, the weighted loss (nodes with
    no test samples left out). One definition for the simulator and the Flower adapter."""
    a, lo, n = (np.asarray(v, dtype=float) for v in (accs, losses, ns))
    ok = n > 0
    out: dict[str, float] = {}
    if ok.any():
        out[f"{prefix}/acc_weighted"] = float(np.sum(a[ok] * n[ok]) / n[ok].sum())
        out[f"{prefix}/acc_mean"] = float(a[ok].mean())
        out[f"{prefix}/acc_worst10"] = worst_fraction_mean(a[ok].tolist(), 0.1)
        out[f"{prefix}/loss"] = float(np.sum(lo[ok] * n[ok]) / n[ok].sum())
    return out


def node_global_summary(accs: Sequence[float], losses: Sequence[float]) -> dict[str, float]:
    """``node_global`` metrics from per-node (accuracy, loss) on the global test set."""
    a, lo = np.asarray(accs, dtype=float), np.asarray(losses, dtype=float)

    def stat(f: Any, v: np.ndarray) -> float:  # all NaN (every node diverged) -> NaN, without numpy's warning
        return float(f(v)) if np.isfinite(v).any() else math.nan

    return {"node_global/acc": stat(np.nanmean, a), "node_global/acc_std": stat(np.nanstd, a),
            "node_global/loss": stat(np.nanmean, lo)}


class Evaluator:
    """Runs the configured protocols every ``every`` rounds and returns a flat metric dict."""

    def __init__(self, protocols: Sequence[str], algorithm: Algorithm, executor: Executor,
                 num_nodes: int, test_x: torch.Tensor, test_y: torch.Tensor, batch_size: int = 500,
                 topology: Optional[Topology] = None, sample: Optional[int] = None, seed: int = 0,
                 norm_factor: Optional[float] = None):
        self.protocols = list(protocols)
        #: consensus leaves out nodes whose weight norm exceeds this x the median node's (None: off)
        self.norm_factor = norm_factor
        self._warned_excluded = False
        #: the nodes ``personal`` and ``node_global`` score: all, or ``sample`` of them drawn
        #: once from (seed, "eval", "nodes"), the same every round (design rule 4)
        self.nodes = sample_nodes(num_nodes, sample, seed)
        self._pooled: dict[str, _PooledTests] = {}  # per protocol: its nodes' test splits, concatenated
        #: the round plans (``topology.plan(r - 1)`` for round ``r``) tell who has joined
        self.topology = topology
        self._joined: set[int] = set()
        self._joined_through = 0  # rounds 1.._joined_through are in self._joined
        self.alg = algorithm
        self.ex = executor
        self.num_nodes = num_nodes
        self.test_x, self.test_y = test_x, test_y
        self._test = (test_x, test_y)
        self.batch_size = eval_batch(batch_size)  # aligned: the pooled and per-node passes agree
        if "global" in self.protocols and not algorithm.has_server:
            raise ValueError(f"eval.protocols: 'global' needs a server; {algorithm.name} has none (use consensus or node_global)")
        if "personal_joined" in self.protocols and topology is None:
            raise ValueError("eval.protocols: 'personal_joined' needs the run's topology to know who has joined")

    def joined(self, round: int) -> list[int]:
        """The nodes that were participants of at least one of rounds ``1..round``
        (orchestration facts from the round plans, never a node's state)."""
        assert self.topology is not None
        if round < self._joined_through:  # an evaluator asked about an earlier round: start over
            self._joined, self._joined_through = set(), 0
        for r in range(self._joined_through + 1, round + 1):
            self._joined.update(int(v) for v in self.topology.plan(r - 1).participants)
        self._joined_through = max(self._joined_through, round)
        return sorted(self._joined)

    def _personal(self, prefix: str, nodes: Sequence[int], round: int, plan: RoundPlan,
                  with_global: bool = False) -> dict[str, float]:
        """``personal`` over ``nodes``: sample-weighted and plain mean, worst 10%, loss.
        ``with_global``: ``global`` too, first in the result, folded into the workers' pooled
        pass where that path is taken (else the caller's own ``global`` evaluation)."""
        alg, bs = self.alg, self.batch_size
        glob: dict[str, float] = {}
        use_global = not alg.personalized
        server_params = None
        if use_global and alg.has_server and nodes:
            server_params = self.ex.map_nodes(partial(_server_params, alg=alg), [SERVER], round, plan)[SERVER]
        if server_params is not None and self._can_pool(nodes):
            pooled = self._pooled.get(prefix)
            if pooled is None or pooled.nodes != tuple(nodes):  # personal_joined: rebuilt when someone joins
                pooled = self._pooled[prefix] = _PooledTests(self.ex.env.node_data, nodes)  # type: ignore[attr-defined]
            model = self.ex.model_for(nodes[0])  # type: ignore[attr-defined]
            res = pooled.evaluate(model, server_params, bs)
        elif server_params is not None and self._can_pool_places(nodes):
            # worker processes: each pools the test splits of its own nodes (in parallel),
            # and takes a share of the global test set's batches (with_global)
            res = {}
            shares = self._global_shares(nodes) if with_global else None
            extra = {"test": self._test, "shares": shares} if shares is not None else {}
            logits: dict[int, torch.Tensor] = {}
            for part in self.ex.map_places(partial(_pooled_personal, params=server_params, bs=bs, key=prefix,
                                                   **extra), nodes):  # type: ignore[attr-defined]
                res.update(part[0])
                logits.update(part[1])
            if shares is not None:
                glob = _scores(torch.cat([logits[i] for i in sorted(logits)]), self.test_y)
        else:
            fn = partial(_eval_personal, alg=alg, use_global=use_global, server_params=server_params, bs=bs)
            res = self.ex.map_nodes(fn, nodes, round, plan) if nodes else {}
        ns = [res[n][2] for n in nodes]
        out = personal_summary(prefix, [res[n][0] for n in nodes], [res[n][1] for n in nodes], ns)
        if prefix == "personal_joined":
            out[f"{prefix}/n"] = float(sum(1 for x in ns if x > 0))
        if with_global:
            if not glob:
                glob = self._global(round, plan)
            out = {**glob, **out}
        return out

    def _global(self, round: int, plan: RoundPlan) -> dict[str, float]:
        """``global``: the server's model on the global test set (evaluated at place 0)."""
        res = self.ex.map_nodes(partial(_eval_server, alg=self.alg, test=self._test, bs=self.batch_size),
                                [SERVER], round, plan)[SERVER]
        return {} if res is None else {"global/acc": res[0], "global/loss": res[1]}

    def _global_shares(self, nodes: Sequence[int]) -> Optional[dict[int, list[int]]]:
        """The global test set's batches (their start rows, ``batch_size`` apart: the
        batches :func:`lowband.train.evaluate` makes, so the same logits), dealt to the
        places evaluating ``nodes`` so that each scores about as many samples in all
        (its nodes' test splits + its batches); keyed by each place's first node. None
        where the server's model is not the nodes' architecture or there is no test set."""
        ex: Any = self.ex
        n_test, bs = int(self.test_y.shape[0]), self.batch_size
        split = getattr(ex, "_split", None)
        if not n_test or split is None:
            return None
        try:
            if ex.env.model_key(SERVER) != ex.env.model_key(nodes[0]):
                return None
        except Exception:  # a model_key that does not know the server
            return None
        parts = [p for p in split(nodes) if p]
        load = [sum(int(ex.env.node_data[n].test_y.shape[0]) for n in p) for p in parts]
        shares: dict[int, list[int]] = {p[0]: [] for p in parts}
        for start in range(0, n_test, bs):
            k = min(range(len(parts)), key=lambda i: load[i])
            shares[parts[k][0]].append(start)
            load[k] += min(bs, n_test - start)
        return shares

    def _can_pool(self, nodes: Sequence[int]) -> bool:
        """One forward pass for all ``nodes`` (same model): only where their data lives in
        this process and they share one architecture."""
        ex = self.ex
        if not nodes or type(ex) is not SerialExecutor:
            return False
        key = ex.env.model_key
        return len({key(n) for n in nodes}) == 1

    def _average_of(self, nodes: Sequence[int], round: int, plan: RoundPlan) -> dict[str, torch.Tensor]:
        """``weighted_average`` of ``nodes``' weights (uniform), gathered :data:`CONSENSUS_CHUNK`
        nodes at a time: the same float32 additions in the same order, so the same bits."""
        w = (torch.ones(len(nodes), dtype=torch.float64) / len(nodes)).tolist()
        acc: dict[str, torch.Tensor] = {}
        like: dict[str, torch.Tensor] = {}
        i = 0
        for start in range(0, len(nodes), CONSENSUS_CHUNK):
            chunk = list(nodes[start:start + CONSENSUS_CHUNK])
            got = self.ex.map_nodes(partial(_node_params, alg=self.alg), chunk, round, plan)
            for n in chunk:
                p = got.pop(n)
                if not like:
                    like = {k: v for k, v in p.items()}
                    acc = {k: torch.zeros_like(v, dtype=torch.float32) if is_float(v) else v.clone()
                           for k, v in p.items()}
                for k, v in p.items():
                    if is_float(like[k]):
                        acc[k].add_(v.to(torch.float32), alpha=w[i])
                    else:
                        acc[k] = torch.maximum(acc[k], v)
                i += 1
        return {k: acc[k].to(like[k].dtype) if is_float(like[k]) else acc[k] for k in acc}

    def _can_pool_places(self, nodes: Sequence[int]) -> bool:
        """The pooled pass per place of a sharded executor (the pool's workers, Ray's
        actors): where it offers ``map_places`` and the nodes share one architecture."""
        ex = self.ex
        if not nodes or not hasattr(ex, "map_places") or not hasattr(ex, "env"):
            return False
        key = ex.env.model_key  # type: ignore[attr-defined]
        return len({key(n) for n in nodes}) == 1

    def __call__(self, round: int, plan: RoundPlan) -> dict[str, float]:
        # Per-node work goes through module-level functions with explicit arguments (no
        # closures over this object), so a distributed executor ships each argument once
        # and the global test set (``self._test``, the same object every call) only once.
        out: dict[str, float] = {}
        nodes = self.nodes
        alg, bs, test = self.alg, self.batch_size, self._test

        both = "global" in self.protocols and alg.has_server and "personal" in self.protocols and bool(nodes)
        if "global" in self.protocols and alg.has_server and not both:
            out.update(self._global(round, plan))

        if "personal" in self.protocols:  # with_global: in one pooled pass under worker processes
            out.update(self._personal("personal", list(nodes), round, plan, with_global=both))

        if "personal_joined" in self.protocols:
            out.update(self._personal("personal_joined", self.joined(round), round, plan))

        if "node_global" in self.protocols:
            res = self.ex.map_nodes(partial(_eval_node_global, alg=alg, test=test, bs=bs), nodes, round, plan)
            out.update(node_global_summary([res[n][0] for n in nodes], [res[n][1] for n in nodes]))

        if "consensus" in self.protocols:  # the average of ALL nodes' weights, whatever eval.nodes says
            everyone = range(self.num_nodes)
            # the nodes' norms first, then their weights summed in chunks (memory: the 300
            # models of a DFedAvg run are not all gathered at once); the same sums, in the
            # same order, as weighted_average over all of them
            norms = self.ex.map_nodes(partial(_node_norm, alg=alg), everyone, round, plan)
            have = [n for n in everyone if norms[n] is not None]
            keep = consensus_members_by_norm({n: norms[n] for n in have}, self.norm_factor)
            if len(keep) < len(have):
                out["consensus/excluded"] = len(have) - len(keep)
                if not self._warned_excluded:
                    self._warned_excluded = True
                    why = "non-finite weights" + (f" or a weight norm over {self.norm_factor:g} x the median "
                                                  f"node's" if self.norm_factor else "")
                    warnings.warn(f"round {round}: consensus leaves out node(s) "
                                  f"{sorted(set(have) - set(keep))[:10]} ({why}); consensus/excluded counts them "
                                  f"per round", LowbandWarning, stacklevel=2)
            if keep:
                avg = self._average_of(keep, round, plan)
                res = self.ex.map_nodes(partial(_eval_params, params=avg, test=test, bs=bs), [0], round, plan)[0]
                out["consensus/acc"], out["consensus/loss"] = res[0], res[1]
        return out


#: nodes whose weights one gather of the consensus average brings (see Evaluator._average_of)
CONSENSUS_CHUNK = 32


def _params_norm(p: dict[str, torch.Tensor]) -> float:
    """L2 norm over the floating tensors of ``p`` (float64; inf or nan when they are)."""
    total = 0.0
    for v in p.values():
        if v.is_floating_point():
            total += float(v.detach().to(torch.float64).pow(2).sum())
    return math.sqrt(total)


def consensus_members(params: dict[int, dict[str, torch.Tensor]], norm_factor: Optional[float]) -> list[int]:
    """The nodes whose weights enter the consensus average: finite weights, and (with
    ``norm_factor``) a norm at most ``norm_factor`` x the median of the finite nodes' norms,
    the rule of the receivers' norm screen (lowband.comm.validate) applied to the models."""
    return consensus_members_by_norm({n: _params_norm(p) for n, p in params.items()}, norm_factor)


def consensus_members_by_norm(norms: dict[int, float], norm_factor: Optional[float]) -> list[int]:
    """:func:`consensus_members` from the nodes' weight norms (:func:`_params_norm`)."""
    finite = [n for n in norms if math.isfinite(norms[n])]
    if not norm_factor or len(finite) < 3:
        return finite
    med = float(np.median([norms[n] for n in finite]))
    if not med > 0:
        return finite
    return [n for n in finite if norms[n] <= norm_factor * med]


def sample_nodes(num_nodes: int, sample: Optional[int], seed: int) -> list[int]:
    """All nodes, or ``sample`` of them without replacement from the generator addressed by
    ``(seed, "eval", "nodes")`` (sorted): one fixed sample for the whole run."""
    if sample is None:
        return list(range(num_nodes))
    if sample > num_nodes:
        raise ValueError(f"nodes = {sample} exceeds the run's {num_nodes} nodes; leave eval.nodes out to "
                         f"evaluate every node")
    pick = np_gen(seed, "eval", "nodes").choice(num_nodes, size=sample, replace=False)
    return sorted(int(n) for n in pick)


class _PooledTests:
    """The local test splits of ``nodes`` concatenated once (kept between rounds: the data
    never changes), for scoring one model on all of them in one batched forward pass.

    In eval mode (no batch statistics) a sample's logits depend on its batch companions only
    through the kernels' rounding, which :func:`lowband.train.predict_logits` pins by row
    alignment (``ROW_ALIGN``): each split is scored at an aligned row, so slicing the
    logits back per node gives each node's :func:`lowband.train.evaluate` result bit for
    bit; tests/test_evaluation_speed.py checks equality.

    Padding waste (issue 43): a split of 2 samples takes 16 rows in the aligned layout, so
    10,000 clients of 1-2 test samples made a 160,000-row pass. The rows are kept unpadded
    here; a model offering ``row_trunk``/``row_tail`` (the FMNIST CNN: its convolutions
    give each row the same bits in any batch) runs its trunk on the unpadded rows and only
    the dense tail on the aligned layout, chunk by chunk as ``predict_logits`` chunks it;
    any other model gets the aligned, zero-padded rows (built on first use)."""

    def __init__(self, node_data: Sequence[Any], nodes: Sequence[int]):
        self.nodes = tuple(int(n) for n in nodes)
        self.y = [node_data[n].test_y for n in self.nodes]
        xs = [node_data[n].test_x for n in self.nodes]
        sizes = [int(x.shape[0]) for x in xs]
        # each split starts at a multiple of ROW_ALIGN in the aligned layout: the per-node
        # pass's row positions modulo ROW_ALIGN, hence its bits (lowband.train.ROW_ALIGN)
        padded = [n + (-n % ROW_ALIGN) for n in sizes]
        self.offsets = np.cumsum([0] + padded).tolist()
        self.x = torch.cat(xs) if xs else torch.empty(0)  # unpadded rows
        starts = np.cumsum([0] + sizes)[:-1]
        #: aligned row -> its unpadded row (-1: a gap)
        self.src = np.full(self.offsets[-1], -1, dtype=np.int64)
        for o, st, n in zip(self.offsets, starts, sizes):
            self.src[o:o + n] = np.arange(st, st + n)
        self._padded: Optional[torch.Tensor] = None

    def _aligned_inputs(self) -> torch.Tensor:
        if self._padded is None:
            pad = self.x.new_zeros((self.offsets[-1], *self.x.shape[1:]))
            real = torch.from_numpy(np.flatnonzero(self.src >= 0))
            pad[real] = self.x[torch.from_numpy(self.src[self.src >= 0])]
            self._padded = pad
        return self._padded

    def logits(self, model: torch.nn.Module, params: dict[str, torch.Tensor], bs: int) -> torch.Tensor:
        """The logits of the aligned layout (gap rows: whatever; never read)."""
        trunk, tail = getattr(model, "row_trunk", None), getattr(model, "row_tail", None)
        if trunk is None or tail is None:
            return predict_logits(model, params, self._aligned_inputs(), bs)
        load_params(model, params)
        model.eval()
        bs = eval_batch(bs)
        with torch.inference_mode():
            feats = torch.cat([trunk(self.x[i:i + bs]) for i in range(0, int(self.x.shape[0]), bs)])
            src = torch.from_numpy(np.maximum(self.src, 0))
            outs = []
            for i in range(0, int(src.shape[0]), bs):  # predict_logits' passes over the aligned rows
                chunk = feats[src[i:i + bs]]
                n = int(chunk.shape[0])
                if n < MIN_FORWARD_ROWS:
                    chunk = torch.cat([chunk, chunk.new_zeros((MIN_FORWARD_ROWS - n, *chunk.shape[1:]))])
                outs.append(tail(chunk)[:n])
            return torch.cat(outs)

    def evaluate(self, model: torch.nn.Module, params: dict[str, torch.Tensor], bs: int) -> dict[int, tuple]:
        if not self.offsets[-1]:
            return {n: (float("nan"), float("nan"), 0) for n in self.nodes}
        logits = self.logits(model, params, bs)
        out: dict[int, tuple] = {}
        for i, n in enumerate(self.nodes):
            y = self.y[i]
            if y.numel() == 0:
                out[n] = (float("nan"), float("nan"), 0)
                continue
            part = logits[self.offsets[i]:self.offsets[i] + int(y.shape[0])]
            loss = float(torch.nn.functional.cross_entropy(part, y, reduction="mean"))
            acc = float((part.argmax(1) == y).float().mean())
            out[n] = (acc, loss, int(y.shape[0]))
        return out


def _pooled_personal(ex: SerialExecutor, nodes: list[int], params: dict[str, torch.Tensor], bs: int,
                     key: str, test: Optional[Test] = None,
                     shares: Optional[dict[int, list[int]]] = None) -> tuple[dict[int, tuple], dict[int, torch.Tensor]]:
    """On one place: ``personal`` of ``params`` on its ``nodes``' test splits in one pooled
    pass, the concatenation kept on the place's executor between rounds (``key``: the
    protocol, so personal and personal_joined keep their own); with ``shares``, also the
    logits of this place's batches of the global ``test`` set (start row -> logits)."""
    cache = ex.__dict__.setdefault("_pooled_tests", {})
    pooled = cache.get(key)
    if pooled is None or pooled.nodes != tuple(nodes):
        pooled = cache[key] = _PooledTests(ex.env.node_data, nodes)
    model = ex.model_for(nodes[0])
    res = pooled.evaluate(model, params, bs)
    logits: dict[int, torch.Tensor] = {}
    if test is not None and shares:
        load_params(model, params)  # (the pooled pass may have had nothing to load it for)
        for start in shares.get(nodes[0], []):
            logits[start] = predict_logits(model, None, test[0][start:start + bs], bs)
    return res, logits


def _scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """``global``'s accuracy and mean cross-entropy from the logits of the whole test set,
    computed as :func:`lowband.train.evaluate` computes them (so the same numbers)."""
    return {"global/acc": float((logits.argmax(1) == y).float().mean()),
            "global/loss": float(torch.nn.functional.cross_entropy(logits, y, reduction="mean"))}


# Per-node evaluation functions: (ctx, state, **explicit arguments); measurement only.
Test = tuple[torch.Tensor, torch.Tensor]


def _server_params(ctx: NodeContext, s: State, alg: Algorithm) -> Optional[dict[str, torch.Tensor]]:
    return alg.server_params(s)


def _node_params(ctx: NodeContext, s: State, alg: Algorithm) -> Optional[dict[str, torch.Tensor]]:
    return alg.node_params(s)


def _node_norm(ctx: NodeContext, s: State, alg: Algorithm) -> Optional[float]:
    p = alg.node_params(s)
    return None if p is None else _params_norm(p)


def _eval_params(ctx: NodeContext, s: State, params: dict[str, torch.Tensor], test: Test, bs: int) -> tuple[float, float, int]:
    return evaluate(ctx.model, params, test[0], test[1], bs)


def _eval_server(ctx: NodeContext, s: State, alg: Algorithm, test: Test, bs: int) -> Optional[tuple[float, float, int]]:
    params = alg.server_params(s)
    return None if params is None else evaluate(ctx.model, params, test[0], test[1], bs)


def _eval_personal(ctx: NodeContext, s: State, alg: Algorithm, use_global: bool,
                   server_params: Optional[dict[str, torch.Tensor]], bs: int) -> tuple[float, float, int]:
    params = server_params if use_global else alg.node_params(s)
    if params is None or ctx.data.test_y.numel() == 0:
        return float("nan"), float("nan"), 0
    return evaluate(ctx.model, params, ctx.data.test_x, ctx.data.test_y, bs)


def _eval_node_global(ctx: NodeContext, s: State, alg: Algorithm, test: Test, bs: int) -> tuple[float, float]:
    params = alg.node_params(s)
    if params is None:
        return float("nan"), float("nan")
    one = node_eval.node_global_one(ctx.model, ctx.node, params, test, bs)  # an MLP: its block's bits
    return one if one is not None else evaluate(ctx.model, params, test[0], test[1], bs)[:2]


def _eval_node_global_many(ex: Any, nodes: Sequence[int], round: int, plan: RoundPlan, alg: Algorithm, test: Test,
                           bs: int) -> dict[int, tuple[float, float]]:
    """``_eval_node_global`` for many nodes of one executor: MLPs in blocks (lowband.engine.node_eval)."""
    return node_eval.map_many(ex, nodes, round, plan, partial(_eval_node_global, alg=alg, test=test, bs=bs),
                              alg.node_params, test, bs)


_eval_node_global.map_many = _eval_node_global_many  # type: ignore[attr-defined]


def default_protocols(alg: Algorithm, fed: Any, requested: Optional[Sequence[str]]) -> list[str]:
    """The protocols to run: the config's, else the algorithm's defaults that the data allows."""
    if requested:
        return list(requested)
    protos = list(alg.default_protocols)
    has_local_test = any(int(nd.n_test) > 0 for nd in fed.nodes)
    if not has_local_test and "personal" in protos:
        protos.remove("personal")
    if not alg.has_server and "global" in protos:
        protos.remove("global")
    return protos
