"""Experiment configuration: schema, TOML loading, ``key=value`` overrides, validation.

One experiment is one TOML file (plus optional ``section.key=value`` overrides on the
command line). Everything is validated before anything runs or is written: an unknown
key, a wrong type or a value out of range raises :class:`ConfigError` whose message is a
single line naming the key and what is allowed (the CLI prints it and exits with 2).

Algorithm hyperparameters and model options are validated by the algorithm's own
pydantic model and by the model registry, so ``lowband list`` and the validation never
disagree about names or defaults.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from lowband.metricdir import higher_is_better


class ConfigError(ValueError):
    """A configuration problem, described in one line (key, what is wrong, what is allowed)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


PROTOCOLS = ("global", "personal", "personal_joined", "node_global", "consensus")


class DataConfig(_Strict):
    """Where the data comes from and how it is split among nodes."""

    dataset: str = "digits"
    #: dataset = "npz": the user's .npz file (x, y; optional client, x_test, y_test), see lowband.data.userdata
    path: Optional[str] = None
    data_dir: Optional[str] = None
    download: bool = False
    options: dict[str, Any] = Field(default_factory=dict)
    num_clients: int = Field(10, ge=1, le=100_000)
    #: "given": the client ids of the user's data (dataset = "npz" with a client array);
    #: "index_map": the first num_clients clients of the file data.index_map (lowband.data.indexmap)
    partition: Literal["iid", "dirichlet", "shards", "ntk_fl", "natural", "given", "index_map"] = "iid"
    #: partition = "index_map": a JSON object client id -> indices into the training set (.json, .json.gz)
    index_map: Optional[str] = None
    #: the index map's sha256, resolved from the file when not given (a given one must match the file)
    index_map_sha256: Optional[str] = Field(None, pattern=r"^[0-9a-f]{64}$")
    alpha: Optional[float] = Field(None, gt=0)
    min_size: int = Field(10, ge=0)
    classes_per_client: int = Field(2, ge=1)
    samples_per_client: int = Field(200, ge=1)
    split: tuple[float, float, float] = (1.0, 0.0, 0.0)
    public_size: int = Field(0, ge=0)
    augment: Optional[Literal["fol"]] = None
    #: where the public reference set is drawn from (see lowband.data.federation)
    public_source: Literal["train", "holdout", "mismatched"] = "train"
    #: seed of the partition, splits, public set and augmentation (None: the experiment's seed): vary the
    #: experiment's seed (init, graphs, sampling) over one fixed partition
    seed: Optional[int] = Field(None, ge=0)

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
    sampling: Literal["all", "fraction", "count", "list"] = "fraction"
    fraction: float = Field(0.1, gt=0, le=1)
    count: Optional[int] = Field(None, ge=1)
    schedule: Optional[list[list[int]]] = None
    k: int = Field(5, ge=1)
    p: float = Field(0.1, gt=0, le=1)
    time_varying: bool = True
    per_round: Optional[list[int]] = None
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
                                                "list": "schedule"}


def topology_defaults(kind: str) -> dict[str, Any]:
    """The [topology] keys ``kind`` reads, with the value a run uses when the config leaves
    them out: the schema's default, else (a None default) the topology builder's
    (``lowband.topology.TOPOLOGIES``). A ring's ``k`` left out is the builder's 1, not the
    schema's 5 (which is k-regular's; see ``engine.simulator.make_topology``)."""
    from lowband.topology import TOPOLOGIES

    built = TOPOLOGIES[kind]["params"]
    out: dict[str, Any] = {}
    for key in TOPOLOGY_KEYS[kind]:
        v = TopologyConfig.model_fields[key].get_default(call_default_factory=True)
        b = built.get("path" if key == "plan_file" else key)
        out[key] = b if (v is None or (kind == "ring" and key == "k")) else v
    return out


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
    norm_factor: float = Field(100.0, allow_inf_nan=False)

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

    dropout: float = Field(0.0, ge=0, le=1, description="probability that a node is offline in a round")
    #: explicit [round, node] pairs (rounds 1-based) of nodes offline in that round
    dropout_schedule: list[tuple[int, int]] = Field(default_factory=list)
    straggler: float = Field(0.0, ge=0, le=1, description="probability that a node is slow in a round")
    slowdown: float = Field(3.0, gt=1, allow_inf_nan=False, description="a slow reply takes 1..slowdown time units")
    deadline: Optional[float] = Field(None, ge=1, allow_inf_nan=False, description="replies later than this are dropped")

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

    bps: Optional[float] = Field(None, gt=0, description="bit/s on the air")
    latency_s: Optional[float] = Field(None, ge=0)
    loss: Optional[float] = Field(None, ge=0, lt=1, description="frame loss probability (re-sent until it arrives)")
    frame_payload: Optional[int] = Field(None, ge=1)
    frame_overhead: Optional[int] = Field(None, ge=0)
    frame_time_s: Optional[float] = Field(None, ge=0)
    duty_cycle: Optional[float] = Field(None, gt=0, le=1)
    power_w: Optional[float] = Field(None, ge=0, description="the node's radio power (W) on this direction: "
                                     "transmit (up) or receive (down); adds energy/j")


