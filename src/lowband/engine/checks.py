"""Refusals before a run starts, and once-per-run warnings about what crossed the links.

Design rule 7: a run that cannot measure what it was asked to refuses with one line
before it starts. Everything here is a pure check of the validated experiment (and, for
the protocols, of the federation it built); nothing here changes what a run computes.

Refused (:class:`~lowband.config.ConfigError`, the CLI's exit status 2):

- an algorithm/topology pair that cannot work: a server method on a peer graph or a
  contact plan (it would ignore the links and talk to every node), a peer or contact
  method on a star (no peer links: 0 bytes, every node trains alone);
- a ``[topology]`` key set to a non-default value for a kind (or star sampling mode)
  that does not read it, and likewise a ``[data]`` partition key for another partition;
- a contact plan with neither ``per_round`` nor ``plan_file`` (or both);
- an evaluation protocol the algorithm cannot measure (:func:`served_protocols`), or
  ``personal`` without local test splits;
- a method that needs a public reference set (``Algorithm.needs_public``) with
  ``data.public_size = 0``;
- a codec with sender state (``ef(...)``, ``powersgd(r)``) on a message kind whose tensors
  change shape or coordinates between rounds (``Algorithm.unaligned_kinds``: FedCSPACK's
  packs, DisPFL's masked values, FedSPU's sub-models, FedMD's alignment logits, NTK-DFL's
  per-example payloads);
- an ``[aggregation]`` rule on an algorithm whose aggregation does not go through the hook
  (``Algorithm.aggregation_hook``: FedCSPACK, KTA, FOL ...; lowband.aggregation.install);

Warned once per run (:class:`LowbandWarning`, by :class:`TrafficWatch` reading the
ledger after each evaluated round):

- a lossy codec (``topk``, ``randmask``, ``sketch``, ``sign``, ``qsgd``, ``powersgd``) on a message that carries whole
  weights (kinds in :data:`WEIGHT_KINDS`; not under ``ef21``, whose receiver gets a dense
  estimate): it zeroes most weights, and the model stops
  learning (FedAvg on digits: 51.1% -> 10.0%); send deltas instead
  (``algorithm.upload = "delta"`` with ``comm.by_kind.delta = "topk(0.01)+fp16"``);
- an encoded message more than :data:`OVERSIZE_FACTOR` times the fp32 message of the
  model it stands for (SPARK's projected Jacobians at k = 1000 on a 2,410-parameter MLP):
  the "compressed" exchange costs more than sending the weights.

Warned once per run by :class:`DecayWatch` (reading each evaluated round's metrics): a main
accuracy whose median over the last :data:`DECAY_WINDOW` evaluations is more than
:data:`DECAY_DROP` under the best such median. The run learned and is now unlearning (SPARK
at paper size under the spec's distillation schedule: 77.76% at round 13, 48.01% at round
30), and its final value, which the tables report, is not what it reached.

Warned once per run by :class:`ChanceWatch`: by the run's half-way round, a main accuracy
that has never been more than :data:`CHANCE_MARGIN` above chance (one over the number of
classes). The run exits 0 having learned nothing (a learning rate far too high or too
low, a codec that zeroes every update, an algorithm that never trains); summary.json
records it under ``learned_nothing`` when it still holds at the end, and the tables mark
such a cell.
"""

from __future__ import annotations

import statistics
import math
import warnings
from collections import deque
from typing import Any, Optional, Sequence

from lowband.aggregation.install import check as aggregation_check
from lowband.aggregation.install import install as aggregation_install
from lowband.config.schema import STAR_SAMPLING_KEYS, TOPOLOGY_KEYS, ConfigError, Experiment

#: topology kinds that give peer links (RoundPlan.neighbors)
PEER_KINDS = ("kregular", "ring", "complete", "erdos_renyi", "contact_plan")
#: the topology of each family when ``topology.kind`` is left out (engine.simulator.make_topology)
FAMILY_DEFAULT_KIND = {"server": "star", "peer": "kregular", "oneshot": "contact_plan", "local": "star"}
#: message kinds whose tensors are whole model weights (not deltas, logits or statistics)
WEIGHT_KINDS = ("weights", "sparse_weights", "head")
#: codecs that drop or hash coordinates (as opposed to rounding every value)
SPARSIFIERS = ("topk", "randmask", "sketch")
#: codecs that lose most of a whole-weights message, and how: the sparsifiers, and the coarse
#: compressors that are unbiased or error-fed on updates but not on weights (qsgd and
#: powersgd on DFedAvg's weights: 17.0% against 67.7% with fp32); fp16, bf16 and int8 round
#: each value finely and are not listed
WEIGHT_LOSSY: dict[str, str] = {"topk": "zeroes most of them", "randmask": "zeroes most of them",
                                "sketch": "hashes them into a small table", "sign": "keeps only their signs",
                                "qsgd": "rounds each to a few levels of the tensor's norm",
                                "powersgd": "keeps a low-rank approximation of each"}
