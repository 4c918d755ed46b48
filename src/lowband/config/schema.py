"""The experiment schema: pydantic models of every config section, and :class:`ConfigError`.

This module is the bottom of lowband's import graph: it imports nothing else from lowband,
so any module (the engine, the data layer, the front doors) may use the models without a
circle. It checks what a config says on its own: types, ranges, keys that go together.
What needs another part of lowband (algorithm, model, dataset and codec names, link
presets, device names, which way a metric improves) is checked by the resolver,
:mod:`lowband.config.resolve`, which every front door (CLI, Python API, Simulation) calls:
it hands those facts to the validators below through pydantic's validation ``context``
(:func:`parse_experiment`), so the messages and their order are those of one validation.

An unknown key, a wrong type or a value out of range raises :class:`ConfigError` whose
message is a single line naming the key and what is allowed (the CLI prints it and exits
with 2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Callable, Container, Literal, Mapping, Optional, TypedDict, Union

from pydantic import (BaseModel, ConfigDict, Field, Strict, ValidationError, ValidationInfo, field_validator,
                      model_validator)

import tomli_w


class Facts(TypedDict, total=False):
    """What the schema's validators need from the rest of lowband, supplied by the resolver
    (:func:`lowband.config.resolve.facts`) as pydantic's validation ``context``. A check
    whose fact is absent is skipped (a model built directly, outside the front doors)."""

    #: link preset names (lowband.comm.links.PRESETS)
    link_presets: Container[str]
    #: raises ValueError naming what is inconsistent in a [links] section (lowband.comm.links.configured_profiles)
    link_profiles: Callable[[Any], Any]
    #: the accepted device name, or ValueError (lowband.device.check_spec)
    device_spec: Callable[[str], str]
    #: whether a larger value of a metric is better (lowband.metricdir.higher_is_better)
    higher_is_better: Callable[[Optional[str]], bool]
    #: robust rule name -> its class, whose ``Params`` model checks the rule's keys (lowband.aggregation.rules.RULES)
    aggregation_rules: Mapping[str, Any]
    #: device class names (lowband.devices.compute.CLASSES)
    device_classes: Container[str]


def _fact(info: ValidationInfo, name: str) -> Any:
    ctx = info.context
    return ctx.get(name) if isinstance(ctx, dict) else None


# -- [faults.byzantine] (lowband.attacks) and [aggregation] (lowband.aggregation) ------------------
#: kind -> the parameters it reads
READS: dict[str, tuple[str, ...]] = {
    "sign_flip": ("scale", "on"), "scaling": ("scale", "on"), "gaussian": ("sigma",), "label_flip": (),
    "alie": ("z",), "ipm": ("epsilon",), "model_replacement": ("gamma", "target", "poison_fraction"),
}
DEFAULT_SCALE = {"sign_flip": 1.0, "scaling": 20.0}


class ByzantineConfig(BaseModel):
    """Byzantine attackers (a fault: seeded, resumable, acting through the same messages)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["sign_flip", "scaling", "gaussian", "label_flip", "alie", "ipm", "model_replacement"]
    nodes: Optional[list[int]] = Field(None, description="the attacking nodes")
    fraction: Optional[float] = Field(None, gt=0, lt=1, description="fraction of nodes attacking, drawn once "
                                                                       "from (seed, 'byzantine')")
    scale: Optional[float] = Field(None, description="sign_flip: -scale u (1); scaling: scale u (20)")
    on: Literal["update", "message"] = Field("update", description="sign_flip / scaling: act on the update u "
                                                                   "(message minus its reference) or on the whole "
                                                                   "message (a model for weights uploads)")
    sigma: float = Field(200.0, gt=0, description="gaussian: the noise's standard deviation (Fang et al.: 200)")
    z: Optional[float] = Field(None, description="alie: z (unset: Baruch et al.'s z_max from n and f)")
    epsilon: float = Field(0.1, description="ipm: epsilon (Xie et al.: 0.1)")
    gamma: Optional[float] = Field(None, gt=0, description="model_replacement: boost (unset: n / eta, n the "
                                                           "aggregation's inputs)")
    target: int = Field(0, ge=0, description="model_replacement: the backdoor's target class")
    poison_fraction: float = Field(0.5, gt=0, le=1, description="model_replacement: triggered copies of this "
                                                                "fraction of the attacker's data")

    @model_validator(mode="after")
    def _check(self) -> "ByzantineConfig":
        if (self.nodes is None) == (self.fraction is None):
            raise ValueError("set exactly one of nodes (a list of node ids) and fraction (e.g. 0.125)")
        if self.nodes is not None and (not self.nodes or min(self.nodes) < 0 or len(set(self.nodes)) != len(self.nodes)):
            raise ValueError(f"nodes must be distinct node ids >= 0, got {self.nodes}")
        reads = READS[self.kind]
        for key in ("scale", "z", "gamma"):
            if getattr(self, key) is not None and key not in reads:
                raise ValueError(f"{key} is not read by kind {self.kind!r} (it reads: {', '.join(reads) or 'nothing'})")
        for key, default in (("sigma", 200.0), ("epsilon", 0.1), ("target", 0), ("poison_fraction", 0.5),
                             ("on", "update")):
            if getattr(self, key) != default and key not in reads:
                raise ValueError(f"{key} is not read by kind {self.kind!r} (it reads: {', '.join(reads) or 'nothing'})")
        return self

    @property
    def coefficient(self) -> float:
        return self.scale if self.scale is not None else DEFAULT_SCALE.get(self.kind, 1.0)