class LinksConfig(_Strict):
    """Link models that turn the ledger's bytes into simulated time (lowband.comm.links); off when absent."""

    preset: str
    up: LinkDirectionConfig = Field(default_factory=LinkDirectionConfig)
    down: LinkDirectionConfig = Field(default_factory=LinkDirectionConfig)
    contact_period_s: Optional[float] = Field(None, gt=0)
    contact_duration_s: Optional[float] = Field(None, gt=0)
    contact_offset_s: Optional[float] = Field(None, ge=0)
    #: per-node presets: preset name -> node ids (the other nodes use ``preset`` with the overrides)
    nodes: dict[str, list[int]] = Field(default_factory=dict)
    #: local compute: compute_s + 3 x forward FLOPs x samples / device_flops per round (0: no FLOP term)
    device_flops: float = Field(1e9, ge=0)
    compute_s: float = Field(0.0, ge=0)
    #: a reply (up or peer) arriving later than this many seconds after the round start is dropped
    deadline_s: Optional[float] = Field(None, gt=0)
    #: transmissions per lost-prone frame: their expectation 1 / (1 - loss), or seeded geometric draws
    retransmissions: Literal["expected", "sampled"] = "expected"

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str) -> str:
        from lowband.comm.links import PRESETS

        if v not in PRESETS:
            raise ValueError(f"unknown link preset {v!r}; available: {', '.join(PRESETS)} (lowband list links)")
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        from lowband.comm.links import PRESETS

        seen: set[int] = set()
        for name, ids in v.items():
            if name not in PRESETS:
                raise ValueError(f"unknown link preset {name!r}; available: {', '.join(PRESETS)}")
            for i in ids:
                if i < 0:
                    raise ValueError(f"{name}: node ids start at 0, got {i}")
                if i in seen:
                    raise ValueError(f"node {i} is given two presets; list each node once")
                seen.add(i)
        return v

    @model_validator(mode="after")
    def _profiles(self) -> "LinksConfig":
        from lowband.comm.links import configured_profiles

        configured_profiles(self)  # raises ValueError naming what is inconsistent (e.g. the contact window)
        return self


class EvalConfig(_Strict):
    """Which evaluation protocols run, how often, and the target for rounds/bytes-to-target."""

    protocols: Optional[list[Literal["global", "personal", "personal_joined", "node_global", "consensus"]]] = None
    every: int = Field(1, ge=1)
    batch_size: int = Field(500, ge=1)
    #: score `personal` and `node_global` on a fixed sample of this many nodes, drawn once
    #: from the run's seed (None: every node); cuts their cost in proportion
    nodes: Optional[int] = Field(None, ge=1)
    #: rounds/bytes-to-target threshold on ``main``: an accuracy as a fraction (0.85, at
    #: most 1), a loss or spread as its value (reached when at or below it)
    target: Optional[float] = Field(None, gt=0)
    main: Optional[str] = None
    at_round0: bool = True

    @model_validator(mode="after")
    def _target_is_a_fraction(self) -> "EvalConfig":
        # every algorithm's default main metric is an accuracy; only a loss or spread named
        # in ``main`` may have a target above 1
        if self.target is not None and self.target > 1 and higher_is_better(self.main):
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
    workers: Union[Literal["auto"], int] = "auto"

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
    tensorboard: bool = False


