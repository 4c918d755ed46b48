"""Experiment configuration: schema, TOML loading, ``key=value`` overrides, validation.

One experiment is one TOML file (plus optional ``section.key=value`` overrides on the
command line). Everything is validated before anything runs or is written: an unknown
key, a wrong type or a value out of range raises :class:`ConfigError` whose message is a
single line naming the key and what is allowed (the CLI prints it and exits with 2).

Three layers, each importing only those before it:

- :mod:`lowband.config.schema`: the pydantic models and :class:`ConfigError`; imports
  nothing else from lowband, so any module may use them;
- :mod:`lowband.config.loading`: a TOML file and overrides into a raw dict;
- :mod:`lowband.config.resolve`: :func:`validate` and :func:`load_experiment`, the
  front doors' entry: the schema plus the registry cross-checks (algorithm
  hyperparameters by the algorithm's own pydantic model, model, dataset and codec names),
  so ``lowband list`` and the validation never disagree about names or defaults.

The names below load their module on first use: ``from lowband.config import ConfigError``
runs the schema only, never the registries.
"""

from __future__ import annotations

from typing import Any

_SCHEMA = ("ConfigError", "Facts", "PROTOCOLS", "TOPOLOGY_KEYS", "STAR_SAMPLING_KEYS", "RING_DEFAULT_K", "DataConfig",
           "ModelConfig", "AlgorithmConfig", "TopologyConfig", "CommConfig", "FaultsConfig", "LinkDirectionConfig",
           "LinksConfig", "EvalConfig", "EngineConfig", "LogConfig", "DPConfig", "SecAggConfig",
           "Experiment", "parse_experiment")
_LOADING = ("parse_override", "apply_overrides", "load_toml", "MAX_CONFIG_BYTES")
_RESOLVE = ("validate", "load_experiment", "hyperparams", "topology_defaults", "facts")

#: public name -> the submodule that defines it
_WHERE = {**{n: "schema" for n in _SCHEMA}, **{n: "loading" for n in _LOADING}, **{n: "resolve" for n in _RESOLVE}}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where == "schema":
        from lowband.config import schema as module
    elif where == "loading":
        from lowband.config import loading as module
    elif where == "resolve":
        from lowband.config import resolve as module
    else:
        raise AttributeError(f"module 'lowband.config' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = sorted(_WHERE)
