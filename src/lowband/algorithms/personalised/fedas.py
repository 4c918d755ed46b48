"""FedAS (Yang, Huang and Ye, "FedAS: Bridging Inconsistency in Personalized Federated
Learning", CVPR 2024; PFLlib ``clientas`` / ``serveras``).

Each client keeps its own model: the base of the received global model replaces the
client's base after *parameter alignment*; the head stays the client's own (it is uploaded
and averaged into the global model, but never overwrites a client's head).

Client round (sampled clients):
1. alignment: class prototypes of the client's current model (mean ``features`` per class
   on its training data); the received global model's base is trained for
   ``align_epochs`` = 1 epoch (SGD lr ``align_lr`` = 0.01, batch ``align_batch_size`` =
   16) to minimise sum over classes in the batch of MSE(features(x_c), prototype_c); the
   aligned base replaces the client's base, its head is kept;
2. local training (cross-entropy, E epochs);
3. Fisher information: after training, the trace of the empirical Fisher,
   sum over training batches of ||grad mean NLL||^2 (PFLlib's estimate);
4. upload the full model and the Fisher trace.

Server: the new global model is the average of the uploaded models weighted by their
Fisher traces (normalised); sample counts are not used.

Guard (``align_guard``, on by default, not in PFLlib): an alignment whose loss ends non-finite or above where it started
is discarded for that client and round (the received base is used unaligned) and counted
in ``alg/align_discarded/c<id>`` (metrics.jsonl); see :func:`align_base`.

Choices: prototypes and the Fisher trace are computed in eval mode (PFLlib leaves the
model in train mode, i.e. with dropout); each client aligns its own copy of the global
model (PFLlib's alignment edits the shared server object in place, so clients later in a
round align an already-aligned model). PFLlib also computes the trace for unsampled
clients each round; it is never used, so we skip it. The ``personal`` protocol evaluates
the model each client holds (the initial model for a client never sampled).
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from lowband.algorithms.personalised._pfl import base_names, class_prototypes, features_of, is_head
from lowband.algorithms.base import SERVER, Envelope, NodeContext, Outbox, Params, State, register
from lowband.algorithms.common import local_train
from lowband.algorithms.server.fedavg import FedAvg, FedAvgClientHP
from lowband.comm.message import Message
from lowband.train import batches, load_params, sgd_train, weighted_average


class FedASHP(FedAvgClientHP):
    align_lr: float = Field(0.01, gt=0, description="learning rate of the parameter alignment (PFLlib: 0.01)")
    align_epochs: int = Field(1, ge=0, description="epochs of parameter alignment (PFLlib: 1)")
    align_batch_size: int = Field(16, ge=1, description="batch size of the alignment and prototypes (PFLlib: 16)")
    align_guard: bool = Field(True, description="discard an alignment whose loss ends non-finite or higher than "
                              "it started (not in PFLlib; false: PFLlib's behaviour, where a diverged alignment "
                              "spreads NaN to every model through the aggregation)")


def _alignment_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, protos: torch.Tensor,
                    valid: torch.Tensor) -> torch.Tensor:
    """Sum over the classes present in the batch of MSE(features(x_c), prototype_c)."""
    z = model.features(x)
    total = z.sum() * 0.0
    for c in y.unique():
        if valid[c]:
            zc = z[y == c]
            total = total + F.mse_loss(zc, protos[c].expand_as(zc))
    return total


def _eval_alignment_loss(ctx: NodeContext, params: Params, protos: torch.Tensor, valid: torch.Tensor) -> float:
    """The alignment loss of ``params`` on the client's whole training set, in eval mode."""
    load_params(ctx.model, params)
    ctx.model.eval()
    with torch.no_grad():
        return float(_alignment_loss(ctx.model, ctx.data.train_x, ctx.data.train_y, protos, valid))