#: an encoded message larger than this many fp32 model messages is warned about; a message
#: may carry statistics beside a model (FedPAC: +27% on the digits MLP), not twice the model
OVERSIZE_FACTOR = 2.0


class LowbandWarning(UserWarning):
    """A run that works but probably not as meant (the CLI prints it as one line)."""


#: the median of the main accuracy over the last DECAY_WINDOW evaluations more than this
#: (absolute, as a fraction) under the best such median so far is warned about
DECAY_DROP = 0.10
#: evaluations per median: a median of 7 ignores up to 3 outlying rounds (FedAvg-family runs on
#: pathological splits swing by 10-40 points from one round to the next and recover)
DECAY_WINDOW = 7


def _say(msg: str, quiet: bool) -> str:
    """Warn ``msg`` once as a :class:`LowbandWarning` (at the watch's caller) unless ``quiet``
    (a resumed run replaying rounds an earlier process already warned about); return it."""
    if not quiet:
        warnings.warn(msg, LowbandWarning, stacklevel=3)
    return msg


class DecayWatch:
    """Warns once when the main accuracy has fallen from what the run reached and stays
    there: the median of the last :data:`DECAY_WINDOW` evaluations (round 0 left out) is more
    than :data:`DECAY_DROP` under the best such median so far (see the module docstring).
    Replayed over the 99 run folders behind docs/results (commit 0a8753e, 2026-11-25), it fires on two: SPARK
    at paper size (round 26) and FedDBE on pathological FMNIST (79.3% after round 1, 55.0%
    from round 42; round 17), and on none of the runs that swing and recover. Only metrics
    named ``*acc*`` are watched: a loss or a byte count has no "best" to fall from."""

    def __init__(self, main: str, drop: float = DECAY_DROP, window: int = DECAY_WINDOW):
        self.main, self.drop, self.window = main, drop, window
        self.recent: deque[float] = deque(maxlen=window)  # the last ``window`` values
        self.best: Optional[tuple[float, int]] = None  # (median, last round of its window)
        self.peak: Optional[tuple[float, int]] = None  # (value, round): the best single evaluation
        self.warned = False

    @property
    def down(self) -> bool:
        """Whether the rule holds now (after the last value fed): a full window whose median
        is more than ``drop`` under the best such median. Tables read it at a cell's round."""
        if self.best is None or len(self.recent) < self.window:
            return False
        return float(statistics.median(self.recent)) < self.best[0] - self.drop

    def check(self, rec: dict[str, Any], quiet: bool = False) -> Optional[str]:
        """Feed one evaluated round's metrics; returns (and, unless ``quiet``, warns) the
        message the first time the rule holds, else None. ``quiet`` replays a resumed
        run's earlier rounds."""
        v, r = rec.get(self.main), int(rec.get("round", 0))
        if "acc" not in self.main or r == 0 or not isinstance(v, (int, float)) or v != v:
            return None
        v = float(v)
        if self.peak is None or v > self.peak[0]:
            self.peak = (v, r)
        self.recent.append(v)
        if len(self.recent) < self.window:
            return None
        med = float(statistics.median(self.recent))
        if self.best is None or med > self.best[0]:
            self.best = (med, r)
        if not self.down or self.warned:
            return None
        self.warned = True
        msg = (f"round {r}: {self.main} has fallen from what the run reached and stays there: its median over "
               f"the last {self.window} evaluations is {100 * med:.2f}%, more than {100 * self.drop:g} points under "
               f"the best such median ({100 * self.best[0]:.2f}%, to round {self.best[1]}; best single value "
               f"{100 * self.peak[0]:.2f}% at round {self.peak[1]}): the run is unlearning; summary.json's 'best' "
               f"keeps the peak")
        return _say(msg, quiet)


#: a main accuracy whose best evaluation (round 0 left out) is at most this much (absolute,
#: as a fraction) above chance by the run's half-way round is warned about (10 classes: 12%)
CHANCE_MARGIN = 0.02
#: the earliest round the learning-nothing warning may speak (a run shorter than this: its last)
CHANCE_MIN_ROUNDS = 3


