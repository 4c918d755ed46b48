"""Size bounds: every size a config asks for, checked before anything is allocated.

The schema (:mod:`lowband.config.schema`) checks each value's type and range on its own;
this module, called by the resolver once the algorithm and model names are known, checks
the sizes a run would allocate or loop over:

- whole numbers are whole (``algorithm.batch_size = 1e9`` or ``= true`` is refused, as the
  schema refuses them for its own keys), floats fit a float32 tensor (``lr = 1e308``
  overflows in the first update);
- sizes beyond :data:`LIMITS` (epochs, batch sizes, model widths, rounds, data sizes) and
  hyperparameters above :data:`HUGE_FLOAT` are refused unless the config says
  ``allow_huge = true``: such a value is a typo far more often than a plan, and a typo
  here costs gigabytes or days before it shows;
- the model's parameters times the copies the run holds (:func:`memory_estimate`, the
  model built on PyTorch's ``meta`` device, which allocates nothing) must fit the memory
  this machine has free, again unless ``allow_huge = true``. Node states are made when a
  node first takes part and kept: a copy per node that takes part during the run (none
  for an algorithm whose clients keep no model), and one per participant of a round for
  its messages.

Every refusal is one :class:`~lowband.config.schema.ConfigError` line naming the key,
the limit and the way out.
"""

from __future__ import annotations

import fnmatch
import math
import os
from typing import Any, Optional, Union, get_args, get_origin

from lowband.config.schema import ConfigError, Experiment, whole_number_hint

#: the largest finite float32: a hyperparameter beyond it is inf on the first tensor it touches
FLOAT32_MAX = 3.4028234663852886e38
#: a float hyperparameter above this (learning rates, coefficients) needs ``allow_huge``;
#: lr = 1e6, the norm screen's exploding client, is still accepted
HUGE_FLOAT = 1e6

#: (key pattern, limit): the largest value accepted without ``allow_huge = true``; a key
#: is matched by its dotted name (``algorithm.local_epochs``); first match wins
LIMITS: list[tuple[str, int]] = [
    ("rounds", 100_000),
    ("algorithm.*epoch*", 10_000),
    ("algorithm.*steps*", 1_000_000),
    ("algorithm.*iter*", 1_000_000),
    ("algorithm.*batch*", 1_000_000),
    ("algorithm.*", 10_000_000),
    ("model.*", 1_000_000),
    ("eval.batch_size", 1_000_000),
    ("data.samples_per_client", 10_000_000),
    ("data.public_size", 10_000_000),
    ("data.min_size", 10_000_000),
]

#: (channels, height, width) or (features,) and classes of the bundled datasets, for the
#: memory estimate (a dataset not listed is not estimated)
SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion_mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
}

#: model copies the run keeps per node that has taken part (its weights; optimiser state and
#: codec residuals come on top, so the estimate is a floor), per participant of a round (its
#: message in flight: a peer round holds every node's trained weights and their messages at
#: once), and the fixed copies of a run (the server's model, the worker's model, its gradient,
#: evaluation)
COPIES_PER_NODE = 1
COPIES_PER_PARTICIPANT = 1
COPIES_FIXED = 8


def _limit(key: str) -> Optional[int]:
    for pattern, limit in LIMITS:
        if fnmatch.fnmatchcase(key, pattern):
            return limit
    return None


def _huge(key: str, detail: str) -> ConfigError:
    return ConfigError(f"{key}: {detail}; if you mean it, add allow_huge = true (top level of the config)")


def _check_value(key: str, value: Any, expect_int: bool, allow_huge: bool, expect_bool: bool = False) -> None:
    """One value of an algorithm or model option (lists checked item by item)."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_value(f"{key}[{i}]", v, expect_int, allow_huge, expect_bool)
        return
    if isinstance(value, bool) and not expect_bool and not expect_int:
        raise ConfigError(f"{key}: must be a number or a name, not true/false (got {value!r})")
    if expect_int and (isinstance(value, bool) or isinstance(value, float)):
        raise ConfigError(f"{key}: {whole_number_hint(value)} (got {value!r})")
    if isinstance(value, float):
        if abs(value) > FLOAT32_MAX:
            raise ConfigError(f"{key}: {value:g} does not fit a float32 tensor (|value| <= 3.4e38); "
                              f"use a value of a sensible size")
        if abs(value) > HUGE_FLOAT and not allow_huge:
            raise _huge(key, f"{value:g} is above {HUGE_FLOAT:g}")
    elif isinstance(value, int) and not isinstance(value, bool):
        limit = _limit(key)
        if limit is not None and value > limit and not allow_huge:
            raise _huge(key, f"{value} is above {limit:,}")


def _is_bool(annotation: Any) -> bool:
    """Whether a field annotation admits ``bool`` (or is not known: Any)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_is_bool(a) for a in get_args(annotation))


def _is_int(annotation: Any) -> bool:
    """Whether a field annotation is ``int`` (or Optional / a tuple or list of ints)."""
    if annotation is int:
        return True
    origin = get_origin(annotation)
    if origin in (Union, list, tuple) or str(origin) in ("types.UnionType",):
        args = [a for a in get_args(annotation) if a is not type(None) and a is not Ellipsis]
        return bool(args) and all(_is_int(a) for a in args)
    return False