def align_base(ctx: NodeContext, own: Params, glob: Params) -> tuple[Params, bool]:
    """Train the global model's base so its features match the client's class prototypes;
    return the client's model with that base and its own head, and whether the alignment
    diverged.

    The alignment is plain SGD at a fixed rate on an unnormalised MSE, which diverges once
    feature magnitudes grow (seen on Fashion-MNIST, Dirichlet 0.3, round 18: the loss goes
    918 -> 4.6e3 -> 5.9e8 -> NaN in four steps, and the NaN then reaches every model through
    the aggregation). If the aligned base's alignment loss on the client's data is not
    finite or is larger than the unaligned one, the alignment is discarded and the received
    base is used as it is (what FedAS does without alignment)."""
    hp = ctx.hp
    x, y = ctx.data.train_x, ctx.data.train_y
    protos, valid = class_prototypes(features_of(ctx.model, own, x), y, ctx.num_classes)

    aligned, _ = sgd_train(ctx.model, glob, x, y, epochs=hp.align_epochs, batch_size=hp.align_batch_size,
                          lr=hp.align_lr, gen=ctx.rng("align"),
                          loss_fn=partial(_alignment_loss, protos=protos, valid=valid),
                          trainable=base_names(ctx.model))
    diverged = False
    if hp.align_guard and hp.align_epochs > 0:
        before = _eval_alignment_loss(ctx, glob, protos, valid)
        after = _eval_alignment_loss(ctx, aligned, protos, valid)
        diverged = not math.isfinite(after) or after > before
    base = glob if diverged else aligned
    return {k: (own[k] if is_head(k) else base[k]) for k in own}, diverged


def fisher_trace(ctx: NodeContext, params: Params) -> float:
    """Sum over training batches of the squared norm of the gradient of the mean NLL."""
    model = ctx.model
    load_params(model, params)
    model.eval()
    x, y = ctx.data.train_x, ctx.data.train_y
    total = 0.0
    for idx in batches(int(y.shape[0]), ctx.hp.batch_size, ctx.rng("fim")):
        model.zero_grad(set_to_none=True)
        F.nll_loss(F.log_softmax(model(x[idx]), dim=1), y[idx]).backward()
        total += float(sum((p.grad ** 2).sum() for p in model.parameters() if p.grad is not None))
    model.zero_grad(set_to_none=True)
    return total


@register
class FedAS(FedAvg):
    """Parameter alignment + Fisher-weighted aggregation; personal heads."""

    name = "fedas"
    paper = "Yang, Huang and Ye, FedAS: Bridging Inconsistency in Personalized Federated Learning, CVPR 2024"
    Hyperparams = FedASHP
    personalized = True

    def init_node(self, ctx: NodeContext) -> State:
        return {"params": ctx.init_params()}

    def client_update(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        glob = inbox[0].msg.tensors
        start, diverged = align_base(ctx, state["params"], glob)
        params, stats = local_train(ctx, start)
        fim = fisher_trace(ctx, params)
        msg = Message("weights", params, meta={"fim_trace": fim})
        new = {"params": params, "fim_trace": fim, "loss": stats.loss}
        if diverged:
            new["align_discarded_round"] = ctx.round
        return new, Outbox().send(SERVER, msg)

    def server_aggregate(self, ctx: NodeContext, state: State, inbox: list[Envelope]) -> tuple[State, Outbox]:
        if not inbox:
            return state, Outbox()
        w = [float(e.msg.meta["fim_trace"]) for e in inbox]
        if sum(w) <= 0:
            w = [1.0] * len(inbox)
        return {**state, "params": weighted_average([e.msg.tensors for e in inbox], w)}, Outbox()

    def node_metrics(self, ctx: NodeContext, state: State) -> dict[str, float]:
        """``align_discarded/c<id>`` = 1 for each client whose alignment was discarded this
        round (its loss ended non-finite or higher than it started; in round 1, where the
        global model is the clients' own, it typically does not lower it, which changes
        nothing). Measurement only: kept in the client's state, never sent."""
        if state.get("align_discarded_round") == ctx.round:
            return {f"align_discarded/c{ctx.node}": 1.0}
        return {}