def chance_level(metric: str, classes: Optional[int]) -> Optional[float]:
    """What ``metric`` scores by guessing (``1 / classes``) when it is a class accuracy the
    chance rule applies to, else None: losses and byte counts have no chance level, and a
    worst-decile or a spread (``*worst*``, ``*_std``) can sit at 0 in a run that learns."""
    if "acc" not in metric or "worst" in metric or metric.endswith("_std") or not classes or classes < 2:
        return None
    return 1.0 / classes


class ChanceWatch:
    """Warns once when the run's main accuracy has never been more than
    :data:`CHANCE_MARGIN` above chance (:func:`chance_level`) by its half-way round (round
    0, the untrained model, left out): a run that exits 0 having learned nothing. FedAvg on
    digits at ``lr = 50`` or ``1e-9`` sits at 8-10% for all its rounds and used to say
    nothing. Half the planned rounds, not the first few: methods that start slowly (a
    personalised method whose unsampled clients hold the initial model) are not flagged
    while they warm up."""

    def __init__(self, main: str, classes: Optional[int], rounds: int, margin: float = CHANCE_MARGIN):
        self.main, self.classes, self.margin = main, classes, margin
        self.chance = chance_level(main, classes)
        # a short run is judged at its end: at round 1 of 2 or 3 most methods are still at chance
        self.due = max(1, math.ceil(rounds / 2), min(rounds, CHANCE_MIN_ROUNDS))
        self.best: Optional[tuple[float, int]] = None  # (value, round): the best evaluation so far
        self.warned = False

    @property
    def at_chance(self) -> bool:
        """Whether every evaluation fed so far (round 0 left out) was within the margin of chance."""
        return self.chance is not None and self.best is not None and self.best[0] <= self.chance + self.margin

    def check(self, rec: dict[str, Any], quiet: bool = False) -> Optional[str]:
        """Feed one evaluated round's metrics; returns (and, unless ``quiet``, warns) the
        message the first time the rule holds at or after the half-way round, else None.
        ``quiet`` replays a resumed run's earlier rounds."""
        v, r = rec.get(self.main), int(rec.get("round", 0))
        if self.chance is None or r == 0 or not isinstance(v, (int, float)) or v != v:
            return None
        if self.best is None or float(v) > self.best[0]:
            self.best = (float(v), r)
        if self.warned or r < self.due or not self.at_chance:
            return None
        self.warned = True
        msg = (f"round {r}: {self.main} has never been above chance: its best is {100 * self.best[0]:.2f}% (round "
               f"{self.best[1]}), and guessing among {self.classes} classes scores {100 * self.chance:.2f}%: the "
               f"run is learning nothing (a learning rate far too high or too low? a codec that zeroes the "
               f"updates?)")
        return _say(msg, quiet)

    def summary(self) -> dict[str, Any]:
        """``{"learned_nothing": {...}}`` for summary.json when the run ended at chance, else {}."""
        if not (self.warned and self.at_chance) or self.best is None or self.chance is None:
            return {}
        return {"learned_nothing": {"metric": self.main, "best": self.best[0], "round": self.best[1],
                                    "chance": self.chance}}


def served_protocols(alg: Any) -> tuple[str, ...]:
    """The evaluation protocols ``alg`` (an Algorithm instance) can measure.

    ``global`` needs a server that holds a model; ``personal`` (and ``personal_joined``, the
    same over the clients that have taken part) a model per node, or the
    server's model evaluated on each client's split (stateless clients); ``node_global``
    and ``consensus`` a model per node (``personalized``)."""
    server_model = bool(alg.has_server and getattr(alg, "server_model", True))
    personal = bool(alg.personalized)
    out = []
    if server_model:
        out.append("global")
    if personal or server_model:
        out += ["personal", "personal_joined"]
    if personal:
        out += ["node_global", "consensus"]
    return tuple(out)


def check_experiment(exp: Experiment, alg: Optional[Any] = None) -> None:
    """Refuse, with one line, an experiment that cannot measure what it asks (see the module
    docstring). ``alg``: the experiment's algorithm instance (built here when None)."""
    from lowband.algorithms import ALGORITHMS

    if alg is None:
        cls = ALGORITHMS[exp.algorithm.name]
        alg = cls(cls.Hyperparams.model_validate(exp.algorithm.options()))
    _check_topology(exp, alg)
    _check_data(exp)
    _check_public_set(exp, alg)
    _check_image_only(exp, alg)
    if exp.eval.protocols:
        _check_protocols(alg, exp.eval.protocols, has_local_test=exp.data.split[2] > 0)
    _check_codec_state(exp, alg)
    aggregation_check(exp, alg)  # [aggregation] on an algorithm without the hook (lowband.aggregation.install)
    aggregation_install(exp, alg)  # the rule and [faults.byzantine] onto this algorithm object (refusing what they cannot do)


