"""``node_global`` for many MLP nodes at once: one wide matrix product per block of nodes.

``node_global`` scores every node's model on the global test set (300 models x 10,000
samples for the DFedAvg baseline, 478 GFLOP a round). One node at a time, the first layer
is a ``[batch, 784] x [784, 100]`` product: too narrow to run at the core's matmul rate.
Here the first-layer weights of a *block* of :data:`NODE_BLOCK` nodes are laid side by
side (``W1_block``: ``[784, NODE_BLOCK * 100]``), so each test batch costs one wide product
``X @ W1_block``; the later layers run as one batched product per block
(``baddbmm`` over the nodes, the last one giving the logits classes-first). Each node is
then scored as :func:`lowband.train.evaluate` scores it (mean cross-entropy, accuracy),
along the samples.

**Same bits on every backend.** A block is fixed by node ids (``node // NODE_BLOCK``) and a
node always sits in column block ``node % NODE_BLOCK`` (absent nodes' columns are zero),
so the products have the same shapes and a node's columns the same place whether one
process holds all nodes or a worker holds a part of the block: the serial path and the
worker pool give byte-identical metrics (tests/test_pool.py). Against the per-node path the
logits differ by float rounding only (tests/test_node_eval.py).

Used for models :func:`lowband.train.cohort.mlp_layers` recognises (lowband's ``MLP``
and ``LogReg``); any other node takes the per-node path.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from lowband.train.cohort import mlp_layers

__all__ = ["NODE_BLOCK", "blockable", "map_many", "node_global_one", "stacked_logits"]

#: nodes per block: 8 x 100 hidden units make a [784, 800] first layer (2.5 MB, about a
#: core's L2 cache here), wide enough for the matmul rate; measured fastest of 8, 16 and
#: 32 (node_global of the 300-node DFedAvg baseline on two workers: about 1.8, 2.0 and
#: 2.2 s a round)
NODE_BLOCK = 8


def stacked_logits(layers: list[tuple[str, str]], params: Sequence[Optional[dict[str, torch.Tensor]]],
                   x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Logits ``[len(params), classes, len(x)]`` (classes first: the scoring then runs along
    the samples, the long contiguous axis) of a block of Linear-ReLU stacks (``None``: an
    absent node, zero weights) on ``x``, ``batch_size`` rows at a time."""
    G = len(params)
    ref = next(p for p in params if p is not None)
    w0 = ref[layers[0][0]]
    H, D = int(w0.shape[0]), int(w0.shape[1])
    # first layer side by side: [D, G * H]; hidden layers stacked [G, in, out]; the last
    # one [G, out, in] (it makes the logits transposed)
    W1 = torch.zeros(D, G * H, dtype=w0.dtype, device=w0.device)
    b1 = torch.zeros(G * H, dtype=w0.dtype, device=w0.device)
    for g, p in enumerate(params):
        if p is not None:
            W1[:, g * H:(g + 1) * H] = p[layers[0][0]].t()
            b1[g * H:(g + 1) * H] = p[layers[0][1]]
    rest: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, (w, b) in enumerate(layers[1:]):
        last = i == len(layers) - 2
        wr = ref[w]
        o, k = int(wr.shape[0]), int(wr.shape[1])
        Wl = torch.zeros(G, *((o, k) if last else (k, o)), dtype=wr.dtype, device=wr.device)
        bl = torch.zeros(G, *((o, 1) if last else (1, o)), dtype=wr.dtype, device=wr.device)
        for g, p in enumerate(params):
            if p is not None:
                Wl[g] = p[w] if last else p[w].t()
                bl[g] = p[b].view(o, 1) if last else p[b].view(1, o)
        rest.append((Wl, bl))
    x2 = x.reshape(x.shape[0], -1)
    n = int(x2.shape[0])
    C = int(rest[-1][0].shape[1]) if rest else H
    out = torch.empty(G, C, n, dtype=w0.dtype, device=w0.device)
    with torch.no_grad():
        for r in range(0, n, batch_size):
            xb = x2[r:r + batch_size]
            c = int(xb.shape[0])
            z = torch.addmm(b1, xb, W1).view(c, G, H)  # [c, G, H]
            if not rest:  # a single layer (LogReg): the logits
                out[:, :, r:r + c] = z.permute(1, 2, 0)
                continue
            a = z.relu_().transpose(0, 1)  # [G, c, H]
            for Wl, bl in rest[:-1]:
                a = torch.baddbmm(bl, a, Wl).relu_()
            Wl, bl = rest[-1]
            out[:, :, r:r + c] = torch.baddbmm(bl, Wl, a.transpose(1, 2))  # [G, C, c]
    return out