class AggregationConfig(BaseModel):
    """The ``[aggregation]`` section: ``rule`` plus that rule's parameters."""

    model_config = ConfigDict(extra="allow", frozen=True)

    rule: Optional[str] = None

    @model_validator(mode="after")
    def _rule_and_params(self, info: ValidationInfo) -> "AggregationConfig":
        RULES = _fact(info, "aggregation_rules")  # name -> rule class (lowband.aggregation.rules), from the resolver
        params = dict(self.model_extra or {})
        if self.rule is None:
            if params:
                names = ", ".join(sorted(RULES)) if RULES is not None else "a rule's name"
                raise ValueError(f"{', '.join(sorted(params))} set without a rule; add rule = one of {names}")
            return self
        if RULES is None:
            return self
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}; available: {', '.join(sorted(RULES))}")
        try:
            RULES[self.rule].Params(**params)
        except ValidationError as e:
            err = e.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "?"
            fields = ", ".join(RULES[self.rule].Params.model_fields) or "none"
            raise ValueError(f"{key}: {err['msg']} (rule {self.rule!r} reads: {fields})") from None
        return self

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})



class ConfigError(ValueError):
    """A configuration problem, described in one line (key, what is wrong, what is allowed)."""


#: a whole number as written in the config: ``true`` or ``1e3`` is refused, not read as 1 or 1000
#: (TOML writes integers without a point or exponent; a float here is a typo more often than not)
Int = Annotated[int, Strict()]
#: ``true`` or ``false`` only (not 1, "yes")
Bool = Annotated[bool, Strict()]
#: a number (an integer is one), not ``true``
Float = Annotated[float, Strict()]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


PROTOCOLS = ("global", "personal", "personal_joined", "node_global", "consensus")


class DataConfig(_Strict):
    """Where the data comes from and how it is split among nodes."""

    dataset: str = "digits"
    #: dataset = "npz": the user's .npz file (x, y; optional client, x_test, y_test), see lowband.data.userdata
    path: Optional[str] = None
    data_dir: Optional[str] = None
    download: Bool = False
    options: dict[str, Any] = Field(default_factory=dict)
    num_clients: Int = Field(10, ge=1, le=100_000)
    #: "given": the client ids of the user's data (dataset = "npz" with a client array);
    #: "index_map": the first num_clients clients of the file data.index_map (lowband.data.indexmap)
    #: "iid_replace": samples_per_client IID samples per client, the pool dealt out in passes (clients may share)
    partition: Literal["iid", "dirichlet", "shards", "ntk_fl", "iid_replace", "natural", "given", "index_map"] = "iid"
    #: partition = "index_map": a JSON object client id -> indices into the training set (.json, .json.gz)
    index_map: Optional[str] = None
    #: the index map's sha256, resolved from the file when not given (a given one must match the file)
    index_map_sha256: Optional[str] = Field(None, pattern=r"^[0-9a-f]{64}$")
    alpha: Optional[Float] = Field(None, gt=0)
    min_size: Int = Field(10, ge=0)
    classes_per_client: Int = Field(2, ge=1)
    samples_per_client: Int = Field(200, ge=1)
    split: tuple[Float, Float, Float] = (1.0, 0.0, 0.0)
    public_size: Int = Field(0, ge=0)
    augment: Optional[Literal["fol"]] = None
    #: where the public reference set is drawn from (see lowband.data.federation)
    public_source: Literal["train", "holdout", "mismatched"] = "train"
    #: seed of the partition, splits, public set and augmentation (None: the experiment's seed): vary the
    #: experiment's seed (init, graphs, sampling) over one fixed partition
    seed: Optional[Int] = Field(None, ge=0)

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(x < 0 for x in v) or abs(sum(v) - 1.0) > 1e-6 or v[0] <= 0:
            raise ValueError("must be [train, val, test] fractions >= 0 summing to 1 with train > 0")
        return v

    @model_validator(mode="after")
    def _alpha_needed(self) -> "DataConfig":
        if self.partition == "dirichlet" and self.alpha is None:
            raise ValueError("alpha: partition 'dirichlet' needs alpha > 0 (e.g. alpha = 0.3)")
        if self.partition == "index_map" and not self.index_map:
            raise ValueError("index_map: partition 'index_map' needs data.index_map, the path of a JSON object "
                             "client id -> training indices")
        if self.partition != "index_map" and (self.index_map is not None or self.index_map_sha256 is not None):
            key = "index_map" if self.index_map is not None else "index_map_sha256"
            raise ValueError(f"{key}: read only with partition = 'index_map'; drop it or set data.partition = "
                             f"'index_map'")
        return self


