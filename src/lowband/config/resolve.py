"""The resolver: a raw config checked against the rest of lowband, as every front door
(CLI, Python API, Simulation, batch, Flower) validates it.

:mod:`lowband.config.schema` checks what a config says on its own; this module adds what
needs the registries and the engine: the algorithm's hyperparameters (its own pydantic
model), model, dataset and codec names, link presets, the user's data file, and the
refusals of :mod:`lowband.engine.checks`. The registries are imported where used, so
importing this module stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from lowband.config.loading import apply_overrides, load_toml
from lowband.config.schema import (TOPOLOGY_KEYS, ConfigError, Experiment, Facts, TopologyConfig,
                                   _format_validation_error, parse_experiment)


def facts() -> Facts:
    """What the schema's validators need from the rest of lowband (see :class:`~lowband.config.schema.Facts`)."""
    from lowband.comm.links import PRESETS, configured_profiles
    from lowband.device import check_spec
    from lowband.aggregation.rules import RULES
    from lowband.metricdir import higher_is_better
    from lowband.devices.compute import CLASSES

    return Facts(link_presets=PRESETS, link_profiles=configured_profiles, device_spec=check_spec,
                 higher_is_better=higher_is_better, aggregation_rules=RULES, device_classes=CLASSES)


def validate(raw: dict[str, Any]) -> Experiment:
    """Validate a raw dict into an :class:`Experiment`, including algorithm and model options,
    and refuse a combination that cannot measure what it asks (lowband.engine.checks)."""
    exp = parse_experiment(raw, facts())
    _validate_plugins(exp)
    from lowband.config.bounds import check_bounds

    check_bounds(exp)  # sizes before anything is built or allocated
    _validate_links(exp)
    _validate_devices(exp)
    from lowband.engine.checks import check_experiment

    check_experiment(exp)
    _validate_privacy(exp)
    return exp


def _validate_privacy(exp: Experiment) -> None:
    """``[dp]`` / ``[secagg]`` against the algorithm, codecs and sampling (lowband.privacy.config)."""
    if exp.dp is None and exp.secagg is None:
        return
    from lowband.algorithms import ALGORITHMS
    from lowband.privacy.config import check_experiment_privacy

    check_experiment_privacy(exp, ALGORITHMS[exp.algorithm.name].family)


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


def _validate_devices(exp: Experiment) -> None:
    """What ``[devices]`` cannot check alone: it needs the ``[links]`` clock, and its files exist."""
    d = exp.devices
    if d is None:
        return
    if exp.links is None:
        raise ConfigError("devices: device compute and availability live on the simulated clock of [links]; add a "
                          "[links] section (e.g. preset = \"nbiot\") or drop [devices]")
    for key, path in (("devices.trace", d.trace), ("devices.availability.path", d.availability.path)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{key}: no such file {path!r}")
    if d.availability.kind != "always" and exp.executor == "ray":
        raise ConfigError("devices.availability: honoured in the serial round loop only; use executor = \"serial\" "
                          "or kind = \"always\"")


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
    from lowband.data.userdata import resolve_user_data

    resolve_user_data(exp.data)
    _validate_index_map(exp)
    from lowband.comm.codecs import parse_codec

    for key, spec in [("comm.codec", exp.comm.codec)] + [
        (f"comm.by_kind.{k}", v) for k, v in exp.comm.by_kind.items()
    ] + [(f"comm.by_direction.{k}", v) for k, v in exp.comm.by_direction.items()]:
        try:
            parse_codec(spec)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None


def load_experiment(path: str | Path | None, overrides: list[str] | None = None, *,
                    needs_algorithm: bool = True) -> Experiment:
    """Load a TOML file (or the defaults when ``path`` is None), apply overrides, validate.

    A file must say which algorithm to run (``[algorithm] name``, in the file or an
    override): an empty or partial file would otherwise run the default experiment
    without a word. ``needs_algorithm=False`` for a command that runs no algorithm of the
    file's (``lowband partition`` reads the data keys, ``lowband frontier`` sets the
    algorithm of each cell itself)."""
    raw = load_toml(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    if path is not None and needs_algorithm:
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