def _check_codec_state(exp: Experiment, alg: Any) -> None:
    """Refuse a stateful codec (``ef(...)``, ``powersgd(r)``) on a message kind whose tensors
    change shape or coordinates between rounds (``Algorithm.unaligned_kinds``): the sender's
    residual or warm start would belong to other coordinates (or crash on a new shape)."""
    from lowband.comm.codecs import is_stateful, parse_codec

    comm = exp.comm
    for kind, directions in sorted(getattr(alg, "unaligned_kinds", {}).items()):
        for direction in directions:
            if kind in comm.by_kind:
                key, spec = f"comm.by_kind.{kind}", comm.by_kind[kind]
            elif direction in comm.by_direction:
                key, spec = f"comm.by_direction.{direction}", comm.by_direction[direction]
            else:
                key, spec = "comm.codec", comm.codec
            try:
                stateful = is_stateful(parse_codec(spec))
            except ValueError:
                continue  # a bad spec is reported by the codec check with its own line
            if stateful:
                raise ConfigError(
                    f"{key}: {spec!r} keeps sender state (residual / warm start per tensor), but "
                    f"{alg.name}'s {kind!r} messages ({direction}) change shape or coordinates every round, "
                    f"so that state would be added to the wrong entries; use a stateless codec there "
                    f"(e.g. {_stateless_hint(spec)}) or set comm.by_kind.{kind} to one")


def _stateless_hint(spec: str) -> str:
    """The spec with ``ef(...)`` unwrapped and ``powersgd`` replaced: a stateless suggestion."""
    import re

    inner = re.fullmatch(r"\s*ef\((.*)\)\s*", spec)
    if inner:
        return inner.group(1)
    return "qsgd(4)" if "powersgd" in spec else "topk(0.01)"


def topology_kind(exp: Experiment, alg: Any) -> str:
    return exp.topology.kind or FAMILY_DEFAULT_KIND.get(alg.family, "star")


def _check_topology(exp: Experiment, alg: Any) -> None:
    t = exp.topology
    kind = topology_kind(exp, alg)
    name = alg.name
    if alg.family != "local":
        if alg.has_server and kind != "star":
            raise ConfigError(
                f"topology.kind: {name} is a server method (the server talks to the sampled clients) and "
                f"{kind!r} gives peer links it would ignore; use topology.kind = 'star' (or leave it out)")
        if not alg.has_server and kind not in PEER_KINDS:
            raise ConfigError(
                f"topology.kind: {name} exchanges with peers and {kind!r} has no peer links, so nothing would be "
                f"sent and every node would train alone; use topology.kind = "
                f"'{FAMILY_DEFAULT_KIND.get(alg.family, 'kregular')}' (or ring, complete, erdos_renyi; "
                f"or leave it out)")
    reads = set(TOPOLOGY_KEYS[kind])
    if kind == "star":
        reads = {"sampling"} | ({STAR_SAMPLING_KEYS[t.sampling]} - {None})
    for key in sorted(t.model_fields_set - {"kind"}):
        value = getattr(t, key)
        if key in reads or value == _schema_default(key):  # a resolved config (run folder) lists every key
            continue
        where = f"sampling = {t.sampling!r}" if (kind == "star" and key in TOPOLOGY_KEYS["star"]) \
            else f"topology.kind = {kind!r}"
        reads_s = ", ".join(sorted(reads)) or "no other key"
        raise ConfigError(f"topology.{key}: not read with {where} (it reads {reads_s}); drop it or change the kind")
    if kind == "contact_plan" and (t.per_round is None) == (t.plan_file is None):
        raise ConfigError(
            f"topology.per_round: {name} meets peers over a contact plan; set exactly one of topology.per_round "
            f"(contacts per node in each round, e.g. [3] or FOL's [29, 20, 20]) or topology.plan_file "
            f"(a CSV of round,a,b lines)")
    if kind == "contact_plan" and t.plan_file is not None:
        from pathlib import Path

        if not Path(t.plan_file).is_file():
            raise ConfigError(f"topology.plan_file: {t.plan_file} not found (expected a CSV of round,a,b lines)")