class ModelConfig(BaseModel):
    """Model name from the registry; every other key is passed to the model builder."""

    model_config = ConfigDict(extra="allow")
    name: str = "mlp"
    #: mixed federation: client i gets architecture ``mix[i % len(mix)]`` (a list as long as
    #: the clients assigns one each); ``name`` stays the server's. Only for algorithms
    #: that exchange predictions, not weights (kta, fedmd; local).
    mix: Optional[list[str]] = Field(None, min_length=1)

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class AlgorithmConfig(BaseModel):
    """Algorithm name; every other key is a hyperparameter validated by the algorithm."""

    model_config = ConfigDict(extra="allow")
    name: str = "fedavg"

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class TopologyConfig(_Strict):
    """Who may talk to whom each round (see lowband.topology)."""

    kind: Optional[Literal["star", "kregular", "ring", "complete", "erdos_renyi", "contact_plan"]] = None
    sampling: Literal["all", "fraction", "count", "list", "poisson"] = "fraction"
    fraction: Float = Field(0.1, gt=0, le=1)
    count: Optional[Int] = Field(None, ge=1)
    schedule: Optional[list[list[Int]]] = None
    k: Int = Field(5, ge=1)
    p: Float = Field(0.1, gt=0, le=1)
    time_varying: Bool = True
    per_round: Optional[list[Int]] = None
    plan_file: Optional[str] = None


#: the [topology] keys each kind reads (``lowband list topologies`` shows them with the
#: defaults a run uses; a key set to a non-default value for a kind that does not read it
#: is refused, see lowband.engine.checks)
TOPOLOGY_KEYS: dict[str, tuple[str, ...]] = {
    "star": ("sampling", "fraction", "count", "schedule"),
    "kregular": ("k", "time_varying"),
    "ring": ("k",),
    "complete": (),
    "erdos_renyi": ("p", "time_varying"),
    "contact_plan": ("per_round", "plan_file"),
}
#: the star key each sampling mode reads
STAR_SAMPLING_KEYS: dict[str, Optional[str]] = {"all": None, "fraction": "fraction", "count": "count",
                                                "list": "schedule", "poisson": "fraction"}
#: a ring's ``k`` when the config leaves it out: the ring builder's default
#: (``lowband.topology.TOPOLOGIES["ring"]``, checked by tests/test_config_layers.py), not
#: the field default 5, which is k-regular's
RING_DEFAULT_K = 1


class CommConfig(_Strict):
    """Codecs applied on the links (see lowband.comm.codecs) and what receivers do with
    invalid messages (see lowband.comm.validate)."""

    codec: str = "fp32"
    by_kind: dict[str, str] = Field(default_factory=dict)
    by_direction: dict[str, str] = Field(default_factory=dict)
    #: a message with non-finite values, or that does not fit the receiver's model:
    #: "reject" (not delivered, counted as rejected/<reason>) or "abort" (the run stops)
    on_invalid: Literal["reject", "abort"] = "reject"
    #: reject messages whose norm exceeds norm_factor x the median of the same-kind
    #: messages in the receiver's inbox (>= 3 of them); 0: off. The default (100) is far
    #: above benign spread (no rejection in any algorithm's learning-tier run even at 10)
    #: and far below an exploding client's (lr = 1e6: ~1e20 x the median)
    norm_factor: Float = Field(100.0, allow_inf_nan=False)
    #: bind every message to the (round, step) it was sent in (a stamp in its metadata, encoded and
    #: counted); a receiver refuses one from another round or step as rejected/stale (a replay or a
    #: re-ordering); off by default: the stamp costs a few bytes a message (lowband.comm.validate)
    freshness: Bool = False

    @field_validator("norm_factor")
    @classmethod
    def _norm_factor(cls, v: float) -> float:
        if v != 0 and v <= 1:
            raise ValueError(f"must be 0 (off) or a number > 1, got {v}")
        return v

    @field_validator("by_direction")
    @classmethod
    def _directions(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if k not in ("up", "down", "peer")]
        if bad:
            raise ValueError(f"unknown direction {bad[0]!r}; allowed: up, down, peer")
        return v


