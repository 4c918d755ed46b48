"""FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022).

Clients train asynchronously, as in FedAsync, but the server does not touch its model at
every arrival: it adds each arrived update ``Delta_i`` (the client's model minus the version
it downloaded), scaled by ``1 / sqrt(1 + staleness)``, to a buffer, and after ``K``
(``buffer_size``) arrivals steps ``x <- x + server_lr * buffer / K`` and empties the buffer.
Memory: the server keeps one buffer sum the size of the model, never the K updates.

It runs on the event clock (:mod:`lowband.asynchronous.clock`) like FedAsync
(:class:`~lowband.algorithms.server.fedasync.AsyncServer`): one driver round is one
arrival, so ``rounds`` counts arrivals and the model changes every ``K``-th round;
staleness counts server updates (``K`` arrivals each).

Defaults: ``K = 10`` is the paper's buffer size; ``server_lr = 1.0`` applies the buffered
mean as FedAvg would (the paper tunes it per task); ``concurrency = 100`` keeps every
client of a 100-client federation busy while its device is on (the paper's concurrency
exceeds K tenfold). Local training is FedAvg's (a deliberate deviation: the comparison
with synchronous rounds differs in the aggregation only).
"""

from __future__ import annotations

from pydantic import Field

from lowband.algorithms.base import NodeContext, Params, State, register
from lowband.algorithms.server.fedasync import AsyncHP, AsyncServer
from lowband.asynchronous.staleness import fedbuff_scale
from lowband.train import is_float

__all__ = ["FedBuff", "FedBuffHP"]


class FedBuffHP(AsyncHP):
    concurrency: int = Field(100, ge=1, description="clients training at once (the event clock keeps this many "
                             "jobs in flight while devices are available)")
    buffer_size: int = Field(10, ge=1, description="K: arrivals buffered per server update")
    server_lr: float = Field(1.0, gt=0, description="server learning rate on the buffered mean update")


@register
class FedBuff(AsyncServer):
    """Buffered asynchronous aggregation with 1/sqrt(1 + staleness) scaling."""

    name = "fedbuff"
    paper = "Nguyen et al., Federated Learning with Buffered Asynchronous Aggregation, AISTATS 2022"
    Hyperparams = FedBuffHP
    upload_kind = "delta"

    @property
    def buffer_size(self) -> int:
        return int(self.hp.buffer_size)

    def init_server(self, ctx: NodeContext) -> State:
        state = super().init_server(ctx)
        state["buffer"] = {k: v.new_zeros(v.shape) for k, v in state["params"].items() if is_float(v)}
        state["count"] = 0
        return state

    def apply(self, ctx: NodeContext, state: State, update: Params, staleness: int) -> State:
        scale = fedbuff_scale(staleness)
        buf = {k: v + scale * update[k].to(v.dtype) if k in update else v for k, v in state["buffer"].items()}
        count = int(state["count"]) + 1
        if count < self.buffer_size:
            return {**state, "buffer": buf, "count": count}
        step = float(self.hp.server_lr) / self.buffer_size
        params = {k: v + step * buf[k] if k in buf else v for k, v in state["params"].items()}
        zero = {k: v.new_zeros(v.shape) for k, v in buf.items()}
        return {**state, "params": params, "buffer": zero, "count": 0, "version": int(state["version"]) + 1}
