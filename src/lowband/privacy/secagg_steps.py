"""SecAgg+ as extra message phases of a server algorithm's round, without touching the
round loop: :func:`with_secagg` derives from a FedAvg-like algorithm class a subclass
whose round is

    broadcast -> client (local training; the update is quantised into the field and kept;
    the client advertises its keys) -> secagg_keys (server) -> secagg_shares (clients) ->
    secagg_forward (server) -> secagg_masked (clients) -> secagg_unmask_request (server)
    -> secagg_unmask (clients) -> aggregate (server: the sum only, then the algorithm's
    own aggregation of the mean update)

Each phase is a :class:`~lowband.algorithms.base.Step` whose messages the engine encodes,
counts (kinds ``secagg_*``, see :mod:`.secagg`) and delivers like any other, so faults
(dropout, deadlines) drop protocol messages as they drop updates, and dropout costs what
it costs: the unmasking phase and its recovery shares are in the ledger.

What the server learns is the sum of the survivors' quantised updates; the algorithm's
aggregation then sees one synthetic reply, the uniform mean of the survivors' updates
(sample-count weights would need the counts inside the sum; not implemented: the mean
under SecAgg is unweighted, as in Bonawitz et al.'s experiments).

Served: server methods whose client sends exactly one model or delta message and whose
server averages (FedAvg, FedProx, MOON, FedNTD). Refused with one line: SCAFFOLD (two
uploads a round would need two secure sums; not implemented), FedNova (per-client
normalisation), and every method whose server needs individual updates.

Quantisation: each coordinate of the update is clipped to ``[-clip_range, clip_range]``
and stochastically rounded to ``2**levels_bits`` levels; ``levels_bits`` defaults to the
most the modulus leaves room for (``modulus_bits - ceil(log2(m + 1))`` for ``m`` clients
a round) so that the sum never wraps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ..algorithms.base import SERVER, Envelope, NodeContext, Outbox, State, Step
from ..comm.message import Message
from ..engine.cohort import local_sgd_step
from ..topology import RoundPlan
from . import secagg as sa
from .distributed import Skellam
from .sparsify import message_support

#: algorithms :func:`with_secagg` serves
SECAGG_SERVES = ("fedavg", "fedprox", "moon", "fedntd")
SECAGG_REFUSED = {
    "scaffold": "its clients upload two vectors a round (model and control-variate deltas), which would need two "
                "secure sums; not implemented",
    "fednova": "its server normalises each client's update by that client's step count (individual updates)",
}
DEFAULT_CLIP_RANGE = 8.0


@dataclass(frozen=True)
class SecAggRun:
    """SecAgg settings of a run (``secagg.*``)."""

    params: sa.SecAggParams = sa.SecAggParams()
    clip_range: float = DEFAULT_CLIP_RANGE
    levels_bits: Optional[int] = None
    #: distributed DP: each client encodes its update with this Skellam mechanism instead of
    #: the plain quantisation (its ``bits`` must equal ``params.modulus_bits``), and the server
    #: divides the decoded sum by the mechanism's expected cohort ``n``
    skellam: Optional[Skellam] = None
    #: ``sharedmask(frac)`` uplink: each client puts only the round's shared ``ceil(frac * d)``
    #: coordinates of its update into the masked vector (lowband.privacy.sparsify)
    sparse: Optional[float] = None

    def __post_init__(self) -> None:
        if self.skellam is not None and self.skellam.bits != self.params.modulus_bits:
            raise ValueError(f"distributed DP: dp.bits = {self.skellam.bits} must equal secagg.modulus_bits = "
                             f"{self.params.modulus_bits} (the noise and the sum live in the same ring)")

    def levels_for(self, m: int) -> int:
        if self.levels_bits is not None:
            sa.check_room(m, self.levels_bits, self.params.modulus_bits)
            return self.levels_bits
        bits = self.params.modulus_bits - math.ceil(math.log2(m + 1))
        if bits < 2:
            raise ValueError(f"secagg.modulus_bits = {self.params.modulus_bits} leaves no room for {m} clients")
        return bits


def check_secagg(algorithm: str, family: str = "server") -> None:
    """One-line ValueError when secure aggregation cannot serve ``algorithm``."""
    if algorithm in SECAGG_SERVES:
        return
    why = SECAGG_REFUSED.get(algorithm) or (f"a {family} method has no server that sums" if family != "server"
                                            else "its server needs individual updates (not only their sum)")
    raise ValueError(f"secagg.enabled = true cannot serve algorithm {algorithm!r}: {why}; served: "
                     f"{', '.join(SECAGG_SERVES)}")


def _float_names(params: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k for k, v in params.items() if v.is_floating_point())


def with_secagg(cls: type, run: SecAggRun) -> type:
    """A subclass of the FedAvg-like algorithm class ``cls`` whose rounds aggregate by SecAgg+."""
    check_secagg(getattr(cls, "name", "?"), getattr(cls, "family", "?"))

    class Secure(cls):  # type: ignore[misc, valid-type]
        secagg = run

        def steps(self, round: int, plan: RoundPlan) -> list[Step]:
            inner = super().steps(round, plan)
            names = [s.name for s in inner]
            if names != ["broadcast", "client", "aggregate"]:
                raise ValueError(f"secagg: {self.name}'s round has steps {names}, not broadcast/client/aggregate")
            clients, server = plan.participants, [SERVER]
            return [inner[0],
                    Step("client", clients, self.secagg_client),
                    Step("secagg_keys", server, self.secagg_keys),
                    Step("secagg_shares", clients, self.secagg_shares),
                    Step("secagg_forward", server, self.secagg_forward),
                    Step("secagg_masked", clients, self.secagg_masked),
                    Step("secagg_unmask_request", server, self.secagg_unmask_request),
                    Step("secagg_unmask", clients, self.secagg_unmask),
                    Step("aggregate", server, self.secagg_aggregate)]

        # -- helpers --------------------------------------------------------------------
        def _client(self, ctx: NodeContext, state: State) -> sa._Client:
            x = state.get("_sa_x")
            c = sa._Client(ctx.node, x.numpy().astype(np.uint64) if x is not None else np.zeros(0, np.uint64),
                           self.secagg.params, ctx.seed, ctx.round)
            if "_sa_keys" in state:
                c.take_keys(Message("secagg_keys", dict(state["_sa_keys"])))
            if "_sa_shares" in state:
                c.take_shares(Message("secagg_shares", dict(state["_sa_shares"])))
            return c

        @staticmethod
        def _only(inbox: list[Envelope], kind: str) -> Optional[Message]:
            got = [e.msg for e in inbox if e.msg.kind == kind]
            return got[0] if got else None

        @staticmethod
        def _clean(state: State) -> State:
            return {k: v for k, v in state.items() if not k.startswith("_sa")}

        # -- client: train, quantise, advertise -------------------------------------------
        def secagg_reply(self, ctx: NodeContext, state: State, inbox: list[Envelope], params: Any,
                         stats: Any) -> tuple[State, Outbox]:
            state, out = self.client_reply(ctx, state, inbox, params, stats)
            ups = [(d, m) for d, m in out.items if d == (SERVER,)]
            if len(ups) != 1 or ups[0][1].kind not in ("weights", "delta"):
                raise ValueError(f"secagg: {self.name}'s client must send one weights/delta message to the server")
            msg = ups[0][1]
            glob = inbox[0].msg.tensors
            names = _float_names(glob)
            upd = torch.cat([(msg.tensors[k] - glob[k] if msg.kind == "weights" else msg.tensors[k]).reshape(-1).double()
                             for k in names])
            if self.secagg.sparse is not None:  # the round's shared coordinates (sharedmask's): summable
                upd = upd[message_support(self.secagg.sparse, ctx.seed, ctx.round, msg.kind,
                                          [(k, tuple(glob[k].shape)) for k in names])]
            sk = self.secagg.skellam
            if sk is not None:
                q = sk.encode(upd, seed=ctx.seed, round=ctx.round, node=ctx.node)
            else:
                levels = self.secagg.levels_for(len(ctx.participants))
                q = sa.quantise(upd, self.secagg.clip_range, levels, ctx.rng("secagg-quantise"))
            state = {**self._clean(state), "_sa_x": torch.from_numpy(q.astype(np.int64))}
            return state, Outbox().send(SERVER, self._client(ctx, state).advertise())

        secagg_client = local_sgd_step("client_job", "secagg_reply")

        # -- server: keys to each advertiser's neighbours ------------------------------------
        def secagg_keys(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            adv = {e.src: e.msg.tensors["pk"] for e in inbox if e.msg.kind == "secagg_advertise"}
            graph = sa.neighbours(list(ctx.participants), self.secagg.params, ctx.seed, ctx.round)
            out = Outbox()
            for u in sorted(adv):
                nb = [v for v in graph[u] if v in adv]
                pk = torch.stack([adv[v] for v in nb]) if nb else torch.zeros((0, 2, sa.KEY_BYTES), dtype=torch.uint8)
                out.send(u, Message("secagg_keys", {"ids": sa._ids(nb), "pk": pk}))
            spk = {str(u): t[1].clone() for u, t in adv.items()}
            return {**self._clean(state), "_sa_spk": spk}, out

        def secagg_shares(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            keys = self._only(inbox, "secagg_keys")
            if keys is None or "_sa_x" not in state:
                return self._clean(state), Outbox()
            if len(ctx.participants) < 2:  # a "sum" of one client is its update: SecAgg refuses the round
                return self._clean(state), Outbox()
            state = {**state, "_sa_keys": dict(keys.tensors)}
            t = self.secagg.params.t_for(len(ctx.participants))
            return state, Outbox().send(SERVER, self._client(ctx, state).shares(t))

        def secagg_forward(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            sent = {e.src: e.msg for e in inbox if e.msg.kind == "secagg_shares"}
            rows: dict[int, list[tuple[int, bytes]]] = {u: [] for u in sent}
            for u, m in sent.items():
                for v, blob in zip(m.tensors["ids"].tolist(), m.tensors["ct"].numpy()):
                    if v in rows:
                        rows[v].append((u, blob.tobytes()))
            out = Outbox()
            forwarded: dict[str, torch.Tensor] = {}
            for v in sorted(rows):
                r = sorted(rows[v])
                forwarded[str(v)] = sa._ids(u for u, _ in r)
                out.send(v, Message("secagg_shares", {"ids": forwarded[str(v)],
                                                      "ct": sa._u8([b for _, b in r], sa.CIPHERTEXT_BYTES)}))
            return {**state, "_sa_sent": sa._ids(sent), "_sa_forwarded": forwarded}, out

        def secagg_masked(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            shares = self._only(inbox, "secagg_shares")
            if shares is None or "_sa_keys" not in state:
                return self._clean(state), Outbox()
            state = {**state, "_sa_shares": dict(shares.tensors)}
            return state, Outbox().send(SERVER, self._client(ctx, state).masked())

        def secagg_unmask_request(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            ys = {e.src: e.msg.tensors["y"] for e in inbox if e.msg.kind == "secagg_masked"}
            sent = set(state.get("_sa_sent", torch.zeros(0)).tolist())
            graph = sa.neighbours(list(ctx.participants), self.secagg.params, ctx.seed, ctx.round)
            out = Outbox()
            for w in sorted(ys):
                held = [v for v in graph[w] if v in sent]
                out.send(w, Message("secagg_unmask", {"alive": sa._ids(v for v in held if v in ys),
                                                      "dropped": sa._ids(v for v in held if v not in ys)}))
            return {**state, "_sa_ys": {str(u): y for u, y in ys.items()}}, out

        def secagg_unmask(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            req = self._only(inbox, "secagg_unmask")
            if req is None or "_sa_shares" not in state:
                return self._clean(state), Outbox()
            reply = self._client(ctx, state).unmask(req)
            return self._clean(state), Outbox().send(SERVER, reply)

        # -- server: the sum only, then the algorithm's own aggregation ---------------------
        def secagg_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
            ys = {int(u): y for u, y in state.get("_sa_ys", {}).items()}
            spk = {int(u): t for u, t in state.get("_sa_spk", {}).items()}
            forwarded = {int(u): set(t.tolist()) for u, t in state.get("_sa_forwarded", {}).items()}
            sent = set(state.get("_sa_sent", torch.zeros(0)).tolist())
            state = self._clean(state)
            if not ys:
                return state, Outbox()
            p = self.secagg.params
            m = len(ctx.participants)
            if m < 2:
                return {**state, "secagg_aborted": int(state.get("secagg_aborted", 0)) + 1}, Outbox()
            t = p.t_for(m)
            glob = state["params"]
            names = _float_names(glob)
            full = length = sum(glob[k].numel() for k in names)
            upload = getattr(self.hp, "upload", "delta")
            support = None
            if self.secagg.sparse is not None:
                support = message_support(self.secagg.sparse, ctx.seed, ctx.round, upload,
                                          [(k, tuple(glob[k].shape)) for k in names])
                length = int(support.sum())
            sk = self.secagg.skellam
            if sk is not None:
                length = sk.D
            shares_b: dict[int, dict[int, int]] = {}
            shares_s: dict[int, dict[int, int]] = {}
            for e in inbox:
                if e.msg.kind != "secagg_unmask":
                    continue
                for v, sh in zip(e.msg.tensors["ids"].tolist(), e.msg.tensors["share"].numpy()):
                    (shares_b if v in ys else shares_s).setdefault(int(v), {})[int(e.src) + 1] = sa.from_bytes(sh.tobytes())
            bits = p.modulus_bits
            mask = np.uint64((1 << bits) - 1)
            try:
                if len(ys) < t:
                    raise sa.SecAggAbort(f"{len(ys)} masked inputs, {t} needed")
                total = np.zeros(length, dtype=np.uint64)
                for u in sorted(ys):
                    total = (total + sa.unpack(ys[u].numpy(), bits, length)) & mask
                for u in sorted(ys):
                    total = (total - sa.prg(sa.shamir_reconstruct(shares_b.get(u, {}), t), length, bits)) & mask
                graph = sa.neighbours(list(ctx.participants), p, ctx.seed, ctx.round)
                for v in sorted(sent - set(ys)):
                    s_sk = sa.shamir_reconstruct(shares_s.get(v, {}), t)
                    for w in graph[v]:
                        if w in ys and v in forwarded.get(w, ()):
                            mm = sa.prg(sa.agree(s_sk, sa.from_bytes(spk[w].numpy().tobytes())), length, bits)
                            total = (total - mm) & mask if w < v else (total + mm) & mask
            except sa.SecAggAbort:
                return {**state, "secagg_aborted": int(state.get("secagg_aborted", 0)) + 1}, Outbox()
            if sk is not None:  # DP-FedAvg's fixed denominator: the expected cohort
                mean = sk.decode_sum(total, seed=ctx.seed, round=ctx.round) / sk.n
            else:
                levels = self.secagg.levels_for(m)
                mean = sa.dequantise_sum(total, len(ys), self.secagg.clip_range, levels) / len(ys)
            if support is not None:  # back to the whole model: zero off the round's support
                dense = torch.zeros(full, dtype=mean.dtype)
                dense[support] = mean.reshape(-1)[: length]
                mean = dense
            delta, i = {}, 0
            for k in names:
                n = glob[k].numel()
                delta[k] = mean[i:i + n].reshape(glob[k].shape).to(glob[k].dtype)
                i += n
            tensors = {k: glob[k] + delta[k] for k in names} if upload == "weights" else delta
            reply = Envelope(min(ys), Message(upload, tensors, meta={"num_examples": 1}))
            return self.server_aggregate(ctx, state, [reply])

        def __reduce__(self):  # a class made here has no importable name: pickle how to make it again
            from .central_steps import _remade

            return _remade, (with_secagg, (cls, run), self.__dict__)

    Secure.__name__ = Secure.__qualname__ = f"SecAgg{cls.__name__}"
    return Secure