class FaultsConfig(_Strict):
    """Simulated client dropout and stragglers (see lowband.faults); off by default."""

    #: below 1: at 1 every node is offline every round and nothing is ever trained or sent
    dropout: Float = Field(0.0, ge=0, lt=1, description="probability that a node is offline in a round")
    #: explicit [round, node] pairs (rounds 1-based) of nodes offline in that round
    dropout_schedule: list[tuple[Int, Int]] = Field(default_factory=list)
    #: below 1: at 1 every reply may be late and dropped
    straggler: Float = Field(0.0, ge=0, lt=1, description="probability that a node is slow in a round")
    slowdown: Float = Field(3.0, gt=1, allow_inf_nan=False, description="a slow reply takes 1..slowdown time units")
    deadline: Optional[Float] = Field(None, ge=1, allow_inf_nan=False, description="replies later than this are dropped")
    byzantine: Optional[ByzantineConfig] = None  # [faults.byzantine]: attackers (lowband.attacks)

    @model_validator(mode="after")
    def _straggler_needs_deadline(self) -> "FaultsConfig":
        if (self.straggler > 0) != (self.deadline is not None):
            raise ValueError("straggler and deadline go together (stragglers matter only when late replies are "
                             "dropped): set both, e.g. straggler = 0.2 and deadline = 2.0")
        if self.deadline is not None and self.deadline >= self.slowdown:
            raise ValueError(f"deadline {self.deadline:g} >= slowdown {self.slowdown:g}: no reply would ever be "
                             f"late; choose 1 <= deadline < slowdown")
        return self


class LinkDirectionConfig(_Strict):
    """Overrides of one direction of the ``[links]`` preset (see lowband.comm.links); unset keys keep the preset's."""

    bps: Optional[Float] = Field(None, gt=0, description="bit/s on the air")
    latency_s: Optional[Float] = Field(None, ge=0)
    loss: Optional[Float] = Field(None, ge=0, lt=1, description="frame loss probability (re-sent until it arrives)")
    frame_payload: Optional[Int] = Field(None, ge=1)
    frame_overhead: Optional[Int] = Field(None, ge=0)
    frame_time_s: Optional[Float] = Field(None, ge=0)
    duty_cycle: Optional[Float] = Field(None, gt=0, le=1)
    power_w: Optional[Float] = Field(None, ge=0, description="the node's radio power (W) on this direction: "
                                     "transmit (up) or receive (down); adds energy/j")


class LinksConfig(_Strict):
    """Link models that turn the ledger's bytes into simulated time (lowband.comm.links); off when absent."""

    preset: str
    up: LinkDirectionConfig = Field(default_factory=LinkDirectionConfig)
    down: LinkDirectionConfig = Field(default_factory=LinkDirectionConfig)
    contact_period_s: Optional[Float] = Field(None, gt=0)
    contact_duration_s: Optional[Float] = Field(None, gt=0)
    contact_offset_s: Optional[Float] = Field(None, ge=0)
    #: per-node presets: preset name -> node ids (the other nodes use ``preset`` with the overrides)
    nodes: dict[str, list[Int]] = Field(default_factory=dict)
    #: local compute: compute_s + 3 x forward FLOPs x samples / device_flops per round (0: no FLOP term)
    device_flops: Float = Field(1e9, ge=0)
    compute_s: Float = Field(0.0, ge=0)
    #: a reply (up or peer) arriving later than this many seconds after the round start is dropped
    deadline_s: Optional[Float] = Field(None, gt=0)
    #: transmissions per lost-prone frame: their expectation 1 / (1 - loss), or seeded geometric draws
    retransmissions: Literal["expected", "sampled"] = "expected"

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str, info: ValidationInfo) -> str:
        PRESETS = _fact(info, "link_presets")
        if PRESETS is not None and v not in PRESETS:
            raise ValueError(f"unknown link preset {v!r}; available: {', '.join(PRESETS)} (lowband list links)")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: dict[str, list[int]], info: ValidationInfo) -> dict[str, list[int]]:
        PRESETS = _fact(info, "link_presets")
        seen: set[int] = set()
        for name, ids in v.items():
            if PRESETS is not None and name not in PRESETS:
                raise ValueError(f"unknown link preset {name!r}; available: {', '.join(PRESETS)}")
            for i in ids:
                if i < 0:
                    raise ValueError(f"{name}: node ids start at 0, got {i}")
                if i in seen:
                    raise ValueError(f"node {i} is given two presets; list each node once")
                seen.add(i)
        return v

    @model_validator(mode="after")
    def _profiles(self, info: ValidationInfo) -> "LinksConfig":
        configured_profiles = _fact(info, "link_profiles")
        if configured_profiles is not None:
            configured_profiles(self)  # raises ValueError naming what is inconsistent (e.g. the contact window)
        return self


#: keys of [devices.availability] and the kinds that read them
AVAILABILITY_READS: dict[str, tuple[str, ...]] = {
    "on_fraction": ("diurnal",), "phases": ("diurnal",), "period_s": ("diurnal", "trace"),
    "mean_on_s": ("churn",), "mean_off_s": ("churn",), "path": ("trace",),
}


