"""All local training, written once and used by every algorithm.

- :mod:`lowband.train.params`: parameters as plain dicts (load, read, average, combine);
- :mod:`lowband.train.sgd`: minibatches and local SGD (:func:`sgd_train`);
- :mod:`lowband.train.schedule`: the learning-rate schedule (:func:`decayed_lr`);
- :mod:`lowband.train.steps`: the other optimiser loops algorithms run (a SAM step, masked
  SGD, distillation on public data, generator training), each a named function;
- :mod:`lowband.train.cohort` (and :mod:`~lowband.train.cohort_cnn`): many nodes' local SGD
  as one vectorised cohort, and :class:`~lowband.train.cohort.LocalSGDStep`, the step an
  algorithm writes to get it;
- :mod:`lowband.train.evaluate`: logits and accuracy on in-memory tensors.

No optimiser loop lives outside this package (tests/test_train_package.py checks it).
"""

from __future__ import annotations

from lowband.train.evaluate import MIN_FORWARD_ROWS, ROW_ALIGN, eval_batch, evaluate, predict_logits
from lowband.train.params import (Params, add_scaled, clone_params, flatten, get_params, is_float, load_params, sub,
                                  weighted_average)
from lowband.train.schedule import decayed_lr
from lowband.train.sgd import (EPOCH_GATHER_BYTES, LossFn, TrainStats, batches, cross_entropy, diverged_count,
                               epoch_batches, note_divergence, sgd_train)

__all__ = ["EPOCH_GATHER_BYTES", "MIN_FORWARD_ROWS", "ROW_ALIGN", "LossFn", "Params", "TrainStats", "add_scaled",
           "batches", "clone_params", "cross_entropy", "decayed_lr", "diverged_count", "epoch_batches",
           "eval_batch", "evaluate", "flatten", "get_params", "is_float", "load_params", "note_divergence",
           "predict_logits", "sgd_train", "sub", "weighted_average"]
