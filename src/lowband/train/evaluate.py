"""Evaluation on in-memory tensors: logits and accuracy whose bits do not depend on which
other rows share a forward pass (see :data:`ROW_ALIGN`)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from lowband.train.params import Params, load_params


#: A sample's logits are the same bits whichever rows share its forward pass only if its
#: position in the pass is the same modulo ``ROW_ALIGN`` and the pass has at least
#: ``MIN_FORWARD_ROWS`` rows: BLAS / oneDNN take other kernels for a handful of rows (on an
#: AMD EPYC: 1-3 rows on one thread, 1-11 not a multiple of 4 on two or more) and for the
#: tail rows of a block, whose sums round differently. :func:`predict_logits` pads short
#: passes with zero rows and starts its passes ``eval_batch(batch_size)`` (a multiple of
#: ``ROW_ALIGN``) apart, and the pooled evaluation starts each node's test split at a
#: multiple of ``ROW_ALIGN``, so a node's ``personal`` score is the same bits pooled in one
#: pass, per worker, or alone (tests/test_evaluation_speed.py, tests/test_cohort.py).
ROW_ALIGN = 16
MIN_FORWARD_ROWS = 32


def eval_batch(batch_size: int) -> int:
    """The evaluation batch actually used for ``batch_size``: rounded down to a multiple of
    :data:`ROW_ALIGN` (at least one), so every pass starts at an aligned row."""
    return max(ROW_ALIGN, int(batch_size) - int(batch_size) % ROW_ALIGN)


@torch.no_grad()
def predict_logits(model: nn.Module, params: Optional[Params], x: torch.Tensor, batch_size: int = 2000) -> torch.Tensor:
    """Logits of the model (eval mode) on ``x``; ``params`` None uses what is loaded. Passes
    of ``eval_batch(batch_size)`` rows, a short one zero-padded to :data:`MIN_FORWARD_ROWS`,
    so that a sample's logits do not depend on what else shares its pass (see ``ROW_ALIGN``)."""
    if params is not None:
        load_params(model, params)
    model.eval()
    bs = eval_batch(batch_size)
    outs = []
    for i in range(0, int(x.shape[0]), bs):
        chunk = x[i : i + bs]
        n = int(chunk.shape[0])
        if n < MIN_FORWARD_ROWS:
            chunk = torch.cat([chunk, chunk.new_zeros((MIN_FORWARD_ROWS - n, *chunk.shape[1:]))])
        outs.append(model(chunk)[:n])
    return torch.cat(outs) if outs else torch.empty(0)


@torch.no_grad()
def evaluate(model: nn.Module, params: Optional[Params], x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 2000) -> tuple[float, float, int]:
    """(accuracy, mean cross-entropy, number of samples) of the model on ``(x, y)``."""
    n = int(y.shape[0])
    if n == 0:
        return float("nan"), float("nan"), 0
    logits = predict_logits(model, params, x, batch_size)
    loss = float(F.cross_entropy(logits, y, reduction="mean"))
    acc = float((logits.argmax(1) == y).float().mean())
    return acc, loss, n