def _schema_default(key: str, section: str = "topology") -> Any:
    from lowband.config.schema import DataConfig, TopologyConfig

    model = TopologyConfig if section == "topology" else DataConfig
    return model.model_fields[key].get_default(call_default_factory=True)


#: the [data] keys each partition reads (lowband.data.federation.build_federation)
PARTITION_KEYS: dict[str, tuple[str, ...]] = {
    "iid": (), "dirichlet": ("alpha", "min_size"), "shards": ("classes_per_client",),
    "ntk_fl": ("alpha", "samples_per_client"), "iid_replace": ("samples_per_client",), "natural": (), "given": (),
    "index_map": (),
}


def _check_data(exp: Experiment) -> None:
    d = exp.data
    reads = PARTITION_KEYS.get(d.partition, ())
    for key in sorted({"alpha", "min_size", "classes_per_client", "samples_per_client"} & d.model_fields_set):
        if key not in reads and getattr(d, key) != _schema_default(key, "data"):
            by = [p for p, keys in PARTITION_KEYS.items() if key in keys]
            raise ConfigError(f"data.{key}: not read with partition = {d.partition!r} (only by "
                              f"{' and '.join(repr(p) for p in by)}); drop it or change data.partition")
    if "public_source" in d.model_fields_set and d.public_size == 0 \
            and d.public_source != _schema_default("public_source", "data"):
        raise ConfigError("data.public_source: there is no public set (data.public_size = 0); set "
                          "data.public_size or drop public_source")


#: methods that synthesise or transform images: DENSE and Co-Boosting train a generator of
#: (C, H, W) inputs (with crops and flips) for data-free distillation
IMAGE_ONLY = {"dense": "trains an image generator", "coboost": "trains an image generator"}


def _check_image_only(exp: Experiment, alg: Any) -> None:
    """Refuse an image-only method or ``data.augment`` on a token dataset (text)."""
    from lowband.data.sources import TEXT_DATASETS

    if exp.data.dataset not in TEXT_DATASETS:
        return
    if alg.name in IMAGE_ONLY:
        raise ConfigError(f"algorithm.name: {alg.name} {IMAGE_ONLY[alg.name]} and {exp.data.dataset} is text "
                          f"(token ids); use an image dataset, or a method that exchanges weights or logits")
    if exp.data.augment is not None:
        raise ConfigError(f"data.augment: {exp.data.augment!r} transforms images and {exp.data.dataset} is text "
                          f"(token ids); drop data.augment")


def _check_public_set(exp: Experiment, alg: Any) -> None:
    if getattr(alg, "needs_public", False) and exp.data.public_size <= 0:
        raise ConfigError(
            f"data.public_size: {alg.name} exchanges predictions on a public reference set and data.public_size "
            f"is 0; set it, e.g. data.public_size = 500 (the samples are taken out of the training data)")


def _check_protocols(alg: Any, requested: Sequence[str], has_local_test: bool) -> None:
    served = served_protocols(alg)
    for p in requested:
        if p not in served:
            raise ConfigError(
                f"eval.protocols: {alg.name} cannot measure {p!r} ({_why_not(alg, p)}); it serves "
                f"{', '.join(served)}")
    if "personal" in requested and not has_local_test:
        raise ConfigError(
            "eval.protocols: 'personal' evaluates on the clients' local test splits and data.split gives them "
            "none; set e.g. data.split = [0.75, 0.0, 0.25], or drop 'personal'")


def _why_not(alg: Any, protocol: str) -> str:
    if protocol == "global":
        return "it has no server" if not alg.has_server else "its server holds no model"
    return "its clients keep no model of their own"


def resolve_protocols(alg: Any, fed: Any, requested: Optional[Sequence[str]]) -> list[str]:
    """The protocols a run evaluates: the config's (checked), else the algorithm's defaults
    that the data allows, else the first of global, node_global, consensus it serves (a
    method evaluated on local test splits, run without them). Never empty."""
    has_local_test = any(int(nd.n_test) > 0 for nd in fed.nodes)
    served = served_protocols(alg)
    if requested:
        _check_protocols(alg, requested, has_local_test)
        return list(requested)
    protos = [p for p in alg.default_protocols if p in served and (p != "personal" or has_local_test)]
    if not protos:
        protos = [p for p in ("global", "node_global", "consensus") if p in served][:1]
    if not protos:
        raise ConfigError(f"eval.protocols: {alg.name} has nothing to evaluate without local test splits; set "
                          f"e.g. data.split = [0.75, 0.0, 0.25]")
    return protos