class Experiment(_Strict):
    """A whole experiment: validated, then handed to :func:`lowband.engine.run`."""

    name: str = "experiment"
    seed: int = Field(0, ge=0)
    rounds: int = Field(10, ge=0, le=1_000_000)
    out_dir: Optional[str] = None
    executor: Literal["serial", "ray"] = "serial"
    threads: Optional[int] = Field(None, ge=1, le=1024)  # torch crashes on absurd thread counts
    #: executor = "ray" (extra lowband[ray], docs/scale.md): the cluster to join ("auto" for
    #: the one `ray start` runs on this machine, "host:6379", "ray://host:10001"); unset: a
    #: local runtime of ray_num_cpus CPUs. ray_workers: shard actors, each owning a
    #: contiguous block of nodes (unset: one per CPU of the runtime, at most one per node).
    ray_address: Optional[str] = None
    ray_workers: Optional[int] = Field(None, ge=1)
    ray_num_cpus: Optional[int] = Field(None, ge=1)
    checkpoint_every: int = Field(1, ge=0)
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
    log: LogConfig = Field(default_factory=LogConfig)

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        from lowband.device import check_spec

        return check_spec(v)

    @field_validator("out_dir")
    @classmethod
    def _out_dir(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.strip():
            raise ValueError("empty; name the run folder (e.g. out_dir = \"runs/a\"), or leave it out for runs/<name>")
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
        the written file would build a 5-ring."""
        d = _drop_none(self.model_dump(mode="json"))
        if self.topology.kind == "ring" and "k" not in self.topology.model_fields_set:
            d["topology"]["k"] = topology_defaults("ring")["k"]
        return tomli_w.dumps(d)


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
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        # a section's own check naming one of its keys ("alpha: ..."): say the full key
        sub = re.match(r"([a-z_]+): ", msg)
        if sub and key and isinstance(err.get("input"), dict):
            key, msg = f"{key}.{sub.group(1)}", msg[sub.end():]
    got = err.get("input")
    got_s = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    return f"{key}: {msg}{got_s}"


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    cls: Any = model
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part)) if hasattr(cls, "model_fields") else None
        if field is None:
            return []
        cls = field.annotation
    return list(getattr(cls, "model_fields", {}).keys())


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value``; the value is read as a TOML value, else as a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. algorithm.lr=0.05")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key; expected e.g. data.alpha=0.3")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides to a raw config dict (copy)."""
    import copy

    out = copy.deepcopy(raw)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for p in path[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {p!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return out


#: a config is a small text file; anything larger is not one (and is not read whole)
MAX_CONFIG_BYTES = 1 << 20


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file into a dict; a missing, unreadable, binary or malformed file is a
    one-line :class:`ConfigError` naming the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config {p} is a folder; pass the path of a .toml file (see experiments/)")
    if not p.is_file():
        what = "not found" if not p.exists() else "not a regular file"
        raise ConfigError(f"config file {p} {what}; pass the path of a .toml file (see experiments/)")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"config file {p}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {p} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a "
                          f"short TOML text (see experiments/)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); a config is a TOML text file (see experiments/)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: nested too deeply") from None


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


def validate(raw: dict[str, Any]) -> Experiment:
    """Validate a raw dict into an :class:`Experiment`, including algorithm and model options,
    and refuse a combination that cannot measure what it asks (lowband.engine.checks)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"a config is a table of keys, got {type(raw).__name__}")
    bad = _non_finite(raw)
    if bad:
        raise ConfigError(f"{bad[0]}: {bad[1]!r} is not a finite number; use a finite value")
    try:
        exp = Experiment.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        line = _format_validation_error(exc)
        if err.get("type") == "extra_forbidden":
            allowed = _allowed_keys(Experiment, tuple(err.get("loc", ())))
            if allowed:
                line += f"; allowed: {', '.join(allowed)}"
        raise ConfigError(line) from None
    _validate_plugins(exp)
    _validate_links(exp)
    from lowband.engine.checks import check_experiment

    check_experiment(exp)
    return exp


def _validate_links(exp: Experiment) -> None:
    """What ``[links]`` cannot check alone: node ids exist, the deadline's executor."""
    if exp.links is None:
        return
    n = exp.data.num_clients
    for name, ids in exp.links.nodes.items():
        bad = [i for i in ids if i >= n]
        if bad:
            raise ConfigError(f"links.nodes.{name}: node {bad[0]} does not exist (nodes are 0..{n - 1})")
    if exp.links.deadline_s is not None and exp.executor == "ray":
        raise ConfigError("links.deadline_s: drops late replies in the serial round loop only; use executor = "
                          "\"serial\" or leave links.deadline_s out (times are still written under ray)")


def _validate_plugins(exp: Experiment) -> None:
    from lowband.algorithms import ALGORITHMS
    from lowband.models import MODELS

    if exp.algorithm.name not in ALGORITHMS:
        raise ConfigError(
            f"algorithm.name: unknown algorithm {exp.algorithm.name!r}; available: {', '.join(sorted(ALGORITHMS))}"
        )
    hp_cls = ALGORITHMS[exp.algorithm.name].Hyperparams
    try:
        hp_cls.model_validate(exp.algorithm.options())
    except ValidationError as exc:
        err = exc.errors()[0]
        line = _format_validation_error(exc, "algorithm.")
        if err.get("type") == "extra_forbidden":
            line += f" for {exp.algorithm.name}; allowed: {', '.join(hp_cls.model_fields)}"
        raise ConfigError(line) from None
    if exp.model.name not in MODELS:
        raise ConfigError(f"model.name: unknown model {exp.model.name!r}; available: {', '.join(sorted(MODELS))}")
    accepted = MODELS[exp.model.name].kwargs
    for key in exp.model.options():
        if key not in accepted:
            raise ConfigError(f"model.{key}: unknown key for {exp.model.name}; allowed: "
                              + ", ".join(["name", "mix", *accepted]))
    if exp.model.mix:
        alg = ALGORITHMS[exp.algorithm.name]
        if not (alg.supports_mixed_models or alg.family == "local"):
            ok = sorted(n for n, a in ALGORITHMS.items() if a.supports_mixed_models or a.family == "local")
            raise ConfigError(f"model.mix: {exp.algorithm.name} needs one architecture for every client "
                              f"(it exchanges weights); mixed federations work with {', '.join(ok)}")
        for m in exp.model.mix:
            if m not in MODELS:
                raise ConfigError(f"model.mix: unknown model {m!r}; available: {', '.join(sorted(MODELS))}")
            bad = [k for k in exp.model.options() if k not in MODELS[m].kwargs]
            if bad:
                raise ConfigError(f"model.{bad[0]}: not an option of {m} (in model.mix); the options under "
                                  f"[model] go to every model of the mix")
        if exp.eval.protocols and "consensus" in exp.eval.protocols:
            raise ConfigError("eval.protocols: 'consensus' averages weights and needs one architecture; "
                              "not with model.mix")
    from lowband.data.sources import DATASETS, _check_options

    if exp.data.dataset not in DATASETS:
        raise ConfigError(f"data.dataset: unknown dataset {exp.data.dataset!r}; available: {', '.join(DATASETS)}")
    try:
        _check_options(exp.data.dataset, exp.data.options)
    except ValueError as exc:
        raise ConfigError(f"data.options: {exc}") from None
    _validate_user_data(exp)
    _validate_index_map(exp)
    from lowband.comm.codecs import parse_codec

    for key, spec in [("comm.codec", exp.comm.codec)] + [
        (f"comm.by_kind.{k}", v) for k, v in exp.comm.by_kind.items()
    ] + [(f"comm.by_direction.{k}", v) for k, v in exp.comm.by_direction.items()]:
        try:
            parse_codec(spec)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None


def _validate_user_data(exp: Experiment) -> None:
    """``dataset = "npz"``: check the file's headers (cheap, nothing loaded but the client
    ids) and resolve the partition: a file with client ids and no ``data.partition`` in the
    config takes ``partition = "given"`` and ``num_clients`` = its number of clients (written
    into the resolved config, so a resumed run reads the same)."""
    d = exp.data
    if d.dataset not in ("npz", "csv"):
        if d.path is not None:
            raise ConfigError(f"data.path: read only with data.dataset = 'npz' or 'csv' (the user's file); dataset "
                              f"{d.dataset!r} is found under data.data_dir: drop data.path or set dataset = 'npz'")
        if d.partition == "given":
            raise ConfigError("data.partition: 'given' takes the client ids of the user's data (dataset = 'npz' "
                              "with a client array); use 'natural' for a dataset's own clients")
        return
    from lowband.data.userdata import NPZ_OPTIONS, client_count, load_arrays

    if not d.path:
        raise ConfigError(f"data.path: dataset {d.dataset!r} needs data.path, the file holding your data (an .npz "
                          f"with arrays x and y: numpy.savez('my.npz', x=x, y=y); or a CSV with a y column)")
    o = {**NPZ_OPTIONS, **d.options}
    if o["num_classes"] != 0 and o["num_classes"] < 2:
        raise ConfigError(f"data.options.num_classes: 0 (max(y) + 1) or a count >= 2, got {o['num_classes']}")
    if not o["max_gb"] > 0:
        raise ConfigError(f"data.options.max_gb: the most memory (GB) the arrays may need, > 0; got {o['max_gb']}")
    if not 0 < o["test_fraction"] < 1:
        raise ConfigError(f"data.options.test_fraction: the share of the rows held out as the global test set when "
                          f"the data has no x_test/y_test, in (0, 1); got {o['test_fraction']}")
    max_gb = float(o["max_gb"])
    clients = client_count(d.path, max_gb, d.dataset)
    if "test_fraction" in d.options and d.dataset == "npz":
        from lowband.data.userdata import MEMORY_PREFIX, inspect_npz

        has_test = (load_arrays(d.path).x_test is not None if d.path.startswith(MEMORY_PREFIX)
                    else "x_test" in inspect_npz(Path(d.path).expanduser(), max_gb))
        if has_test:
            raise ConfigError(f"data.options.test_fraction: {d.path} has x_test/y_test, the global test set, so "
                              f"nothing is carved out of x; drop test_fraction")
    if clients is None:
        if d.partition == "given":
            raise ConfigError(f"data.partition: 'given' needs client ids in {d.path} (an array named client, one "
                              f"int per row of x); or choose iid, dirichlet, shards or ntk_fl")
        return
    if "partition" not in d.model_fields_set:
        d.partition = "given"
    if d.partition == "given":
        if "num_clients" not in d.model_fields_set:
            d.num_clients = clients
        elif d.num_clients != clients:
            raise ConfigError(f"data.num_clients: {d.path} gives {clients} distinct client ids and num_clients is "
                              f"{d.num_clients}; drop num_clients (it follows the file) or set it to {clients}")


def _validate_index_map(exp: Experiment) -> None:
    """``partition = "index_map"``: read and check the map (cached), refuse more nodes than
    it has clients, and resolve ``data.index_map_sha256`` (a given one must match the file)."""
    d = exp.data
    if d.partition != "index_map":
        return
    from lowband.data.indexmap import IndexMapError, read_index_map

    imap = read_index_map(d.index_map, d.data_dir)  # type: ignore[arg-type]
    if d.num_clients > imap.num_clients:
        raise IndexMapError(f"data.num_clients: {d.num_clients} nodes, and {d.index_map} holds {imap.num_clients} "
                            f"clients; use at most {imap.num_clients} (a run takes the map's first num_clients)")
    if d.index_map_sha256 is None:
        d.index_map_sha256 = imap.sha256
    elif d.index_map_sha256 != imap.sha256:
        raise IndexMapError(f"data.index_map_sha256: {d.index_map} has sha256 {imap.sha256[:12]}..., the config "
                            f"names {d.index_map_sha256[:12]}...; the file changed since: restore it, or drop "
                            f"index_map_sha256 to take the file as it is now (a new run)")


def load_experiment(path: str | Path | None, overrides: list[str] | None = None) -> Experiment:
    """Load a TOML file (or the defaults when ``path`` is None), apply overrides, validate.

    A file must say which algorithm to run (``[algorithm] name``, in the file or an
    override): an empty or partial file would otherwise run the default experiment
    without a word."""
    raw = load_toml(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    if path is not None:
        alg = raw.get("algorithm")
        if alg is None or (isinstance(alg, dict) and "name" not in alg):
            what = "is empty" if not raw else "sets no algorithm.name"
            raise ConfigError(f"config {path} {what}: say which algorithm to run, e.g. [algorithm] name = "
                              f"\"fedavg\" or the override algorithm.name=fedavg (lowband list algorithms); "
                              f"`lowband demo` runs a ready-made comparison")
    return validate(raw)


def hyperparams(exp: Experiment) -> BaseModel:
    """The validated hyperparameter object of the experiment's algorithm."""
    from lowband.algorithms import ALGORITHMS

    return ALGORITHMS[exp.algorithm.name].Hyperparams.model_validate(exp.algorithm.options())