class AvailabilityConfig(_Strict):
    """When each device is reachable (lowband.devices): always, a diurnal cycle, random churn, or a trace file."""

    kind: Literal["always", "diurnal", "churn", "trace"] = "always"
    #: diurnal: the fraction of each period a device is on
    on_fraction: Float = Field(0.5, gt=0, le=1)
    #: diurnal: the cycle (default a day, 86400 s); trace: the windows repeat with this period (unset: no repeat)
    period_s: Optional[Float] = Field(None, gt=0)
    #: diurnal: "uniform" (each device its own phase, its time zone) or "equal" (one time zone)
    phases: Literal["uniform", "equal"] = "uniform"
    mean_on_s: Optional[Float] = Field(None, gt=0, description="churn: mean on period (exponential)")
    mean_off_s: Optional[Float] = Field(None, gt=0, description="churn: mean off period (exponential)")
    path: Optional[str] = Field(None, description="trace: a CSV node,start_s,end_s of on-windows")

    @model_validator(mode="after")
    def _keys_of_the_kind(self) -> "AvailabilityConfig":
        for key in sorted(self.model_fields_set):
            readers = AVAILABILITY_READS.get(key)
            if readers is not None and self.kind not in readers:
                raise ValueError(f"{key} is read only with kind = {' / '.join(readers)}, not {self.kind!r}; drop it "
                                 f"or change kind")
        if self.kind == "churn" and (self.mean_on_s is None or self.mean_off_s is None):
            raise ValueError("kind = 'churn' needs mean_on_s and mean_off_s (the mean on and off periods, seconds)")
        if self.kind == "trace" and not self.path:
            raise ValueError("kind = 'trace' needs path (a CSV file with header node,start_s,end_s)")
        return self


class DevicesConfig(_Strict):
    """Per-device compute and availability (lowband.devices, docs/devices.md); needs [links] (the clock).

    Compute: one of ``mix`` (device classes with shares, ``lowband list devices``), ``flops``
    (every device equal) or ``trace`` (a CSV node,flops[,joules_per_flop][,class]); none of
    them: every device computes at ``links.device_flops``, with no energy figure."""

    mix: dict[str, Float] = Field(default_factory=dict)
    flops: Optional[Float] = Field(None, gt=0, description="every device's training rate (FLOP/s)")
    joules_per_flop: Optional[Float] = Field(None, ge=0, description="with flops: every device's energy per FLOP")
    trace: Optional[str] = None
    #: lognormal sigma of each device's rate around its class's figure (mix only; 0: the figure itself)
    spread: Float = Field(0.0, ge=0, le=3)
    #: multiplies every class's rate (mix only): the fraction of the figures training reaches
    efficiency: Float = Field(1.0, gt=0, le=1)
    availability: AvailabilityConfig = Field(default_factory=AvailabilityConfig)

    @field_validator("mix")
    @classmethod
    def _mix(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        classes = _fact(info, "device_classes")
        for name, share in v.items():
            if classes is not None and name not in classes:
                raise ValueError(f"unknown device class {name!r}; available: {', '.join(classes)} (lowband list devices)")
            if share < 0:
                raise ValueError(f"{name}: a share must be >= 0, got {share}")
        if v and sum(v.values()) <= 0:
            raise ValueError("the shares sum to 0; give at least one class a share > 0")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "DevicesConfig":
        given = [k for k in ("mix", "flops", "trace") if k in self.model_fields_set and getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} both set: devices come from one of mix, flops or trace")
        if self.joules_per_flop is not None and self.flops is None:
            raise ValueError("joules_per_flop goes with flops (a mix takes each class's figure, a trace its column)")
        for key in ("spread", "efficiency"):
            if key in self.model_fields_set and not self.mix:
                raise ValueError(f"{key} applies to a mix of device classes only; set mix or drop {key}")
        return self


class EvalConfig(_Strict):
    """Which evaluation protocols run, how often, and the target for rounds/bytes-to-target."""

    protocols: Optional[list[Literal["global", "personal", "personal_joined", "node_global", "consensus"]]] = None
    every: Int = Field(1, ge=1)
    batch_size: Int = Field(500, ge=1)
    #: score `personal` and `node_global` on a fixed sample of this many nodes, drawn once
    #: from the run's seed (None: every node); cuts their cost in proportion
    nodes: Optional[Int] = Field(None, ge=1)
    #: rounds/bytes-to-target threshold on ``main``: an accuracy as a fraction (0.85, at
    #: most 1), a loss or spread as its value (reached when at or below it)
    target: Optional[Float] = Field(None, gt=0)
    main: Optional[str] = None
    at_round0: Bool = True

    @model_validator(mode="after")
    def _target_is_a_fraction(self, info: ValidationInfo) -> "EvalConfig":
        # every algorithm's default main metric is an accuracy; only a loss or spread named
        # in ``main`` may have a target above 1
        higher_is_better = _fact(info, "higher_is_better")
        if self.target is not None and self.target > 1 and higher_is_better is not None \
                and higher_is_better(self.main):
            raise ValueError(f"target: {self.target:g} is not a fraction; the main metric "
                             f"({self.main or 'the algorithm default'}) is an accuracy in [0, 1], write e.g. "
                             f"{min(self.target / 100, 1):g} for {self.target:g}% (a target above 1 is for a loss "
                             f"named in eval.main)")
        return self

    @field_validator("protocols")
    @classmethod
    def _once_each(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None:
            if not v:
                raise ValueError("empty list; leave eval.protocols out for the algorithm's defaults, or name "
                                 "at least one of global, personal, node_global, consensus")
            dup = [p for i, p in enumerate(v) if p in v[:i]]
            if dup:
                raise ValueError(f"{dup[0]!r} listed twice; name each protocol once")
        return v


class EngineConfig(_Strict):
    """``[engine]``: how the round is computed (docs/engine.md): where work runs, never what
    it computes, beyond float rounding."""

    #: local SGD of many nodes as one vectorised cohort (lowband.engine.cohort): "auto" where
    #: measured to pay (Linear-layer models), "on" wherever supported, "off" never
    vectorize: Literal["auto", "on", "off"] = "auto"
    #: worker processes that run a step's calls in parallel: "auto" (one per core when the
    #: machine has several and the federation is big enough to pay, else 1), or a count
    #: (1: serially in this process). Serial executor only (Ray has ray_workers).
    workers: Union[Literal["auto"], Int] = "auto"
    #: how many times a run that lost a machine (a Ray node, an actor) continues by itself
    #: from its last checkpoint on the machines left (lowband.engine.retry); 0: it stops with
    #: one line and ``--resume`` continues it
    retries: Int = Field(0, ge=0, le=100)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, v: Any) -> Any:
        if v != "auto" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"must be \"auto\" or a worker count >= 1 (1: serial), got {v!r}")
        return v