# --------------------------------------------------------------------------- traffic warnings


def codec_terms(spec: str) -> list[str]:
    """The codec names of a spec string, e.g. ``topk(0.01)+fp16`` -> ``['topk', 'fp16']``;
    a wrapper's codec follows it: ``ef(topk(0.01))`` -> ``['ef', 'topk']``."""
    from lowband.comm.codecs import SPEC_MAKERS, split_top

    out: list[str] = []
    for t in split_top(spec, "+"):
        name, _, arg = t.strip().partition("(")
        out.append(name.strip())
        if name.strip() in SPEC_MAKERS and arg.endswith(")"):
            out.extend(codec_terms(arg[:-1]))
    return out


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


class TrafficWatch:
    """Reads the ledger after the fact and warns once per run (see the module docstring).

    ``model_bytes``: the encoded size of the fp32 message of the (largest) model of the
    federation, the size a weight-exchanging method would send."""

    def __init__(self, network: Any, model_bytes: int, algorithm: str):
        self.network = network
        self.model_bytes = int(model_bytes)
        self.algorithm = algorithm
        self.checked = 0  # ledger rows already looked at
        self.warned: set[str] = set()
        self.seen: set[tuple[str, str]] = set()

    def check(self) -> None:
        """Look at the ledger rows added since the last call."""
        ledger = self.network.ledger
        n = len(ledger)
        if n <= self.checked:
            return
        import numpy as np

        from lowband.comm.message import DIRECTIONS

        cols = ledger.columns()
        kinds = ledger.kinds
        sl = slice(self.checked, n)
        self.checked = n
        dirs, kcodes, enc = cols["direction"][sl], cols["kind"][sl], cols["encoded"][sl]
        for d, k in set(zip(dirs.tolist(), kcodes.tolist())):
            pair = (DIRECTIONS[d], kinds[k])
            if pair not in self.seen:
                self.seen.add(pair)
                self._lossy(*pair)
        if "oversize" not in self.warned and self.model_bytes > 0 and len(enc):
            i = int(np.argmax(enc))
            big = int(enc[i])
            if big > OVERSIZE_FACTOR * self.model_bytes:
                self.warned.add("oversize")
                kind = kinds[int(kcodes[i])]
                warnings.warn(
                    f"{self.algorithm}: a {kind!r} message is {fmt_bytes(big)}, {big / self.model_bytes:,.1f}x the "
                    f"fp32 model ({fmt_bytes(self.model_bytes)}) that a weight-exchanging method would send "
                    f"instead: on this model the exchange costs more than the weights it stands for",
                    LowbandWarning, stacklevel=2)

    def _lossy(self, direction: str, kind: str) -> None:
        if kind not in WEIGHT_KINDS or "lossy" in self.warned:
            return
        spec = self.network.codecs.spec_for(kind, direction)
        lossy = weights_lossy_term(spec)
        if lossy:
            self.warned.add("lossy")
            verb = "sparsifies" if lossy in SPARSIFIERS else "compresses"
            warnings.warn(
                f"{self.algorithm}: codec {spec!r} {verb} whole weights ({kind!r} messages, {direction}); "
                f"{lossy} {WEIGHT_LOSSY[lossy]} and the model barely learns. Compress deltas instead (FedAvg-like "
                f"methods: algorithm.upload = \"delta\" with comm.by_kind.delta = \"{spec}\"), or quantise "
                f"weights (fp16, int8)",
                LowbandWarning, stacklevel=2)


def weights_lossy_term(spec: str) -> Optional[str]:
    """The codec of ``spec`` that wrecks a whole-weights message (:data:`WEIGHT_LOSSY`), or
    None: the decision behind :class:`TrafficWatch`'s whole-weights warning. Under ``ef21``
    the receiver gets its dense estimate g + c, never the compressed c: no warning."""
    terms = codec_terms(spec)
    if not terms or terms[0] == "ef21":
        return None
    return next((t for t in terms if t in WEIGHT_LOSSY), None)


def model_message_bytes(params_by_arch: Sequence[dict[str, Any]]) -> int:
    """Encoded size of the largest fp32 ``weights`` message among the given models."""
    from lowband.comm.codecs import parse_codec
    from lowband.comm.message import Message
    from lowband.comm.wire import encode_message
    from lowband.seeding import torch_gen

    fp32 = parse_codec("fp32")
    return max((len(encode_message(Message("weights", dict(p)), fp32, torch_gen(0, "size"))) for p in params_by_arch),
               default=0)