def _score(lg: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of one node's transposed logits ``[classes, samples]``."""
    lp = torch.log_softmax(lg, 0)
    loss = -lp.gather(0, y.view(1, -1)).mean()
    pred = lg.t().contiguous().argmax(1)  # (argmax along a short strided axis is several times slower)
    return float((pred == y).float().mean()), float(loss)


def blockable(model: torch.nn.Module, params: Optional[dict[str, torch.Tensor]],
              y: torch.Tensor) -> Optional[list[tuple[str, str]]]:
    """The layers of ``model`` when its node can be scored in a block (see the module
    docstring), else None."""
    layers = mlp_layers(model)
    if layers is None or params is None or int(y.shape[0]) == 0:
        return None
    if set(params) != {k for k, _ in model.named_parameters()}:
        return None
    return layers


def node_global_one(model: torch.nn.Module, node: int, params: dict[str, torch.Tensor],
                    test: tuple[torch.Tensor, torch.Tensor], bs: int) -> Optional[tuple[float, float]]:
    """One node's ``(accuracy, loss)`` computed in its block slot (the other slots empty),
    so that a backend scoring nodes one by one (the Flower client) gets the bits of the
    blocked path; None where the model is not blockable. Costs a block's products for one
    node (``NODE_BLOCK`` x the FLOPs): for single calls only."""
    layers = blockable(model, params, test[1])
    if layers is None:
        return None
    slots: list[Optional[dict[str, torch.Tensor]]] = [None] * NODE_BLOCK
    slots[node % NODE_BLOCK] = params
    return _score(stacked_logits(layers, slots, test[0], bs)[node % NODE_BLOCK], test[1])


def map_many(ex: Any, nodes: Sequence[int], round: int, plan: Any, per_node: Callable[..., Any],
             params_of: Callable[[Any], Optional[dict[str, torch.Tensor]]], test: tuple[torch.Tensor, torch.Tensor],
             bs: int) -> dict[int, tuple[float, float]]:
    """``{node: (accuracy, loss)}`` on ``test`` for ``nodes`` of executor ``ex`` (a serial
    executor or a worker's), the MLP nodes in blocks (:func:`stacked_logits`), the others
    with ``per_node(ctx, state)``."""
    x, y = test
    out: dict[int, tuple[float, float]] = {}
    blocks: dict[tuple[str, int], list[int]] = {}
    for n in nodes:
        if blockable(ex.model_for(n), params_of(ex.states[n]), y) is None:
            out[n] = per_node(ex.context(n, round, plan), ex.states[n])
        else:
            blocks.setdefault((ex.env.model_key(n), n // NODE_BLOCK), []).append(n)
    for members in blocks.values():
        layers = mlp_layers(ex.model_for(members[0]))
        assert layers is not None
        slots: list[Optional[dict[str, torch.Tensor]]] = [None] * NODE_BLOCK
        for n in members:
            slots[n % NODE_BLOCK] = params_of(ex.states[n])
        logits = stacked_logits(layers, slots, x, bs)
        for n in members:
            out[n] = _score(logits[n % NODE_BLOCK], y)
    return {n: out[n] for n in nodes}