class LogConfig(_Strict):
    """Optional extra outputs of a run (they change no number)."""

    #: write the metrics of every evaluated round to RUN/tb/ as TensorBoard scalars
    #: (extra lowband[tensorboard]; also ``lowband run --tensorboard``)
    tensorboard: Bool = False


class DPConfig(BaseModel):
    """``[dp]``: differential privacy (docs/privacy.md). Refusals that need the algorithm,
    the codecs or the sampling are :func:`lowband.privacy.config.check_privacy`'s."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mechanism: Literal["none", "central", "local", "distributed"] = Field(
        "none", description="where the noise is added: central (DP-FedAvg at the server), local (clip+gauss on "
        "every sender before the codec), distributed (Skellam inside secure aggregation)")
    noise_multiplier: float = Field(1.0, gt=0, description="z: noise std over the clip norm")
    clip: Optional[float] = Field(None, gt=0, description="S: L2 clip of each update or message (None with "
                                  "adaptive_clip: start at 0.1)")
    adaptive_clip: bool = Field(False, description="clip at a quantile of the update norms (Andrew et al. 2021; "
                                "central only)")
    target_quantile: float = Field(0.5, gt=0, lt=1, description="gamma of adaptive clipping")
    clip_learning_rate: float = Field(0.2, gt=0, description="eta_C of adaptive clipping")
    bit_noise: Optional[float] = Field(None, gt=0, description="sigma_b of adaptive clipping (None: cohort / 20)")
    delta: float = Field(1e-5, gt=0, lt=1, description="delta at which epsilon is reported")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="dp-accounting's RDP or PLD accountant")
    target_epsilon: Optional[float] = Field(None, gt=0, description="refuse a run whose schedule exceeds it")
    bits: int = Field(16, ge=2, le=62, description="bits per coordinate of distributed DP's modular sum")

    @model_validator(mode="after")
    def _consistent(self) -> "DPConfig":
        if self.mechanism != "none" and self.clip is None and not self.adaptive_clip:
            raise ValueError("dp.clip must be set (or dp.adaptive_clip = true with dp.mechanism = \"central\")")
        if self.adaptive_clip and self.mechanism != "central":
            raise ValueError(f"dp.adaptive_clip is read only with dp.mechanism = \"central\", not {self.mechanism!r}")
        if self.target_epsilon is not None and self.mechanism == "none":
            raise ValueError("dp.target_epsilon needs a dp.mechanism (\"central\", \"local\" or \"distributed\"): "
                             "without one nothing spends epsilon")
        return self


class SecAggConfig(BaseModel):
    """``[secagg]``: SecAgg+ secure aggregation (docs/privacy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = False
    degree: Optional[int] = Field(None, ge=2, description="neighbours per client (even); None: all others")
    threshold: Optional[int] = Field(None, ge=1, description="Shamir shares needed; None: degree // 2 + 1")
    modulus_bits: int = Field(32, ge=8, le=62, description="the sum is taken mod 2**modulus_bits")
    clip_range: float = Field(8.0, gt=0, description="coordinates are clipped to [-clip_range, clip_range] "
                              "before quantisation")
    levels_bits: Optional[int] = Field(None, ge=2, description="quantisation levels 2**levels_bits; None: "
                                       "the most the modulus leaves room for")

    @field_validator("degree")
    @classmethod
    def _even(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v % 2:
            raise ValueError(f"must be even (a k-regular communication graph), got {v}")
        return v


class Experiment(_Strict):
    """A whole experiment: validated, then handed to :func:`lowband.engine.run`."""

    name: str = "experiment"
    seed: Int = Field(0, ge=0)
    rounds: Int = Field(10, ge=0, le=1_000_000)
    out_dir: Optional[str] = None
    executor: Literal["serial", "ray"] = "serial"
    threads: Optional[Int] = Field(None, ge=1, le=1024)  # torch crashes on absurd thread counts
    #: executor = "ray" (extra lowband[ray], docs/scale.md): the cluster to join ("auto" for
    #: the one `ray start` runs on this machine, "host:6379", "ray://host:10001"); unset: a
    #: local runtime of ray_num_cpus CPUs. ray_workers: shard actors, each owning a
    #: contiguous block of nodes (unset: one per CPU of the runtime, at most one per node).
    ray_address: Optional[str] = None
    ray_workers: Optional[Int] = Field(None, ge=1)
    ray_num_cpus: Optional[Int] = Field(None, ge=1)
    #: write checkpoint.pt every this many rounds (0: never) and after the last; "auto": after
    #: round 1, then once the rounds since the last checkpoint took CHECKPOINT_AUTO_FACTOR x
    #: its cost (lowband.engine.observers.checkpoint), for runs whose checkpoint is costly
    checkpoint_every: Union[Literal["auto"], Int] = 1
    #: where training and evaluation run: "cpu", "cuda", "cuda:N", "mps" or "auto" (cuda if
    #: available, else mps, else cpu); see lowband.device (wire bytes are the same on every device)
    device: str = "cpu"
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    comm: CommConfig = Field(default_factory=CommConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    #: link models (simulated time); None: not timed, and nothing about time is written
    links: Optional[LinksConfig] = None
    #: per-device compute and availability (docs/devices.md); None: every device equal, always on
    devices: Optional[DevicesConfig] = None
    aggregation: Optional[AggregationConfig] = None  # [aggregation]: a robust rule (lowband.aggregation); None: none
    log: LogConfig = Field(default_factory=LogConfig)
    #: "are you sure": a size beyond lowband.config.bounds' limits (rounds, epochs, batch sizes,
    #: model widths, a memory estimate above the free memory) is refused unless this is true
    allow_huge: Bool = False
    #: differential privacy (docs/privacy.md); None: none
    dp: Optional[DPConfig] = None
    #: secure aggregation (docs/privacy.md); None: none
    secagg: Optional[SecAggConfig] = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_run_name(v)

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _checkpoint_every(cls, v: Any) -> Any:
        if v != "auto" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"must be a round count >= 0 (0: never) or \"auto\" (a schedule that keeps "
                             f"checkpoints under 5% of the run's time), got {v!r}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str, info: ValidationInfo) -> str:
        check_spec = _fact(info, "device_spec")
        return check_spec(v) if check_spec is not None else v

    @field_validator("out_dir")
    @classmethod
    def _out_dir(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.strip():
            raise ValueError("empty; name the run folder (e.g. out_dir = \"runs/a\"), or leave it out for runs/<name>")
        if v is not None:
            _check_path_text(v, "out_dir")
        return v

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not (v in ("auto", "local") or v.startswith("ray://") or _is_host_port(v)):
            raise ValueError("must be 'auto', 'local', 'host:port' (the GCS, e.g. '10.0.0.1:6379') "
                             "or 'ray://host:port' (Ray Client)")
        return v

    @field_validator("ray_num_cpus")
    @classmethod
    def _ray_num_cpus(cls, v: Optional[int], info: Any) -> Optional[int]:
        if v is not None and info.data.get("ray_address") not in (None, "local"):
            raise ValueError("sizes a local Ray runtime only; a cluster at ray_address has the CPUs its "
                             "`ray start --num-cpus` gave it (drop one of the two keys)")
        return v

    def run_dir(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path("runs") / self.name

    def to_toml(self) -> str:
        """The resolved configuration as TOML (None values dropped), as written to run_dir:
        reading it back gives the same run. A ring's ``k`` left out is written as the 1 the
        run uses (the schema's default 5 is k-regular's), else a re-run or ``--resume`` of
        the written file would build a 5-ring. ``allow_huge`` is written only when set: a
        guard that changes no number, so a config written before it existed reads the same."""
        d = _drop_none(self.model_dump(mode="json"))
        if not d.get("allow_huge"):
            d.pop("allow_huge", None)
        if self.topology.kind == "ring" and "k" not in self.topology.model_fields_set:
            d["topology"]["k"] = RING_DEFAULT_K
        return tomli_w.dumps(d)


#: longest run name: a folder name under runs/ (most file systems allow 255 bytes a component)
MAX_NAME_CHARS = 128
#: longest path component of a run folder, in UTF-8 bytes (ext4, APFS, NTFS: 255)
MAX_COMPONENT_BYTES = 255


def _check_path_text(v: str, what: str) -> None:
    """A path the run will create: printable, each component short enough for a file system."""
    if any(ord(c) < 32 or c == "\x7f" for c in v):
        raise ValueError(f"holds a control character; {what} is a folder path of printable characters")
    long = next((part for part in v.replace("\\", "/").split("/") if len(part.encode()) > MAX_COMPONENT_BYTES), None)
    if long is not None:
        raise ValueError(f"a folder name of {len(long.encode())} bytes ({long[:20]}...); file systems allow "
                         f"{MAX_COMPONENT_BYTES} bytes a component, use a shorter name")


def check_run_name(v: str) -> str:
    """A run name is a relative folder under runs/ (``fol/cifar10_fedavg`` is runs/fol/cifar10_fedavg):
    at most :data:`MAX_NAME_CHARS` characters, no absolute path, no ``..`` or empty part, so the
    run folder stays inside runs/ (``out_dir`` places a run anywhere, on purpose)."""
    if not v.strip():
        raise ValueError("empty; name the experiment, e.g. name = \"fedavg-digits\"")
    if len(v) > MAX_NAME_CHARS:
        raise ValueError(f"{len(v)} characters, at most {MAX_NAME_CHARS}; use a shorter name")
    _check_path_text(v, "name")
    parts = v.replace("\\", "/").split("/")
    if v.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", v) or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{v!r} would put the run folder outside runs/; a name is a relative folder without "
                         f"'..', '.' or empty parts (e.g. name = \"fol/cifar10_fedavg\"); use out_dir to choose "
                         f"another folder")
    return v


def _is_host_port(v: str) -> bool:
    host, sep, port = v.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_drop_none(v) for v in d]
    return d


def _format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err.get("loc", ()))
    key = f"{prefix}{key}" if key else prefix.rstrip(".")
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        return f"{key}: unknown key"
    got = err.get("input")
    if err.get("type") in ("int_type", "float_type") and isinstance(got, bool):
        msg = "must be a number, not true/false"
    elif err.get("type") == "int_type" and isinstance(got, float):
        msg = whole_number_hint(got)
    elif err.get("type") == "bool_type":
        msg = f"must be true or false, got {got!r}"
        return f"{key}: {msg}"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        # a section's own check naming one of its keys ("alpha: ..."): say the full key
        sub = re.match(r"([a-z_]+): ", msg)
        if sub and key and isinstance(err.get("input"), dict):
            key, msg = f"{key}.{sub.group(1)}", msg[sub.end():]
    got_r = repr(got)
    got_r = got_r if len(got_r) <= 60 else got_r[:40] + "..." + got_r[-8:]
    got_s = "" if isinstance(got, (dict, list)) or got is None else f" (got {got_r})"
    return f"{key}: {msg}{got_s}"


def whole_number_hint(got: Any) -> str:
    """The message for a float or a boolean where a whole number belongs (the caller adds ``(got ...)``)."""
    if isinstance(got, bool):
        return "must be a whole number, not true/false"
    what = f"{got:.0f}" if isinstance(got, float) and got.is_integer() and abs(got) < 1e16 else "a whole number"
    return f"must be a whole number written without a point or exponent (e.g. {what})"


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    cls: Any = model
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part)) if hasattr(cls, "model_fields") else None
        if field is None:
            return []
        cls = field.annotation
    return list(getattr(cls, "model_fields", {}).keys())