def check_options(exp: Experiment) -> None:
    """Whole numbers, float sizes and limits of the algorithm's and the model's options
    (their own models accept ``1e3`` for an int and any float; the schema's keys are
    checked by the schema itself)."""
    from lowband.algorithms import ALGORITHMS
    from lowband.models import MODELS

    fields = ALGORITHMS[exp.algorithm.name].Hyperparams.model_fields
    for key, value in exp.algorithm.options().items():
        f = fields.get(key)
        _check_value(f"algorithm.{key}", value, f is not None and _is_int(f.annotation), exp.allow_huge,
                     f is None or _is_bool(f.annotation))
    accepted = MODELS[exp.model.name].kwargs
    for key, value in exp.model.options().items():
        default = accepted.get(key)
        expect_int = isinstance(default, int) and not isinstance(default, bool) or (
            isinstance(default, tuple) and bool(default) and all(isinstance(d, int) for d in default))
        _check_value(f"model.{key}", value, expect_int, exp.allow_huge, default is None or isinstance(default, bool)
                     or not isinstance(default, (int, float, tuple)))


def check_sizes(exp: Experiment) -> None:
    """The schema's own sizes against :data:`LIMITS` (rounds, data and evaluation sizes)."""
    if exp.allow_huge:
        return
    values = {"rounds": exp.rounds, "eval.batch_size": exp.eval.batch_size,
              "data.samples_per_client": exp.data.samples_per_client, "data.public_size": exp.data.public_size,
              "data.min_size": exp.data.min_size}
    for key, value in values.items():
        _check_value(key, value, True, False)


def available_memory() -> Optional[int]:
    """Bytes of memory this machine has free now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def model_params(exp: Experiment) -> Optional[int]:
    """Parameters of the experiment's model (the largest of a mix), built on the ``meta``
    device (nothing allocated); None for a dataset of unknown shape or a model that cannot
    be built that way."""
    if exp.data.dataset not in SHAPES:
        return None
    import torch

    from lowband.models import build_model

    shape, classes = SHAPES[exp.data.dataset]
    best = 0
    for name in exp.model.mix or [exp.model.name]:
        try:
            with torch.device("meta"):
                model = build_model(name, num_classes=classes, input_shape=shape, **exp.model.options())
        except Exception:  # a builder that needs real tensors: not estimated
            return None
        best = max(best, sum(p.numel() for p in model.parameters()))
    return best


def participants_per_round(exp: Experiment) -> int:
    """Nodes that take part in a round: a star's sample (``count``, ``fraction``), else all."""
    from lowband.algorithms import ALGORITHMS

    n, t = exp.data.num_clients, exp.topology
    family = ALGORITHMS[exp.algorithm.name].family
    if (t.kind or ("star" if family in ("server", "local") else "")) != "star" or family == "local":
        return n
    if t.sampling == "count" and t.count is not None:
        return min(n, t.count)
    if t.sampling in ("fraction", "poisson"):
        return min(n, max(1, math.ceil(t.fraction * n)))
    return n


def model_holders(exp: Experiment) -> int:
    """Nodes that hold a model of their own by the end of the run: none where the
    algorithm's clients keep no state (:attr:`~lowband.algorithms.base.Algorithm.stateless_clients`,
    declared by each class itself), else every node that takes part at least once, at
    most ``rounds`` x the round's participants (states are made on first use)."""
    from lowband.algorithms import ALGORITHMS

    cls = ALGORITHMS[exp.algorithm.name]
    if cls.__dict__.get("stateless_clients", False):
        return 0
    n, per = exp.data.num_clients, participants_per_round(exp)
    return n if per >= n else min(n, per * max(1, exp.rounds))


def memory_estimate(exp: Experiment) -> Optional[tuple[int, int]]:
    """(bytes, parameters): a lower estimate of the memory the run's models take, float32
    parameters times the copies the run holds at its peak (:data:`COPIES_PER_NODE` per
    :func:`model_holders`, :data:`COPIES_PER_PARTICIPANT` per participant of a round, plus
    :data:`COPIES_FIXED`); None where the model's size is not known beforehand."""
    n = model_params(exp)
    if n is None:
        return None
    copies = (COPIES_PER_NODE * model_holders(exp) + COPIES_PER_PARTICIPANT * participants_per_round(exp)
              + COPIES_FIXED)
    return 4 * n * copies, n


def check_memory(exp: Experiment) -> None:
    """Refuse a run whose models alone would not fit the free memory (unless ``allow_huge``)."""
    if exp.allow_huge:
        return
    est = memory_estimate(exp)
    free = available_memory()
    if est is None or free is None or est[0] <= free:
        return
    need, n = est
    raise _huge("model", f"{exp.model.name} has {n:,} parameters; {exp.data.num_clients:,} nodes "
                         f"({participants_per_round(exp):,} a round) hold about {need / 2**30:.1f} GiB of model "
                         f"copies, more than the {free / 2**30:.1f} GiB free "
                         f"on this machine; use a smaller model or fewer clients")


def check_bounds(exp: Experiment) -> None:
    """All of the above, in order: options, the schema's sizes, then memory."""
    check_options(exp)
    check_sizes(exp)
    check_memory(exp)
