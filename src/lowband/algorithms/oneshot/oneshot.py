"""One-shot FedAvg over a contact plan: the FOL paper's "FedAvg" baseline.

Same pretraining and the same exchange as FOL (:mod:`lowband.algorithms.oneshot.fol`): in round
e every client sends its current model to each peer it meets (both directions of a
contact, counted per direction). A target client then replaces its model by the uniform
average of its current model and the models received this round ("each satellite
directly averages the parameters of all models received from its neighbors", section
4; including the client's own model is our reading, see docs/algorithms/fol.md), and the
average is evaluated on its local test split. The average is carried to the next round,
so E = 2, 3 average again with the next contacts, as the paper's FedAvg (E = 1/2/3)
rows suggest. Non-target clients keep their pretrained model. Averaging needs every
received model to have the client's own architecture (checked).

Reported per target client ``k``: ``oneshot/c<k>/acc`` (the average) and
``oneshot/c<k>/local_acc`` (the pretrained model).
"""

from __future__ import annotations

from lowband.algorithms.base import Envelope, NodeContext, Outbox, State, register
from lowband.algorithms.oneshot.fol import OneShotHP, _OneShotBase, arch_key, read_arch, to_native
from lowband.train import weighted_average


class OneShotFedAvgHP(OneShotHP):
    pass


@register
class OneShotFedAvg(_OneShotBase):
    """Uniform parameter average of the local model and the models met this round."""

    name = "oneshot_fedavg"
    paper = "McMahan et al., AISTATS 2017, as the one-shot baseline of Huang & Shu, ICML 2025"
    Hyperparams = OneShotFedAvgHP
    aggregation_hook = True

    def _collect(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not self.is_target(ctx.node) or not inbox:
            return state, Outbox()
        arch = self._arch(ctx, state)
        mine = arch_key(arch)
        models = [state["params"]]
        senders = [ctx.node]
        for env in sorted(inbox, key=lambda e: e.src):
            other = read_arch(str(env.msg.meta["arch"]))
            if arch_key(other) != mine:
                raise ValueError(f"oneshot_fedavg: node {ctx.node} received a model of another architecture from "
                                 f"node {env.src}; parameter averaging needs one architecture")
            models.append(to_native(env.msg.tensors, arch))
            senders.append(env.src)
        new = ctx.aggregate(models, [1.0] * len(models), state["params"], senders=senders,
                            plain=lambda: weighted_average(models))  # the [aggregation] hook (a peer rule)
        return {**state, "params": new}, Outbox()

    def node_metrics(self, ctx: NodeContext, state: State) -> dict[str, float]:
        if not self.is_target(ctx.node) or not state.get("pretrained"):
            return {}
        k = ctx.node
        return {f"oneshot/c{k}/acc": self._acc(ctx.model, state["params"], ctx),
                f"oneshot/c{k}/local_acc": self._acc(ctx.model, state["local0"], ctx)}