def _non_finite(raw: Any, prefix: str = "") -> Optional[tuple[str, float]]:
    """(dotted key, value) of the first non-finite float (inf, nan) in a raw config, else None."""
    import math

    if isinstance(raw, float) and not math.isfinite(raw):
        return prefix or "(value)", raw
    if isinstance(raw, dict):
        items = raw.items()
    elif isinstance(raw, list):
        items = ((f"[{i}]", v) for i, v in enumerate(raw))
    else:
        return None
    for k, v in items:
        key = f"{prefix}{k}" if str(k).startswith("[") else (f"{prefix}.{k}" if prefix else str(k))
        hit = _non_finite(v, key)
        if hit:
            return hit
    return None


def parse_experiment(raw: dict[str, Any], facts: Optional[Facts] = None) -> Experiment:
    """A raw config dict as an :class:`Experiment`, or one-line :class:`ConfigError`: the
    schema's checks only, plus those whose ``facts`` the resolver supplies. The registry
    checks and the refusals come after, in :func:`lowband.config.resolve.validate`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"a config is a table of keys, got {type(raw).__name__}")
    bad = _non_finite(raw)
    if bad:
        raise ConfigError(f"{bad[0]}: {bad[1]!r} is not a finite number; use a finite value")
    try:
        return Experiment.model_validate(raw, context=dict(facts or {}))
    except ValidationError as exc:
        err = exc.errors()[0]
        line = _format_validation_error(exc)
        if err.get("type") == "extra_forbidden":
            allowed = _allowed_keys(Experiment, tuple(err.get("loc", ())))
            if allowed:
                line += f"; allowed: {', '.join(allowed)}"
        raise ConfigError(line) from None
