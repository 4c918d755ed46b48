"""Local-only training: every client trains on its own data, nothing is sent.

The lower bound every federated method must beat; "personal" evaluation on each client's
local test split.
"""

from __future__ import annotations

from lowband.algorithms.base import Algorithm, Envelope, NodeContext, Outbox, Params, State, Step, register
from lowband.algorithms.common import LocalSGD, local_job
from lowband.train.cohort import LocalSGDStep, SGDJob
from lowband.topology import RoundPlan
from lowband.train import TrainStats


class LocalHP(LocalSGD):
    pass


@register
class Local(Algorithm):
    """Each node trains its own model for ``local_epochs`` per round; no communication."""

    name = "local"
    family = "local"
    Hyperparams = LocalHP
    default_protocols = ("personal", "node_global")
    default_main = "personal/acc_weighted"

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def steps(self, round: int, plan: RoundPlan) -> list[Step]:
        return [Step("train", plan.participants, self._train)]

    def train_job(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> SGDJob:
        """Local SGD from the node's own model."""
        return local_job(ctx, state["params"])

    def keep_trained(self, ctx: NodeContext, state: State, inbox: list[Envelope], params: Params,
                     stats: TrainStats) -> tuple[State, Outbox]:
        """Keep the trained model; nothing is sent."""
        return {"params": params, "loss": stats.loss}, Outbox()

    #: local SGD, nothing sent (vectorisable: lowband.train.cohort)
    _train = LocalSGDStep(train_job, keep_trained)
